"""The content of ``torchstep-prof report``: what a folder of traces holds, as plain records.

Data first: :func:`build_report` turns scanned traces (one per file, read one at a time by
:func:`~torchstep_prof.traces.files.scan_traces`) into a :class:`Report` — summarize's groups, the
findings, one timeline bar per trace on wall-clock time, each region's top operators. Nothing
here draws: :mod:`torchstep_prof.traces.report_page` renders a report as an HTML page.
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable, Optional, Sequence, Tuple

import attrs

from .findings import FINDINGS_DEPTH, Finding, find_findings
from .names import parse_trace_name
from .summarize import DEFAULT_STRAGGLER_RATIO, Summary, summarize
from .files import OpTime, TraceInfo, Unreadable, started_at

__all__ = ["REGION_TOP_OPS", "RegionOps", "Report", "TimelineBar", "build_report"]

REGION_TOP_OPS = 10
"""Operators shown per region (by self time, averaged over the region's traces)."""


@attrs.frozen(kw_only=True)
class TimelineBar:
    """One trace as a bar on wall-clock time: its owning region, from ``start_ns`` (epoch)."""

    role: str
    stage: str
    step: int
    occurrence: int
    rank: int
    pid: Optional[int]
    file: str
    start_ns: int
    wall_ms: float


@attrs.frozen(kw_only=True)
class RegionOps:
    """A region's (role, stage) top operators: self time per trace, averaged over ``traces``."""

    role: str
    stage: str
    traces: int
    ops: Tuple[OpTime, ...]


@attrs.frozen(kw_only=True)
class Report:
    """Everything the page shows, for the traces that passed the filters."""

    directory: str
    generated: dt.datetime
    summary: Summary
    findings: Tuple[Finding, ...]
    bars: Tuple[TimelineBar, ...]
    regions: Tuple[RegionOps, ...]
    filters: Tuple[str, ...] = ()
    other_runs: Tuple[str, ...] = ()

    @property
    def traces(self) -> int:
        return len(self.bars)

    @property
    def unreadable(self) -> Tuple[Unreadable, ...]:
        return self.summary.unreadable


def build_report(
    directory: str,
    infos: Sequence[TraceInfo],
    unreadable: Iterable[Unreadable] = (),
    *,
    straggler_ratio: float = DEFAULT_STRAGGLER_RATIO,
    top: int = REGION_TOP_OPS,
    filters: Sequence[str] = (),
    other_runs: Sequence[str] = (),
) -> Report:
    """The report of ``infos`` (scanned with ``top`` >= :data:`FINDINGS_DEPTH` so that findings
    compare ranks over deep operator lists).

    >>> from torchstep_prof.traces.files import scan_traces
    >>> scanned = scan_traces("outputs/profile", top=FINDINGS_DEPTH)  # doctest: +SKIP
    >>> report = build_report("outputs/profile", *scanned)  # doctest: +SKIP
    """
    unreadable = tuple(unreadable)
    deep = summarize(infos, unreadable, straggler_ratio=straggler_ratio, top=FINDINGS_DEPTH)
    return Report(
        directory=directory,
        generated=dt.datetime.now(dt.timezone.utc),
        summary=summarize(infos, unreadable, straggler_ratio=straggler_ratio, top=top),
        findings=find_findings(deep),
        bars=tuple(sorted((_bar(info) for info in infos), key=_bar_order)),
        regions=_region_ops(infos, top),
        filters=tuple(filters),
        other_runs=tuple(other_runs),
    )


def _bar(info: TraceInfo) -> TimelineBar:
    start_ns = info.start_ns if info.start_ns is not None else round(started_at(info) * 1e9)
    return TimelineBar(
        role=info.role,
        stage=info.stage,
        step=info.step,
        occurrence=occurrence_of(info),
        rank=info.rank,
        pid=pid_of(info),
        file=info.path,
        start_ns=start_ns,
        wall_ms=info.wall_ms,
    )


def _bar_order(bar: TimelineBar) -> tuple[int, int, int, int]:
    return (bar.step, bar.rank, bar.pid if bar.pid is not None else -1, bar.start_ns)


def occurrence_of(info: TraceInfo) -> int:
    """A trace's occurrence (1 for readers that do not record one)."""
    return int(getattr(info, "occurrence", 1) or 1)


def pid_of(info: TraceInfo) -> Optional[int]:
    """A trace's process id: the scanned one when the reader records it, else the file name's."""
    pid = getattr(info, "pid", None)
    if isinstance(pid, int):
        return pid
    try:
        return parse_trace_name(info.path).pid
    except ValueError:
        return None


def _region_ops(infos: Sequence[TraceInfo], top: int) -> Tuple[RegionOps, ...]:
    totals: dict[tuple[str, str], dict[str, float]] = {}
    counts: dict[tuple[str, str], int] = {}
    for info in infos:
        key = (info.role, info.stage)
        counts[key] = counts.get(key, 0) + 1
        region = totals.setdefault(key, {})
        for op in info.top_ops:
            region[op.name] = region.get(op.name, 0.0) + op.self_ms
    regions = []
    for key in sorted(totals):
        ranked = sorted(totals[key].items(), key=lambda item: (-item[1], item[0]))[:top]
        regions.append(
            RegionOps(
                role=key[0],
                stage=key[1],
                traces=counts[key],
                ops=tuple(OpTime(name=name, self_ms=ms / counts[key]) for name, ms in ranked),
            )
        )
    return tuple(regions)
