"""Rendering a :class:`~torchstep_prof.traces.report.Report` as one self-contained HTML page.

Charts are plotly figures written as plain JSON specs and drawn by plotly.js, which is inlined
(the page opens offline). Figures are drawn when they scroll into view, so a page of hundreds of
groups stays responsive; ``window.tspDrawAll()`` draws every one (for printing and tests).
plotly is imported only here, and only by ``torchstep-prof report``.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import os
import statistics
from typing import Any, Iterable, Sequence

from .collectives import describe_waits
from .findings import describe_finding
from .report_diagnosis import baseline_section, memory_section, waits_section
from .report_template import PAGE, SCRIPT, STYLE
from .report import Report, TimelineBar
from .summarize import STRAGGLER_MIN_MS, GroupSummary

__all__ = ["INSTALL_HINT", "PlotlyMissing", "load_plotlyjs", "render_page"]

INSTALL_HINT = "pip install 'torchstep_prof[report]'"

_COLORS = (
    "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2",
    "#EECA3B", "#9D755D", "#FF9DA6", "#BAB0AC", "#79706E",
)  # fmt: skip
_BAR = "#4C78A8"
_WHOLE_STEP = "#D9D9D9"
_STRAGGLER = "#D62728"


class PlotlyMissing(ImportError):
    """plotly, which draws the report's charts, is not installed."""


