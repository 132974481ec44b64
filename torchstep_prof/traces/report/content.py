"""The content of ``torchstep-prof report``: what a folder of traces holds, as plain records.

Data first: :func:`build_report` turns scanned traces (one per file, read one at a time by
:func:`~torchstep_prof.traces.reading.files.scan_traces`) into a :class:`Report` — summarize's groups, the
findings, the collective waits and memory per region, timeline bars on wall-clock time (one
per discrete trace; a fused trace's step and one per region entry inside it), each region's
top operators (inside fused traces too), a comparison with a baseline when given, and the job's
timeline ledger when its span files were found (docs/timeline.md). Nothing
here draws: :mod:`torchstep_prof.traces.report.page` renders a report as an HTML page.
"""

from __future__ import annotations

import datetime as dt
from typing import Iterable, Optional, Sequence, Tuple

import attrs

from ..analysis.collectives import CollectiveWaits, find_waits
from ..analysis.diff import DiffResult
from ..analysis.findings import FINDINGS_DEPTH, Finding, find_findings
from ..analysis.memory import RegionMemory, find_memory
from ...timeline.ledger import Ledger
from ..analysis.runs import OtherRun
from ..analysis.summarize import DEFAULT_STRAGGLER_RATIO, Summary, summarize, trim_summary
from ..reading.files import OpTime, TraceInfo, Unreadable, started_at

__all__ = ["REGION_TOP_OPS", "RegionOps", "Report", "TimelineBar", "build_report"]

REGION_TOP_OPS = 10
"""Operators shown per region (by self time, averaged over the region's traces)."""


@attrs.frozen(kw_only=True)
class TimelineBar:
    """A bar on wall-clock time, from ``start_ns`` (epoch): a discrete trace's owning region, or
    one region entry inside a fused trace, or (``whole_step``) a fused trace's whole step, which
    is drawn under its regions so that the time between them shows."""

    role: str
    stage: str
    step: int
    occurrence: int
    rank: int
    pid: Optional[int]
    file: str
    start_ns: int
    wall_ms: float
    whole_step: bool = False


@attrs.frozen(kw_only=True)
class RegionOps:
    """A region's (role, stage) top operators: self time per trace, averaged over ``traces``
    (its discrete traces and the fused traces holding it). ``whole_step``: a fused trace's
    step as a whole (its operators inside a region or not)."""

    role: str
    stage: str
    traces: int
    ops: Tuple[OpTime, ...]
    whole_step: bool = False


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
    other_runs: Tuple[OtherRun, ...] = ()
    waits: Tuple[CollectiveWaits, ...] = ()
    memory: Tuple[RegionMemory, ...] = ()
    diff: Optional[DiffResult] = None
    spans: Optional[str] = None  # the span folder read, when there was one
    timeline: Optional[Ledger] = None  # the ledger of its span files
    spans_warning: Optional[str] = None  # no trace's process is in them: shown above their Gantt

    @property
    def traces(self) -> int:
        return len({bar.file for bar in self.bars})

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
    other_runs: Sequence[OtherRun] = (),
    diff: Optional[DiffResult] = None,
    spans: Optional[str] = None,
    timeline: Optional[Ledger] = None,
    spans_warning: Optional[str] = None,
) -> Report:
    """The report of ``infos`` (scanned with ``top`` >= :data:`FINDINGS_DEPTH` so that findings
    compare ranks over deep operator lists); ``diff`` is the comparison with a baseline
    (:func:`~torchstep_prof.traces.analysis.diff.diff_traces`), shown in a section of its own;
    ``timeline`` the ledger of the job's span files in ``spans`` (the Gantt of every process),
    ``spans_warning`` what to say above it (span files of another job: ``_spans.warn_if_foreign``).

    >>> from torchstep_prof.traces.reading.files import scan_traces
    >>> scanned = scan_traces("outputs/profile", top=FINDINGS_DEPTH)  # doctest: +SKIP
    >>> report = build_report("outputs/profile", *scanned)  # doctest: +SKIP
    """
    unreadable = tuple(unreadable)
    deep = summarize(infos, unreadable, straggler_ratio=straggler_ratio, top=FINDINGS_DEPTH)
    return Report(
        directory=directory,
        generated=dt.datetime.now(dt.timezone.utc),
        summary=(
            trim_summary(deep, top)
            if top <= FINDINGS_DEPTH
            else summarize(infos, unreadable, straggler_ratio=straggler_ratio, top=top)
        ),
        findings=find_findings(deep),
        bars=tuple(sorted((bar for info in infos for bar in _bars(info)), key=_bar_order)),
        regions=_region_ops(infos, top),
        filters=tuple(filters),
        other_runs=tuple(other_runs),
        waits=find_waits(deep),
        memory=find_memory(deep),
        diff=diff,
        spans=spans,
        timeline=timeline,
        spans_warning=spans_warning,
    )


def _bars(info: TraceInfo) -> list[TimelineBar]:
    """A discrete trace's bar; a fused trace's whole step and a bar per region entry in it."""
    start_ns = info.start_ns if info.start_ns is not None else round(started_at(info) * 1e9)
    trace = TimelineBar(
        role=info.role,
        stage=info.stage,
        step=info.step,
        occurrence=info.occurrence,
        rank=info.rank,
        pid=info.pid,
        file=info.path,
        start_ns=start_ns,
        wall_ms=info.wall_ms,
        whole_step=bool(info.regions),
    )
    regions = [
        attrs.evolve(
            trace,
            role=span.role,
            stage=span.stage,
            occurrence=span.occurrence,
            start_ns=start_ns + round(span.offset_ms * 1e6),
            wall_ms=span.wall_ms,
            whole_step=False,
        )
        for span in info.regions
    ]
    return [trace, *regions]


def _bar_order(bar: TimelineBar) -> tuple[int, int, int, bool, int]:
    # A fused trace's whole step first: drawn first, it lies under its regions.
    return (bar.step, bar.rank, bar.pid if bar.pid is not None else -1, not bar.whole_step, bar.start_ns)


def _region_ops(infos: Sequence[TraceInfo], top: int) -> Tuple[RegionOps, ...]:
    """Each region's top operators averaged over the traces holding it: its discrete traces,
    and the fused traces it ran in (from their per-region operators); each fused step as a
    whole is a region of its own, marked ``whole_step``."""
    totals: dict[tuple[str, str, bool], dict[str, float]] = {}
    counts: dict[tuple[str, str, bool], int] = {}

    def add(key: tuple[str, str, bool], ops: Sequence[OpTime]) -> None:
        counts[key] = counts.get(key, 0) + 1
        region = totals.setdefault(key, {})
        for op in ops:
            region[op.name] = region.get(op.name, 0.0) + op.self_ms

    for info in infos:
        fused = bool(info.regions or info.region_ops)
        add((info.role, info.stage, fused), info.top_ops)
        for region in info.region_ops:
            add((region.role, region.stage, False), region.ops)
    regions = []
    for key in sorted(totals, key=lambda k: (k[2], k[0], k[1])):
        ranked = sorted(totals[key].items(), key=lambda item: (-item[1], item[0]))[:top]
        regions.append(
            RegionOps(
                role=key[0],
                stage=key[1],
                traces=counts[key],
                ops=tuple(OpTime(name=name, self_ms=ms / counts[key]) for name, ms in ranked),
                whole_step=key[2],
            )
        )
    return tuple(regions)
