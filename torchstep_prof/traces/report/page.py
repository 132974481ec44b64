"""Rendering a :class:`~torchstep_prof.traces.report.content.Report` as one self-contained HTML page.

Charts are plotly figures written as plain JSON specs and drawn by plotly.js, which is inlined
(the page opens offline). Figures are drawn when they scroll into view, so a page of hundreds of
groups stays responsive; ``window.tspDrawAll()`` draws every one (for printing and tests).
plotly is imported only here, and only by ``torchstep-prof report``.
"""

from __future__ import annotations

import collections
import datetime as dt
import os
import statistics
from typing import Any, Sequence

import attrs

from ..analysis.collectives import describe_waits
from ..analysis.findings import describe_finding
from ..analysis.span_clocks import JobClocks, TraceClock, describe_clocks
from .content import Report, TimelineBar
from .diagnosis import baseline_section, memory_section, waits_section
from .gantt import gantt_section
from .steps import region_colors, steps_section, timeline_figure
from .template import PAGE, SCRIPT, STYLE, Chart, layout
from ...rendering import safe_text
from .text import axis_labels, chart_text, escape as _e, label_margin, script_json
from ..analysis.runs import OtherRun
from ..analysis.summarize import STRAGGLER_MIN_MS, GroupSummary

__all__ = ["PlotlyMissing", "load_plotlyjs", "render_page"]

_BAR = "#4C78A8"
_STRAGGLER = "#D62728"


class PlotlyMissing(ImportError):
    """plotly, which draws the report's charts, is not installed."""