def load_plotlyjs() -> str:
    """plotly.js, to inline in the page; :class:`PlotlyMissing` says how to install it."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise PlotlyMissing(f"the report draws its charts with plotly, which is not installed: {INSTALL_HINT}") from exc
    return get_plotlyjs()


def render_page(report: Report, plotlyjs: str) -> str:
    """The whole page: header, what stands out, per step a timeline and the groups' wall-time
    charts, per region its top operators (the regions inside fused traces included)."""
    figures: list[dict[str, Any]] = []

    def chart(figure: dict[str, Any], css: str) -> str:
        figures.append(figure)
        return f'<div class="chart {css}" data-fig="{len(figures) - 1}"></div>'

    body = [_header(report), _findings(report)]
    # The diagnosis sections (each only when there is something to show) come next.
    body += [waits_section(report, chart), memory_section(report, chart), baseline_section(report, chart)]
    steps = sorted({g.step for g in report.summary.groups})
    for step in steps:
        bars = [b for b in report.bars if b.step == step]
        groups = [g for g in report.summary.groups if g.step == step]
        body.append(f'<section class="step" id="step-{step}"><h2>Step {step}</h2>')
        body.append(chart(_timeline_figure(step, bars), "timeline"))
        body.append('<div class="grid">')
        for group in groups:
            body.append(
                f'<div class="card" id="{_group_id(group)}">'
                f"<h3>{_e(_group_title(group))}</h3>"
                f'<p class="meta">{_e(_group_meta(group, report))}</p>'
                + chart(_group_figure(group, report), "group")
                + _ops_table(group)
                + "</div>"
            )
        body.append("</div></section>")
    body.append('<section id="regions"><h2>Top operators by region</h2><div class="grid">')
    for region in report.regions:
        whole = " (whole fused step)" if region.whole_step else ""
        body.append(
            f'<div class="card"><h3>{_e(region.role)}/{_e(region.stage)}{whole}</h3>'
            f'<p class="meta">self time per trace, averaged over {region.traces} trace(s)</p>'
            + chart(_region_figure(region), "ops")
            + "</div>"
        )
    body.append("</div></section>")
    return PAGE.format(
        title=_e(f"torchstep-prof report: {report.directory}"),
        style=STYLE,
        plotlyjs=plotlyjs,
        body="\n".join(body),
        figures=_script_json(figures),
        script=SCRIPT,
    )


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
        lines.append("<p>Other runs left out: " + _e(", ".join(report.other_runs)) + "</p>")
    lines.append("</header>")
    return "\n".join(lines)


def _findings(report: Report) -> str:
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
    else:
        out.append("<p>No straggler: every rank is near its group's median.</p>")
    late = [w for w in report.waits if w.late_rank is not None]
    if late:  # equal wall times hide a slow rank: the others' waiting shows it
        out.append('<ul class="late">')
        out.extend(f'<li><a href="#waits">{_e(describe_waits(w))}</a></li>' for w in late)
        out.append("</ul>")
    out.append(f'<p class="meta">{_e(rule)}.</p></section>')
    return "\n".join(out)


def _group_title(group: GroupSummary) -> str:
    occurrence = group.occurrence
    title = f"{group.role}/{group.stage} step {group.step}"
    return title + (f" #{occurrence}" if occurrence != 1 else "")


def _group_meta(group: GroupSummary, report: Report) -> str:
    text = f"{len(group.ranks)} rank(s), median {group.median_ms:.1f} ms"
    if group.straggler is not None:
        slow = max(r.wall_ms for r in group.ranks if r.rank == group.straggler)
        ratio = slow / group.median_ms if group.median_ms > 0 else float("inf")
        text += f", straggler: rank {group.straggler} ({ratio:.2f}x)"
    return text + _gpu_meta(group)


def _gpu_meta(group: GroupSummary) -> str:
    """The group's GPU time beside its wall time: the median over the ranks whose traces hold
    kernels (traces/gpu_time.py); nothing when none does."""
    values = [r.gpu_ms for r in group.ranks if r.gpu_ms is not None]
    if not values:
        return ""
    return f", GPU (kernels inside the region) median {statistics.median(values):.1f} ms"


def _ops_table(group: GroupSummary) -> str:
    if not group.top_ops:
        return ""
    rows = "".join(f"<tr><td>{op.self_ms:.2f}</td><td>{_e(op.name)}</td></tr>" for op in group.top_ops[:5])
    return (
        '<table class="ops"><thead><tr><th>self ms</th><th>top operators (mean over ranks)'
        f"</th></tr></thead><tbody>{rows}</tbody></table>"
    )


# --- the figures (plotly JSON specs) ----------------------------------------------------------


def _layout(**extra: Any) -> dict[str, Any]:
    layout = {
        "margin": {"l": 60, "r": 20, "t": 10, "b": 40},
        "height": 260,
        "template": None,
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "showlegend": False,
    }
    layout.update(extra)
    return layout


def _group_figure(group: GroupSummary, report: Report) -> dict[str, Any]:
    labels = _rank_labels(group)
    straggling = [r.rank == group.straggler and r.wall_ms == group.max_ms for r in group.ranks]
    ratios = [r.wall_ms / group.median_ms if group.median_ms > 0 else 1.0 for r in group.ranks]
    bar = {
        "type": "bar",
        "x": labels,
        "y": [round(r.wall_ms, 3) for r in group.ranks],
        "marker": {"color": [_STRAGGLER if s else _BAR for s in straggling]},
        "customdata": [
            [f"{ratio:.2f}", os.path.basename(r.file), "straggler" if s else ""]
            for r, ratio, s in zip(group.ranks, ratios, straggling)
        ],
        "hovertemplate": "%{x}: %{y:.2f} ms (%{customdata[0]}x median) %{customdata[2]}"
        "<br>%{customdata[1]}<extra></extra>",
    }
    annotations = [
        {
            "xref": "paper",
            "x": 1,
            "xanchor": "right",
            "y": group.median_ms,
            "yanchor": "bottom",
            "text": f"median {group.median_ms:.1f} ms",
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
        "layout": _layout(
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
    counts: dict[int, int] = {}
    for r in group.ranks:
        counts[r.rank] = counts.get(r.rank, 0) + 1
    labels = []
    for r in group.ranks:
        label = f"rank {r.rank}"
        if counts[r.rank] > 1:  # several runs in the folder: tell the rows apart by process
            pid = getattr(r, "pid", None)
            label += f" pid {pid}" if pid is not None else f" {os.path.basename(r.file)}"
        labels.append(label)
    return labels


def _timeline_figure(step: int, bars: Sequence[TimelineBar]) -> dict[str, Any]:
    origin = min(b.start_ns for b in bars)
    rows = sorted({(b.rank, b.pid if b.pid is not None else -1) for b in bars})
    row_label = {key: _row_label(*key) for key in rows}
    # A fused trace's whole step first: drawn first, it lies under the regions it holds, and
    # shows in grey the time between them.
    regions = sorted({(not b.whole_step, b.role, b.stage) for b in bars})
    data = []
    colors = 0
    for regional, role, stage in regions:
        mine = [b for b in bars if (not b.whole_step, b.role, b.stage) == (regional, role, stage)]
        color = _COLORS[colors % len(_COLORS)] if regional else _WHOLE_STEP
        colors += regional
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"{role}/{stage}" + ("" if regional else " (whole step)"),
                "y": [row_label[(b.rank, b.pid if b.pid is not None else -1)] for b in mine],
                "x": [round(b.wall_ms, 3) for b in mine],
                "base": [round((b.start_ns - origin) / 1e6, 3) for b in mine],
                "marker": {"color": color},
                # The duration goes in customdata: for a bar with a base, plotly's %{x} is
                # where the bar ends, not how long it is.
                "customdata": [
                    [
                        b.role,
                        b.stage,
                        b.step,
                        _occ_text(b.occurrence) + (" (whole fused step)" if b.whole_step else ""),
                        b.rank,
                        os.path.basename(b.file),
                        f"{b.wall_ms:.2f}",
                    ]
                    for b in mine
                ],  # fmt: skip
                "hovertemplate": "%{customdata[0]}/%{customdata[1]} step %{customdata[2]}"
                "%{customdata[3]} rank %{customdata[4]}<br>%{customdata[5]}<br>"
                "%{customdata[6]} ms, from %{base:.2f} ms<extra></extra>",
            }
        )
    start = dt.datetime.fromtimestamp(origin / 1e9, dt.timezone.utc)
    return {
        "data": data,
        "layout": _layout(
            height=max(160, 70 + 26 * len(rows)),
            barmode="overlay",
            showlegend=True,
            legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
            margin={"l": 130, "r": 20, "t": 30, "b": 40},
            xaxis={
                "title": {"text": f"ms since {start:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"},
                "rangemode": "tozero",
            },
            yaxis={
                "type": "category",
                "categoryorder": "array",
                "categoryarray": [row_label[key] for key in reversed(rows)],
            },
        ),
    }


def _row_label(rank: int, pid: int) -> str:
    return f"rank {rank}" + (f" pid {pid}" if pid >= 0 else "")


def _occ_text(occurrence: int) -> str:
    return f" #{occurrence}" if occurrence != 1 else ""


def _region_figure(region: Any) -> dict[str, Any]:
    ops = list(reversed(region.ops))  # plotly draws the first category at the bottom
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": [op.name for op in ops],
                "x": [round(op.self_ms, 3) for op in ops],
                "marker": {"color": _BAR},
                "hovertemplate": "%{y}: %{x:.3f} ms self time per trace<extra></extra>",
            }
        ],
        "layout": _layout(
            height=max(160, 60 + 22 * len(ops)),
            margin={"l": 220, "r": 20, "t": 10, "b": 40},
            xaxis={"title": {"text": "self ms per trace"}, "rangemode": "tozero"},
            yaxis={"type": "category", "automargin": True},
        ),
    }


# --- helpers -------------------------------------------------------------------------------


def _group_id(group: GroupSummary) -> str:
    return _anchor(group.role, group.stage, group.step, group.occurrence)


def _anchor(role: str, stage: str, step: int, occurrence: int) -> str:
    return _e(f"g-{role}-{stage}-{step}-{occurrence}")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _script_json(value: Iterable[Any]) -> str:
    # Inside <script>, "</" could end the element early: JSON allows "<\/" for the same text.
    return json.dumps(list(value), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
