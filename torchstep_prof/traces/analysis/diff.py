"""What changed between two sets of traces: per region and per operator, time and call counts.

:func:`diff_traces` reads each trace once (one file in memory at a time) and averages per trace:
a region's wall time, and each operator's self time and calls within it (a discrete trace's
operators belong to its region; a fused trace's to the innermost region range around them).
Averages make two runs of different step or rank counts comparable. Rows are sorted by the
absolute time difference, largest first; an operator only in the test is ``added``, only in the
base ``missing``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple

import attrs

from ..reading.events import op_stats_by_region
from ..reading.fused import region_labels
from ..reading.files import TraceInfo, TraceReadError, Unreadable, load_trace

__all__ = ["DiffResult", "OpChange", "RegionChange", "diff_to_dict", "diff_traces", "side_stats"]

OUTSIDE_REGIONS = "(outside regions)"
"""The stage of a fused trace's operators that ran in no region range."""


@attrs.frozen(kw_only=True)
class RegionChange:
    """A region's mean wall time per trace in the base and the test (None: not there)."""

    region: str
    base_ms: Optional[float]
    test_ms: Optional[float]
    base_traces: int
    test_traces: int

    @property
    def delta_ms(self) -> float:
        return (self.test_ms or 0.0) - (self.base_ms or 0.0)


@attrs.frozen(kw_only=True)
class OpChange:
    """An operator of a region: mean self time and calls per trace in the base and the test."""

    region: str
    name: str
    base_ms: float
    test_ms: float
    base_count: float
    test_count: float
    status: str  # "changed", "added" (test only) or "missing" (base only)

    @property
    def delta_ms(self) -> float:
        return self.test_ms - self.base_ms

    @property
    def count_ratio(self) -> Optional[float]:
        return self.test_count / self.base_count if self.base_count else None


@attrs.frozen(kw_only=True)
class DiffResult:
    """The comparison of ``base`` with ``test`` (each a few words saying what it is)."""

    base: str
    test: str
    regions: Tuple[RegionChange, ...]
    ops: Tuple[OpChange, ...]
    skipped: Tuple[Unreadable, ...] = ()


@attrs.frozen(kw_only=True)
class _Side:
    """One side's sums: per region its traces and wall ms, per (region, op) self µs and calls."""

    traces: dict[str, int]
    wall_ms: dict[str, float]
    ops: dict[tuple[str, str], list[float]]
    skipped: list[Unreadable]


def side_stats(infos: Iterable[TraceInfo]) -> _Side:
    """Read every trace of one side (one at a time); a file that fails now is skipped, named."""
    side = _Side(traces={}, wall_ms={}, ops={}, skipped=[])
    for info in infos:
        try:
            stats = op_stats_by_region(load_trace(info.path))
        except TraceReadError as exc:
            side.skipped.append(Unreadable(path=info.path, reason=str(exc)))
            continue
        if info.fused:
            seen: dict[str, float] = {}
            for span in info.regions:
                label = f"{span.role}/{span.stage}"
                seen[label] = seen.get(label, 0.0) + span.wall_ms
            for label, ms in seen.items():
                _add_region(side, label, ms)
            for raw, ops in stats.items():
                _add_ops(side, _fused_label(raw, info), ops)
        else:
            label = f"{info.role}/{info.stage}"
            _add_region(side, label, info.wall_ms)
            for ops in stats.values():
                _add_ops(side, label, ops)
    return side


def _fused_label(raw: Optional[str], info: TraceInfo) -> str:
    if raw is None:
        return f"{info.role}/{OUTSIDE_REGIONS}"
    return "/".join(region_labels(raw))


def _add_region(side: _Side, label: str, wall_ms: float) -> None:
    side.traces[label] = side.traces.get(label, 0) + 1
    side.wall_ms[label] = side.wall_ms.get(label, 0.0) + wall_ms


def _add_ops(side: _Side, label: str, ops: dict[str, list[float]]) -> None:
    for name, (us, count) in ops.items():
        entry = side.ops.setdefault((label, name), [0.0, 0.0])
        entry[0] += us
        entry[1] += count


def diff_traces(
    base: Sequence[TraceInfo],
    test: Sequence[TraceInfo],
    *,
    base_label: str = "base",
    test_label: str = "test",
) -> DiffResult:
    """Compare the traces of ``base`` with those of ``test`` (scanned, the newest run each).

    >>> base = scan_traces("runs/before")[0]; test = scan_traces("runs/after")[0]  # doctest: +SKIP
    >>> diff_traces(base, test).ops[0].name                                        # doctest: +SKIP
    'aten::mm'
    """
    a, b = side_stats(base), side_stats(test)
    regions = [
        RegionChange(
            region=label,
            base_ms=a.wall_ms[label] / a.traces[label] if label in a.traces else None,
            test_ms=b.wall_ms[label] / b.traces[label] if label in b.traces else None,
            base_traces=a.traces.get(label, 0),
            test_traces=b.traces.get(label, 0),
        )
        for label in set(a.traces) | set(b.traces)
    ]
    regions.sort(key=lambda r: (-abs(r.delta_ms), r.region))
    ops = []
    for key in set(a.ops) | set(b.ops):
        region, name = key
        base_n, test_n = a.traces.get(region, 0) or 1, b.traces.get(region, 0) or 1
        base_us, base_count = a.ops.get(key, (0.0, 0.0))
        test_us, test_count = b.ops.get(key, (0.0, 0.0))
        status = "changed" if key in a.ops and key in b.ops else "added" if key in b.ops else "missing"
        ops.append(
            OpChange(
                region=region,
                name=name,
                base_ms=base_us / 1000.0 / base_n,
                test_ms=test_us / 1000.0 / test_n,
                base_count=base_count / base_n,
                test_count=test_count / test_n,
                status=status,
            )
        )
    ops.sort(key=lambda o: (-abs(o.delta_ms), o.region, o.name))
    return DiffResult(
        base=base_label,
        test=test_label,
        regions=tuple(regions),
        ops=tuple(ops),
        skipped=tuple(a.skipped + b.skipped),
    )


def diff_to_dict(result: DiffResult, *, top: Optional[int] = None) -> dict[str, Any]:
    """The JSON of ``torchstep-prof diff --json``::

    {"base", "test",
     "regions": [{"region", "base_ms", "test_ms", "delta_ms", "base_traces", "test_traces"}],
     "ops": [{"region", "name", "status", "base_ms", "test_ms", "delta_ms",
              "base_count", "test_count", "count_delta", "count_ratio"}],
     "skipped": [<path>, ...]}

    Times and counts are means per trace; ``ops`` is cut to ``top`` rows when given.
    """

    def r3(value: Optional[float]) -> Optional[float]:
        return None if value is None else round(value, 3)

    return {
        "base": result.base,
        "test": result.test,
        "regions": [
            {
                "region": r.region,
                "base_ms": r3(r.base_ms),
                "test_ms": r3(r.test_ms),
                "delta_ms": r3(r.delta_ms),
                "base_traces": r.base_traces,
                "test_traces": r.test_traces,
            }
            for r in result.regions
        ],  # fmt: skip
        "ops": [
            {
                "region": o.region,
                "name": o.name,
                "status": o.status,
                "base_ms": r3(o.base_ms),
                "test_ms": r3(o.test_ms),
                "delta_ms": r3(o.delta_ms),
                "base_count": r3(o.base_count),
                "test_count": r3(o.test_count),
                "count_delta": r3(o.test_count - o.base_count),
                "count_ratio": r3(o.count_ratio),
            }
            for o in result.ops[:top]
        ],  # fmt: skip
        "skipped": [u.path for u in result.skipped],
    }
