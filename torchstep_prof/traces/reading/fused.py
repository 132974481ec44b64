"""The regions inside a fused trace: where each ran on the step's clock, and its top operators.

A fused trace holds a whole step; each region of it is a ``<role>/<stage>`` range (see
:func:`~torchstep_prof.traces.reading.events.region_ranges`). Reading one keeps only what the report
draws, so memory stays small whatever the trace: the outermost ranges of each track (at most
:data:`MAX_SPANS` per trace, the longest) and each region's ``n`` top operators, ranked in the
same pass over the events as the trace's own.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import attrs

from .events import OpTime, RegionRange, outer_ranges, ranked_ops, top_ops_by_region
from ...naming import sanitize_label

__all__ = ["MAX_SPANS", "RegionSpan", "RegionTopOps", "read_fused_regions", "region_labels"]

MAX_SPANS = 200
"""Region bars kept per fused trace: a region entered thousands of times in a step (a loop of
micro-batches) keeps its longest entries, and the page stays responsive."""


@attrs.frozen(kw_only=True)
class RegionSpan:
    """One entry of a region in a fused trace: ``offset_ms`` after the trace's owning block
    starts, lasting ``wall_ms``; ``occurrence`` k is the region's k-th entry in the trace."""

    role: str
    stage: str
    occurrence: int
    offset_ms: float
    wall_ms: float


@attrs.frozen(kw_only=True)
class RegionTopOps:
    """A region's operators by self time within one fused trace (all its entries together)."""

    role: str
    stage: str
    ops: Tuple[OpTime, ...]


def read_fused_regions(
    trace: dict[str, Any],
    ranges: Sequence[RegionRange],
    start_us: Optional[float],
    wall_ms: float,
    top: int,
) -> tuple[Tuple[RegionSpan, ...], Tuple[RegionTopOps, ...], Tuple[OpTime, ...]]:
    """The spans of ``ranges`` inside the owning block (``start_us``, ``wall_ms``), and the
    ``top`` operators of each region and of the trace."""
    spans: list[RegionSpan] = []
    if start_us is not None:
        outer = outer_ranges(ranges, start_us, start_us + wall_ms * 1000.0)
        if len(outer) > MAX_SPANS:
            keep = set(map(id, sorted(outer, key=lambda r: -r.dur)[:MAX_SPANS]))
            outer = [r for r in outer if id(r) in keep]
        seen: dict[tuple[str, str], int] = {}
        for r in outer:
            names = region_labels(r.name)
            seen[names] = seen.get(names, 0) + 1
            spans.append(
                RegionSpan(
                    role=names[0],
                    stage=names[1],
                    occurrence=seen[names],
                    offset_ms=(r.ts - start_us) / 1000.0,
                    wall_ms=r.dur / 1000.0,
                )
            )
    overall, by_name = top_ops_by_region(trace, top)
    merged: dict[tuple[str, str], dict[str, float]] = {}
    for name, ops in by_name.items():
        # Two raw labels may sanitize alike (compute_log_prob, compute-log-prob): one region.
        totals = merged.setdefault(region_labels(name), {})
        for op in ops:
            totals[op.name] = totals.get(op.name, 0.0) + op.self_ms
    region_ops = tuple(
        RegionTopOps(role=role, stage=stage, ops=ranked_ops(totals, top, divisor=1.0))
        for (role, stage), totals in sorted(merged.items())
    )
    return tuple(spans), region_ops, overall


def region_labels(name: str) -> tuple[str, str]:
    """The role and stage of a region range's raw name (``<role>/<stage>``) as file names write them."""
    role, _, stage = name.partition("/")
    return sanitize_label(role), sanitize_label(stage)