def load_plotlyjs() -> str:
    """plotly.js, to inline in the page; :class:`PlotlyMissing` says how to install it."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise PlotlyMissing(
            "the report draws its charts with plotly, which is not installed: "
            "pip install 'plotly>=5.5,<8' (the [report] extra)"
        ) from exc
    return get_plotlyjs()


def render_page(report: Report, plotlyjs: str) -> str:
    """The whole page: header, what stands out, the diagnosis sections, then the steps and each
    region's top operators (the regions inside fused traces included).

    Several ranks: per step a timeline (a row per rank) and each group's wall time per rank. One
    rank: every step on one timeline and how the steps vary
    (:func:`~torchstep_prof.traces.report.steps.steps_section`): a chart of one bar per group
    would say nothing.
    """
    figures: list[dict[str, Any]] = []

    def chart(figure: dict[str, Any], css: str) -> str:
        figures.append(figure)
        return f'<div class="chart {css}" data-fig="{len(figures) - 1}"></div>'

    one_rank = len({b.rank for b in report.bars}) == 1
    body = [_header(report), _findings(report, one_rank)]
    # The job's span files, when found: every process of the job on one clock, step by step.
    body.append(gantt_section(report, chart))
    # The diagnosis sections (each only when there is something to show) come next.
    body += [waits_section(report, chart), memory_section(report, chart), baseline_section(report, chart)]
    if one_rank:
        body.append(steps_section(report, chart))
    else:
        body += _rank_sections(report, chart)
    body.append('<section id="regions"><h2>Top operators by region</h2><div class="grid">')
    for region in report.regions:
        whole = " (whole fused step)" if region.whole_step else ""
        body.append(
            f'<div class="card"><h3>{_e(region.role)}/{_e(region.stage)}{whole}</h3>'
            f'<p class="meta">self time in ms per trace, averaged over {region.traces} trace(s)</p>'
            + chart(_region_figure(region), "ops")
            + "</div>"
        )
    body.append("</div></section>")
    return PAGE.format(
        title=_e(f"torchstep-prof report: {report.directory}"),
        style=STYLE,
        plotlyjs=plotlyjs,
        body="\n".join(body),
        figures=script_json(chart_text(figure) for figure in figures),
        script=SCRIPT,
    )


def _rank_sections(report: Report, chart: Chart) -> list[str]:
    """Per step: its timeline, a row per rank and process (on the job's clock when the span
    files give each process's offset, as ``merge`` moves them), and a card per group."""
    colors = region_colors(report.bars)
    ledger = report.timeline
    clocks = (
        JobClocks(folder=report.spans or "?", reference=ledger.reference, processes=ledger.processes)
        if ledger is not None
        else None
    )
    out = []
    for step in sorted({g.step for g in report.summary.groups}):
        bars = [b for b in report.bars if b.step == step]
        keys = sorted({(b.rank, b.pid if b.pid is not None else -1) for b in bars})
        rows = [
            (_row_label(*key), [b for b in bars if (b.rank, b.pid if b.pid is not None else -1) == key]) for key in keys
        ]
        out.append(f'<section class="step" id="step-{step}"><h2>Step {step}</h2>')
        if clocks is not None:
            moved = [_on_job_clock(row, clocks) for _, row in rows]
            rows = [(label, row) for (label, _), (row, _) in zip(rows, moved)]
            traces = [clock for row, clock in moved for _ in {b.file for b in row}]
            words = f"Each rank moved onto one clock, {clocks.reference}'s: {describe_clocks(traces, clocks.folder)}."
        else:
            words = (
                "Each trace on its own host's wall clock: the clocks are unaligned (hosts may disagree by "
                "milliseconds or more); the job's span files (--spans) put every rank on one clock."
            )
        out.append(chart(timeline_figure(rows, colors, own_clock=False), "timeline"))
        out.append(f'<p class="meta clocks">{_e(safe_text(words))}</p>')
        out.append('<div class="grid">')
        for group in (g for g in report.summary.groups if g.step == step):
            out.append(
                f'<div class="card" id="{_anchor(group.role, group.stage, group.step, group.occurrence)}">'
                f"<h3>{_e(_group_title(group))}</h3>"
                f'<p class="meta">{_e(_group_meta(group))}</p>'
                + chart(_group_figure(group), "group")
                + _ops_table(group)
                + "</div>"
            )
        out.append("</div></section>")
    return out


# --- the text parts ------------------------------------------------------------------------------


def _header(report: Report) -> str:
    summary = report.summary
    ranks = sorted({b.rank for b in report.bars})
    steps = sorted({b.step for b in report.bars})
    lines = [
        "<header><h1>torchstep-prof report</h1>",
        f'<p class="read">Read <b>{report.traces}</b> trace(s) from <code>{_e(report.directory)}'
        f"</code>: {len(summary.groups)} group(s) (role, stage, step, occurrence), "
        f"{len(steps)} step(s), {len(ranks)} rank(s). Generated "
        f"{report.generated.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC.</p>",
    ]
    if report.filters:
        lines.append(f"<p>Filters: {_e(', '.join(report.filters))}.</p>")
    if report.unreadable:
        lines.append(
            f'<details class="skipped" open><summary>Skipped {len(report.unreadable)} file(s) '
            "that are not usable traces</summary><ul>"
        )
        lines.extend(f"<li><code>{_e(u.path)}</code>: {_e(u.reason)}</li>" for u in report.unreadable)
        lines.append("</ul></details>")
    else:
        lines.append("<p>No file skipped.</p>")
    if report.other_runs:
        lines.append(f'<p class="other-runs">{_e(_describe_other_runs(report.other_runs))}</p>')
    lines.append("</header>")
    return "\n".join(lines)


def _describe_other_runs(other_runs: Sequence[OtherRun]) -> str:
    """The runs left out, in the page's words (the command line warns in its own)."""
    kept = sorted({(run.rank, run.pid if run.pid is not None else -1) for run in other_runs})
    left = sorted({pid for run in other_runs for pid in run.other_pids if pid is not None})
    traces = sum(run.left_out for run in other_runs)
    shown = ", ".join(f"rank {rank} pid {pid}" if pid >= 0 else f"rank {rank}" for rank, pid in kept)
    return (
        f"This folder holds several runs: the page shows the newest of each rank ({shown}) and "
        f"leaves out {traces} trace(s) of pid {', '.join(map(str, left)) or '?'}; "
        "report --pid P shows another."
    )


def _findings(report: Report, one_rank: bool = False) -> str:
    ratio = report.summary.straggler_ratio
    rule = (
        f"a straggler is a rank over {ratio:g}x its group's median wall time and at least "
        f"{STRAGGLER_MIN_MS:g} ms over it; its operators are compared with the group's median rank"
    )
    out = ['<section id="findings"><h2>What stands out</h2>']
    if report.findings:
        out.append("<ul>")
        for f in report.findings:
            anchor = _anchor(f.role, f.stage, f.step, f.occurrence)
            out.append(f'<li><a href="#{anchor}">{_e(describe_finding(f))}</a></li>')
        out.append("</ul>")
    elif one_rank:
        out.append(
            "<p>One rank: stragglers are found by comparing ranks, so there is none to find here. "
            "Below: each step's regions, how the steps vary, and each region's top operators.</p>"
        )
    else:
        out.append("<p>No straggler: every rank is near its group's median.</p>")
    late = [w for w in report.waits if w.late_rank is not None]
    if late:  # equal wall times hide a slow rank: the others' waiting shows it
        out.append('<ul class="late">')
        out.extend(f'<li><a href="#waits">{_e(describe_waits(w))}</a></li>' for w in late)
        out.append("</ul>")
    if not one_rank:
        out.append(f'<p class="meta">{_e(rule)}.</p>')
    out.append("</section>")
    return "\n".join(out)


def _group_title(group: GroupSummary) -> str:
    occurrence = group.occurrence
    title = f"{group.role}/{group.stage} step {group.step}"
    return title + (f" #{occurrence}" if occurrence != 1 else "")


def _group_meta(group: GroupSummary) -> str:
    text = f"{len(group.ranks)} rank(s), median {group.median_ms:.1f} ms"
    if group.straggler is not None:
        slow = max(r.wall_ms for r in group.ranks if r.rank == group.straggler)
        ratio = slow / group.median_ms if group.median_ms > 0 else float("inf")
        text += f", straggler: rank {group.straggler} ({ratio:.2f}x)"
    # The GPU time beside the wall time: the median over the ranks whose traces hold kernels
    # (traces/gpu_time.py); nothing when none does.
    gpu = [r.gpu_ms for r in group.ranks if r.gpu_ms is not None]
    if gpu:
        text += f", GPU (kernels inside the region) median {statistics.median(gpu):.1f} ms"
    return text


def _ops_table(group: GroupSummary) -> str:
    if not group.top_ops:
        return ""
    rows = "".join(f"<tr><td>{op.self_ms:.2f}</td><td>{_e(op.name)}</td></tr>" for op in group.top_ops[:5])
    return (
        '<table class="ops"><thead><tr><th>self ms</th><th>top operators (mean over ranks)'
        f"</th></tr></thead><tbody>{rows}</tbody></table>"
    )


# --- the figures (plotly JSON specs) ----------------------------------------------------------


def _group_figure(group: GroupSummary) -> dict[str, Any]:
    labels = _rank_labels(group)
    straggling = [r.rank == group.straggler and r.wall_ms == group.max_ms for r in group.ranks]
    ratios = [r.wall_ms / group.median_ms if group.median_ms > 0 else 1.0 for r in group.ranks]
    bar = {
        "type": "bar",
        "x": labels,
        "y": [round(r.wall_ms, 3) for r in group.ranks],
        "marker": {"color": [_STRAGGLER if s else _BAR for s in straggling]},
        "customdata": [
            [f"{ratio:.2f}", os.path.basename(r.path), "straggler" if s else ""]
            for r, ratio, s in zip(group.ranks, ratios, straggling)
        ],
        "hovertemplate": "%{x}: %{y:.2f} ms (%{customdata[0]}x median) %{customdata[2]}"
        "<br>%{customdata[1]}<extra></extra>",
    }
    annotations = [
        {  # above the plot, where no bar reaches (on the line, it sat on the bars)
            "xref": "paper",
            "yref": "paper",
            "x": 1,
            "xanchor": "right",
            "y": 1,
            "yanchor": "bottom",
            "text": f"dashed: median {group.median_ms:.1f} ms",
            "showarrow": False,
            "font": {"color": "#333"},
        }
    ]
    for label, rank, s in zip(labels, group.ranks, straggling):
        if s:
            annotations.append(
                {"x": label, "y": rank.wall_ms, "text": "straggler", "showarrow": True,
                 "arrowhead": 0, "ax": 0, "ay": -18, "font": {"color": _STRAGGLER}}
            )  # fmt: skip
    return {
        "data": [bar],
        "layout": layout(
            margin={"l": 60, "r": 20, "t": 24, "b": 40},
            xaxis={"type": "category", "title": {"text": "rank"}},
            # Headroom above the tallest bar for the straggler and median labels.
            yaxis={"title": {"text": "wall ms"}, "range": [0, 1.25 * max(group.max_ms, 1e-3)]},
            shapes=[
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": group.median_ms,
                    "y1": group.median_ms,
                    "line": {"color": "#333", "dash": "dash", "width": 1.5},
                }
            ],  # fmt: skip
            annotations=annotations,
        ),
    }


