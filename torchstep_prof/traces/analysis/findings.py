"""What stands out in a folder of traces: each straggler, and the operators that make it slower.

Pure functions over :func:`torchstep_prof.traces.analysis.summarize.summarize`'s groups. A group's straggler is
the one :func:`~torchstep_prof.traces.analysis.summarize.find_straggler` flags; it is compared with the group's
median rank (the rank whose wall time is nearest the group's median), operator by operator, by
self time. :func:`findings_to_dicts` gives the ``findings`` list of ``summarize --json``;
:func:`describe_finding` says one in words.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Tuple

import attrs

from .summarize import GroupSummary, Summary
from ..reading.files import TraceInfo

__all__ = [
    "FINDINGS_DEPTH",
    "FINDING_OPS",
    "Finding",
    "OpDelta",
    "describe_finding",
    "find_findings",
    "findings_to_dicts",
]

FINDING_OPS = 5
"""Operators listed per finding, largest difference first."""

FINDINGS_DEPTH = 50
"""How many operators per trace to read for findings: an operator below this many in a rank's
list is taken as 0 there, so the list must reach well past the few that are shown."""

EXPLAINS_SHARE = 0.1
"""An operator "explains" a straggler in words when its extra self time is at least this share of
the gap between the straggler and the median (smaller differences are noise between ranks)."""


@attrs.frozen(kw_only=True)
class OpDelta:
    """One operator's self time on the straggler and on the group's median rank, in ms."""

    name: str
    self_ms: float
    median_self_ms: float

    @property
    def delta_ms(self) -> float:
        return self.self_ms - self.median_self_ms


@attrs.frozen(kw_only=True)
class Finding:
    """A straggler: ``rank`` took ``wall_ms`` where its group's median is ``median_ms``."""

    role: str
    stage: str
    step: int
    occurrence: int
    rank: int
    median_rank: int
    wall_ms: float
    median_ms: float
    ops: Tuple[OpDelta, ...] = ()

    @property
    def ratio(self) -> float:
        return self.wall_ms / self.median_ms if self.median_ms > 0 else float("inf")


def find_findings(summary: Summary) -> Tuple[Finding, ...]:
    """One :class:`Finding` per group of ``summary`` that has a straggler, most slowed first.

    The operator comparison is as deep as the ranks' ``top_ops``: summarize with a generous
    ``top`` (:data:`FINDINGS_DEPTH`) so an operator missing from a list really is small there.

    >>> from torchstep_prof.traces.reading.files import scan_traces
    >>> from torchstep_prof.traces.analysis.summarize import summarize
    >>> scanned = scan_traces("outputs/profile", top=FINDINGS_DEPTH)  # doctest: +SKIP
    >>> for finding in find_findings(summarize(*scanned)):  # doctest: +SKIP
    ...     print(describe_finding(finding))
    """
    found = [_finding(group) for group in summary.groups]
    return tuple(
        sorted(
            (f for f in found if f is not None),
            key=lambda f: (-f.ratio, f.role, f.stage, f.step, f.occurrence, f.rank),
        )
    )


def _finding(group: GroupSummary) -> Optional[Finding]:
    # A rank with several rows (several runs in one folder) is represented by its slowest row, as
    # the straggler test does.
    rows: dict[int, TraceInfo] = {}
    for row in group.ranks:
        if row.rank not in rows or row.wall_ms > rows[row.rank].wall_ms:
            rows[row.rank] = row
    if group.straggler is None or group.straggler not in rows:
        return None
    straggler = rows[group.straggler]
    # The median rank: the one whose wall time is nearest the median (ties to the lower rank).
    others = [r for r in rows.values() if r.rank != straggler.rank] or [straggler]
    median = min(others, key=lambda r: (abs(r.wall_ms - group.median_ms), r.rank))
    return Finding(
        role=group.role,
        stage=group.stage,
        step=group.step,
        occurrence=group.occurrence,
        rank=straggler.rank,
        median_rank=median.rank,
        wall_ms=straggler.wall_ms,
        median_ms=group.median_ms,
        ops=op_deltas(op_self_ms(straggler), op_self_ms(median))[:FINDING_OPS],
    )


def op_self_ms(row: TraceInfo) -> dict[str, float]:
    """Each operator of ``row``'s ``top_ops``: its self time in ms."""
    return {op.name: op.self_ms for op in row.top_ops}


def op_deltas(ops: Mapping[str, float], median_ops: Mapping[str, float]) -> Tuple[OpDelta, ...]:
    """Every operator of either rank, largest difference in self time first (an operator missing
    from one rank's list counts 0 there); equal differences by name.

    >>> [d.name for d in op_deltas({"aten::mm": 20.0, "aten::add": 1.0}, {"aten::mm": 8.0})]
    ['aten::mm', 'aten::add']
    """
    deltas = [
        OpDelta(name=name, self_ms=ops.get(name, 0.0), median_self_ms=median_ops.get(name, 0.0))
        for name in set(ops) | set(median_ops)
    ]
    deltas.sort(key=lambda d: (-abs(d.delta_ms), d.name))
    return tuple(deltas)


def findings_to_dicts(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """The ``findings`` list of ``summarize --json``::

    [{"role", "stage", "step", "occurrence", "rank", "wall_ms", "median_ms", "ratio",
      "ops": [{"name", "self_ms", "median_self_ms", "delta_ms"}]}]
    """
    return [
        {
            "role": f.role,
            "stage": f.stage,
            "step": f.step,
            "occurrence": f.occurrence,
            "rank": f.rank,
            "wall_ms": round(f.wall_ms, 3),
            "median_ms": round(f.median_ms, 3),
            "ratio": round(f.ratio, 3) if f.median_ms > 0 else None,
            "ops": [
                {
                    "name": op.name,
                    "self_ms": round(op.self_ms, 3),
                    "median_self_ms": round(op.median_self_ms, 3),
                    "delta_ms": round(op.delta_ms, 3),
                }
                for op in f.ops
            ],
        }
        for f in findings
    ]


def describe_finding(finding: Finding) -> str:
    """The finding in words.

    >>> print(describe_finding(Finding(role="actor", stage="update", step=3, occurrence=1,
    ...     rank=2, median_rank=0, wall_ms=52.0, median_ms=37.0,
    ...     ops=(OpDelta(name="aten::mm", self_ms=20.0, median_self_ms=8.0),))))
    rank 2's actor/update step 3 is 1.4x slower than the median (52 ms vs 37 ms),
    mostly in aten::mm (+12 ms)
    """
    step = f"step {finding.step}"
    if finding.occurrence != 1:
        step += f" (occurrence {finding.occurrence})"
    who = f"rank {finding.rank}'s {finding.role}/{finding.stage} {step}"
    if finding.median_ms > 0:
        text = f"{who} is {finding.ratio:.1f}x slower than the median ({ms_text(finding.wall_ms)} vs {ms_text(finding.median_ms)})"
    else:
        text = f"{who} takes {ms_text(finding.wall_ms)} where the median is 0 ms"
    # The operators whose extra self time accounts for a real share of the straggler's gap.
    gap = finding.wall_ms - finding.median_ms
    explaining = [op for op in finding.ops if op.delta_ms > 0 and op.delta_ms >= EXPLAINS_SHARE * gap][:3]
    if explaining:
        parts = [f"{op.name} (+{ms_text(op.delta_ms)})" for op in explaining]
        return f"{text}, mostly in {', '.join(parts)}"
    return f"{text}; no operator accounts for it: the extra time is outside operators (Python, waiting, I/O)"


def ms_text(value: float) -> str:
    """A duration in words: ``52 ms``, ``1.5 ms``."""
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"
