"""Memory per region across ranks: peak and net growth, the allocating ops, and imbalance.

Pure functions over :func:`~torchstep_prof.traces.analysis.summarize.summarize`'s groups, whose ranks
carry each trace's ``[memory]`` reading (:mod:`~torchstep_prof.traces.reading.memory_events`). A group
(region, step, occurrence; a fused step) has one :class:`RegionMemory` per device: each rank's
peak and net growth, the operators that allocated most (summed over ranks), and the imbalance,
the largest peak over the median peak.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional, Tuple

import attrs

from ..reading.memory_events import OpBytes, top_allocators
from .summarize import Summary, group_fields

__all__ = ["MIB", "RankMemory", "RegionMemory", "describe_memory", "find_memory", "memory_to_dicts"]

MIB = 1024 * 1024


@attrs.frozen(kw_only=True)
class RankMemory:
    """One rank's memory in a region: the peak above the region's start and the net growth."""

    rank: int
    peak_bytes: int
    net_bytes: int


@attrs.frozen(kw_only=True)
class RegionMemory:
    """One group's memory on one device, across its ranks."""

    role: str
    stage: str
    step: int
    occurrence: int
    fused: bool
    device: str
    ranks: Tuple[RankMemory, ...]
    top_ops: Tuple[OpBytes, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return max(r.peak_bytes for r in self.ranks)

    @property
    def net_bytes(self) -> int:
        """The median rank's net growth (a rank that grows alone shows in ``ranks``)."""
        return int(statistics.median(r.net_bytes for r in self.ranks))

    @property
    def imbalance(self) -> Optional[float]:
        """The largest peak over the median peak (None when the median peak is 0)."""
        median = statistics.median(r.peak_bytes for r in self.ranks)
        return self.peak_bytes / median if median > 0 else None

    @property
    def top_rank(self) -> int:
        return max(self.ranks, key=lambda r: (r.peak_bytes, -r.rank)).rank


def find_memory(summary: Summary) -> Tuple[RegionMemory, ...]:
    """Every group's memory per device, for the groups whose traces hold ``[memory]`` events.

    >>> from torchstep_prof.traces.reading.files import scan_traces
    >>> from torchstep_prof.traces.analysis.summarize import summarize
    >>> memory = find_memory(summarize(*scan_traces("outputs/profile")))  # doctest: +SKIP
    """
    found = []
    for group in summary.groups:
        by_device: dict[str, list[Any]] = {}
        for row in group.ranks:
            for use in row.memory:
                by_device.setdefault(use.device, []).append((row.rank, use))
        for device, uses in sorted(by_device.items()):
            ops: dict[str, list[int]] = {}
            for _, use in uses:
                for op in use.top_ops:
                    totals = ops.setdefault(op.name, [0, 0])
                    totals[0] += op.bytes
                    totals[1] += op.count
            found.append(
                RegionMemory(
                    **group_fields(group),
                    device=device,
                    ranks=tuple(
                        RankMemory(rank=rank, peak_bytes=u.peak_bytes, net_bytes=u.net_bytes) for rank, u in uses
                    ),
                    top_ops=top_allocators(ops, per=len(uses)),  # per rank on average, as summarize's operators
                )
            )
    return tuple(found)


def memory_to_dicts(memory: Iterable[RegionMemory]) -> list[dict[str, Any]]:
    """The ``memory`` list of ``summarize --json``::

    [{"role", "stage", "step", "occurrence", "fused", "device", "peak_bytes", "net_bytes",
      "imbalance", "top_rank", "ranks": [{"rank", "peak_bytes", "net_bytes"}],
      "top_ops": [{"name", "bytes", "count"}]}]

    ``peak_bytes`` is the largest rank's, ``net_bytes`` the median rank's, ``imbalance`` the
    largest peak over the median one; ``top_ops`` bytes allocated per rank, on average.
    """
    return [
        {
            **group_fields(m),
            "device": m.device,
            "peak_bytes": m.peak_bytes,
            "net_bytes": m.net_bytes,
            "imbalance": None if m.imbalance is None else round(m.imbalance, 3),
            "top_rank": m.top_rank,
            "ranks": [{"rank": r.rank, "peak_bytes": r.peak_bytes, "net_bytes": r.net_bytes} for r in m.ranks],
            "top_ops": [{"name": o.name, "bytes": o.bytes, "count": o.count} for o in m.top_ops],
        }
        for m in memory
    ]


def mib(value: int) -> str:
    """Bytes as MiB with a sign for growth: ``+64.0 MiB``."""
    return f"{value / MIB:+.1f} MiB"


def describe_memory(m: RegionMemory) -> str:
    """A group's memory in words.

    >>> print(describe_memory(RegionMemory(role="trainer", stage="keep", step=1, occurrence=1,
    ...     fused=False, device="cpu", ranks=(RankMemory(rank=0, peak_bytes=MIB, net_bytes=MIB),),
    ...     top_ops=(OpBytes(name="aten::ones", bytes=MIB, count=1),))))
    trainer/keep step 1 (cpu): peak 1.0 MiB, net +1.0 MiB; most allocated by aten::ones (1.0 MiB)
    """
    where = f"{m.role}/{m.stage} step {m.step}" + (f" #{m.occurrence}" if m.occurrence > 1 else "")
    text = f"{where} ({m.device}): peak {m.peak_bytes / MIB:.1f} MiB, net {mib(m.net_bytes)}"
    if m.imbalance is not None and m.imbalance >= 1.25 and len(m.ranks) > 1:
        text += f", rank {m.top_rank} peaks {m.imbalance:.2f}x the median"
    # Operators under 1% of the largest allocator's bytes are noise next to it.
    ops = [o for o in m.top_ops[:3] if o.bytes >= m.top_ops[0].bytes / 100]
    if ops:
        text += "; most allocated by " + ", ".join(f"{o.name} ({o.bytes / MIB:.1f} MiB)" for o in ops)
    return text
