"""The report's diagnosis sections: collective waits, memory per region, changes from a baseline.

Each function takes the :class:`~torchstep_prof.traces.report.content.Report` and ``chart`` (which files
a plotly figure spec and returns its placeholder ``<div>``, see
:mod:`~torchstep_prof.traces.report.page`) and returns the section's HTML; a report without such
data gets no section (and no figure).
"""

from __future__ import annotations

from typing import Any

from ..analysis.collectives import describe_waits
from ..analysis.memory import MIB, describe_memory
from .content import Report
from .template import Chart, layout
from .text import AXIS_LABEL_CHARS, axis_labels, escape, label_margin

__all__ = ["baseline_section", "memory_section", "waits_section"]

_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2", "#EECA3B", "#9D755D", "#FF9DA6")
DIFF_ROWS = 20
"""Operator rows of the baseline section (largest change first)."""


def _layout(height: int = 280, **extra: Any) -> dict[str, Any]:
    return layout(
        **{
            "margin": {"l": 70, "r": 20, "t": 30, "b": 50},
            "height": height,
            "barmode": "group",
            "legend": True,
            **extra,
        }
    )


def waits_section(report: Report, chart: Chart) -> str:
    """Per step, each rank's wait in collectives (summed over the step's groups), as grouped
    bars; then each group's waits in words, the late rank named."""
    if not report.waits:
        return ""
    steps = sorted({w.step for w in report.waits})
    ranks = sorted({r.rank for w in report.waits for r in w.ranks})
    data = []
    for index, rank in enumerate(ranks):
        totals = [
            round(sum(r.wait_ms for w in report.waits if w.step == step for r in w.ranks if r.rank == rank), 3)
            for step in steps
        ]
        data.append(
            {
                "type": "bar",
                "name": f"rank {rank}",
                "x": [f"step {s}" for s in steps],
                "y": totals,
                "marker": {"color": _COLORS[index % len(_COLORS)]},
                "hovertemplate": f"rank {rank}, %{{x}}: %{{y:.2f}} ms waiting<extra></extra>",
            }
        )
    figure = {
        "data": data,
        "layout": _layout(
            xaxis={"type": "category", "title": {"text": "step"}},
            yaxis={"title": {"text": "wait in collectives, ms"}, "rangemode": "tozero"},
        ),
    }
    items = "".join(f"<li>{escape(describe_waits(w))}</li>" for w in report.waits)
    return (
        '<section id="waits"><h2>Collective waits</h2>'
        '<p class="meta">Collectives matched across the ranks of each group by name and order; a '
        "rank's wait is its duration minus the shortest across ranks (clocks are not compared). "
        "The rank that waited least arrived last.</p>" + chart(figure, "waits") + f"<ul>{items}</ul></section>"
    )


def memory_section(report: Report, chart: Chart) -> str:
    """Per region and step, the peak (largest rank) and net growth (median rank) in MiB, and
    each region in words (its allocating operators, an imbalance across ranks)."""
    if not report.memory:
        return ""
    labels = [
        f"{m.role}/{m.stage} step {m.step}"
        + (f" #{m.occurrence}" if m.occurrence > 1 else "")
        + (f" ({m.device})" if m.device != "cpu" else "")
        for m in report.memory
    ]
    figure = {
        "data": [
            {
                "type": "bar",
                "name": "peak (largest rank)",
                "x": labels,
                "y": [round(m.peak_bytes / MIB, 3) for m in report.memory],
                "marker": {"color": _COLORS[0]},
                "hovertemplate": "%{x}: peak %{y:.1f} MiB<extra></extra>",
            },
            {
                "type": "bar",
                "name": "net growth (median rank)",
                "x": labels,
                "y": [round(m.net_bytes / MIB, 3) for m in report.memory],
                "marker": {"color": _COLORS[1]},
                "hovertemplate": "%{x}: net %{y:+.1f} MiB<extra></extra>",
            },
        ],  # fmt: skip
        "layout": _layout(
            height=320,
            xaxis={"type": "category", "automargin": True},
            yaxis={"title": {"text": "MiB"}},
        ),
    }
    items = "".join(f"<li>{escape(describe_memory(m))}</li>" for m in report.memory)
    return (
        '<section id="memory"><h2>Memory per region</h2>'
        '<p class="meta">From the traces\' [memory] events (tsp.contents("memory")): the peak '
        "above the region's start and what it left allocated.</p>"
        + chart(figure, "memory")
        + f"<ul>{items}</ul></section>"
    )


def baseline_section(report: Report, chart: Chart) -> str:
    """The regions' and operators' changes from the baseline: a bar chart of the operators'
    self-time differences and tables of both, largest change first."""
    diff = report.diff
    if diff is None:
        return ""
    ops = list(diff.ops[:DIFF_ROWS])
    shown = list(reversed(ops))  # plotly draws the first category at the bottom
    names = [f"{o.region}: {o.name}" for o in shown]
    labels = axis_labels(names, limit=2 * AXIS_LABEL_CHARS)  # a chart as wide as the page
    figure = {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "y": names,
                "x": [round(o.delta_ms, 3) for o in shown],
                "marker": {"color": ["#D62728" if o.delta_ms > 0 else "#54A24B" for o in shown]},
                "hovertemplate": "%{y}: %{x:+.3f} ms self time per trace<extra></extra>",
            }
        ],
        "layout": _layout(
            height=max(180, 60 + 22 * len(shown)),
            showlegend=False,
            margin={"l": label_margin(labels), "r": 30, "t": 10, "b": 40},
            xaxis={"title": {"text": "self ms per trace, test minus baseline"}},
            # Whole names are the categories and show in the hover; the axis shows them cut in
            # the middle, never at their start.
            yaxis={"type": "category", "tickmode": "array", "tickvals": names, "ticktext": labels},
        ),
    }
    region_rows = "".join(
        f"<tr><td>{escape(r.region)}</td><td>{_ms(r.base_ms)}</td><td>{_ms(r.test_ms)}</td><td>{r.delta_ms:+.2f}</td></tr>"
        for r in diff.regions
    )
    op_rows = "".join(
        f"<tr><td>{escape(o.region)}</td><td>{escape(o.name)}</td><td>{o.base_ms:.2f}</td>"
        f"<td>{o.test_ms:.2f}</td><td>{o.delta_ms:+.2f}</td>"
        f"<td>{o.base_count:g} &rarr; {o.test_count:g}</td><td>{'' if o.status == 'changed' else o.status}</td></tr>"
        for o in ops
    )
    return (
        '<section id="baseline"><h2>Against the baseline</h2>'
        f'<p class="meta">Baseline <code>{escape(diff.base)}</code>, this report <code>{escape(diff.test)}</code>; '
        "means per trace, largest change first.</p>"
        '<table class="diff"><thead><tr><th>region</th><th>baseline ms</th><th>ms</th><th>delta ms</th>'
        f"</tr></thead><tbody>{region_rows}</tbody></table>"
        + chart(figure, "diff")
        + '<table class="diff ops-diff"><thead><tr><th>region</th><th>operator</th><th>baseline ms</th><th>ms</th>'
        f"<th>delta ms</th><th>calls</th><th></th></tr></thead><tbody>{op_rows}</tbody></table></section>"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