def _rank_labels(group: GroupSummary) -> list[str]:
    counts = collections.Counter(r.rank for r in group.ranks)
    labels = []
    for r in group.ranks:
        label = f"rank {r.rank}"
        if counts[r.rank] > 1:  # several runs in the folder: tell the rows apart by process
            label += f" pid {r.pid}" if r.pid is not None else f" {os.path.basename(r.path)}"
        labels.append(label)
    return labels


def _on_job_clock(row: Sequence[TimelineBar], clocks: JobClocks) -> tuple[list[TimelineBar], TraceClock]:
    """One rank's bars moved back by its process's clock offset (kept where it has none), and its clock."""
    first = row[0]
    clock = clocks.clock_of(pid=first.pid, rank=first.rank)
    if not clock.aligned:
        return list(row), clock
    shift = round(clock.offset_s * 1e9)
    return [attrs.evolve(b, start_ns=b.start_ns - shift) for b in row], clock


def _row_label(rank: int, pid: int) -> str:
    return f"rank {rank}" + (f" pid {pid}" if pid >= 0 else "")


def _region_figure(region: Any) -> dict[str, Any]:
    ops = list(reversed(region.ops))  # plotly draws the first category at the bottom
    names = [op.name for op in ops]
    # Whole names are the categories (two may share a shortened label) and show in the hover;
    # the axis shows them cut in the middle, so that a long one is never cut at its start.
    labels = axis_labels(names)
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": names,
                "x": [round(op.self_ms, 3) for op in ops],
                "marker": {"color": _BAR},
                "hovertemplate": "%{y}: %{x:.3f} ms self time per trace<extra></extra>",
            }
        ],
        "layout": layout(
            height=max(160, 60 + 22 * len(ops)),
            margin={"l": label_margin(labels), "r": 30, "t": 10, "b": 40},
            xaxis={"title": {"text": "self ms"}, "rangemode": "tozero"},
            # White ticks: a few pixels between the labels and the bars.
            yaxis={
                "type": "category",
                "tickmode": "array",
                "tickvals": names,
                "ticktext": labels,
                "ticks": "outside",
                "ticklen": 6,
                "tickcolor": "#ffffff",
            },
        ),
    }


# --- helpers -------------------------------------------------------------------------------


def _anchor(role: str, stage: str, step: int, occurrence: int) -> str:
    return _e(f"g-{role}-{stage}-{step}-{occurrence}")
