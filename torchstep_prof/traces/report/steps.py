"""The report's timelines and step charts: regions on wall-clock time, and how the steps vary.

A page of several ranks draws a timeline per step: a row per rank and process, on one clock, so
that ranks compare. A page of one rank (what one process's run leaves) has nothing to compare
across ranks: :func:`steps_section` draws every step on one timeline (a row per step, each from
its own start), each step's time per region stacked, and a table of each region's spread over
the steps.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
from typing import Any, Iterable, Sequence

from .content import Report, TimelineBar
from .template import Chart, layout
from .text import escape, label_margin

__all__ = ["COLORS", "TIMELINE_STEPS", "WHOLE_STEP", "region_colors", "steps_section", "timeline_figure"]

COLORS = (
    "#4C78A8", "#F58518", "#54A24B", "#B279A2", "#72B7B2",
    "#EECA3B", "#9D755D", "#FF9DA6", "#BAB0AC", "#79706E",
)  # fmt: skip
WHOLE_STEP = "#D9D9D9"
"""A fused trace's whole step (and, stacked, its time outside every region)."""

Row = tuple[str, Sequence[TimelineBar]]


def region_colors(bars: Iterable[TimelineBar]) -> dict[tuple[str, str], str]:
    """One color per region (role, stage), the same in every chart of the page."""
    regions = sorted({(b.role, b.stage) for b in bars if not b.whole_step})
    return {region: COLORS[index % len(COLORS)] for index, region in enumerate(regions)}


def timeline_figure(rows: Sequence[Row], colors: dict[tuple[str, str], str], *, own_clock: bool) -> dict[str, Any]:
    """Bars on wall-clock time, a row per ``rows`` entry (label, bars), first row on top.

    ``own_clock``: each row from its own first start (the steps of one rank); else every row
    from the first start of all (the ranks of one step, on one clock).
    """
    placed = [(label, b) for label, row in rows for b in row]
    first = min(b.start_ns for _, b in placed)
    origin = {label: (min(b.start_ns for b in row) if own_clock else first) for label, row in rows}
    # A fused trace's whole step first: drawn first, it lies under the regions it holds, and
    # shows in grey the time between them.
    kinds = sorted({(not b.whole_step, b.role, b.stage) for _, b in placed})
    data = []
    for regional, role, stage in kinds:
        mine = [(label, b) for label, b in placed if (not b.whole_step, b.role, b.stage) == (regional, role, stage)]
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": f"{role}/{stage}" + ("" if regional else " (whole step)"),
                "y": [label for label, _ in mine],
                "x": [round(b.wall_ms, 3) for _, b in mine],
                "base": [round((b.start_ns - origin[label]) / 1e6, 3) for label, b in mine],
                "marker": {"color": colors.get((role, stage), COLORS[0]) if regional else WHOLE_STEP},
                # The duration goes in customdata: for a bar with a base, plotly's %{x} is
                # where the bar ends, not how long it is.
                "customdata": [
                    [
                        b.role,
                        b.stage,
                        b.step,
                        (f" #{b.occurrence}" if b.occurrence != 1 else "")
                        + (" (whole fused step)" if b.whole_step else ""),
                        b.rank,
                        os.path.basename(b.file),
                        f"{b.wall_ms:.2f}",
                    ]
                    for _, b in mine
                ],  # fmt: skip
                "hovertemplate": "%{customdata[0]}/%{customdata[1]} step %{customdata[2]}"
                "%{customdata[3]} rank %{customdata[4]}<br>%{customdata[5]}<br>"
                "%{customdata[6]} ms, from %{base:.2f} ms<extra></extra>",
            }
        )
    if own_clock:
        title = "ms since the step's start"
    else:
        start = dt.datetime.fromtimestamp(first / 1e9, dt.timezone.utc)
        title = f"ms since {start:%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"
    labels = [label for label, _ in rows]
    return {
        "data": data,
        "layout": layout(
            height=max(160, 90 + 26 * len(rows)),
            barmode="overlay",
            legend=True,
            margin={"l": label_margin(labels), "r": 30, "t": 40, "b": 45},
            xaxis={"title": {"text": title}, "rangemode": "tozero"},
            yaxis={"type": "category", "categoryorder": "array", "categoryarray": list(reversed(labels))},
        ),
    }


TIMELINE_STEPS = 40
"""Most steps on a one-rank timeline (a row each): past this, the slowest steps (by the time in
their regions), in step order. The stacked chart and the table cover every step."""


def steps_section(report: Report, chart: Chart) -> str:
    """The steps of a one-rank report: one timeline, the time per region stacked per step, and
    each region's spread over the steps."""
    colors = region_colors(report.bars)
    inside, whole = _step_times(report.bars)
    steps = sorted({b.step for b in report.bars})
    in_regions = dict.fromkeys(steps, 0.0)  # each step's time inside its regions
    for (step, _), ms in inside.items():
        in_regions[step] += ms
    shown = steps
    if len(steps) > TIMELINE_STEPS:
        shown = sorted(sorted(steps, key=lambda step: -in_regions[step])[:TIMELINE_STEPS])
    by_step: dict[int, list[TimelineBar]] = {}
    for bar in report.bars:
        by_step.setdefault(bar.step, []).append(bar)
    rows = [(f"step {step}", by_step[step]) for step in shown]
    rank = report.bars[0].rank
    pids = sorted({b.pid for b in report.bars if b.pid is not None})
    who = f"rank {rank}" + (f" (pid {', '.join(map(str, pids))})" if pids else "")
    which = "" if shown == steps else f" The timeline shows the {len(shown)} slowest of the {len(steps)} steps."
    return (
        '<section id="steps"><h2>Steps</h2>'
        f'<p class="meta">{len(steps)} step(s) of {escape(who)}: each step\'s regions from the '
        f"step's start (hover for the file), then each step's time per region.{which}</p>"
        + chart(timeline_figure(rows, colors, own_clock=True), "timeline")
        + '<div class="grid wide">'
        + chart(_stacked_figure(inside, whole, in_regions, colors), "steps")
        + _spread_table(inside)
        + "</div></section>"
    )


def _step_times(bars: Iterable[TimelineBar]) -> tuple[dict[tuple[int, tuple[str, str]], float], dict[int, float]]:
    """Wall ms per (step, region) of the regions' bars, and per step of the whole fused steps,
    summed in one pass over the bars (a run of thousands of steps stays linear)."""
    inside: dict[tuple[int, tuple[str, str]], float] = {}
    whole: dict[int, float] = {}
    for b in bars:
        if b.whole_step:
            whole[b.step] = whole.get(b.step, 0.0) + b.wall_ms
        else:
            key = (b.step, (b.role, b.stage))
            inside[key] = inside.get(key, 0.0) + b.wall_ms
    return inside, whole


def _stacked_figure(
    inside: dict[tuple[int, tuple[str, str]], float],
    whole: dict[int, float],
    in_regions: dict[int, float],
    colors: dict[tuple[str, str], str],
) -> dict[str, Any]:
    steps = list(in_regions)
    labels = [f"step {step}" for step in steps]
    data = []
    for (role, stage), color in colors.items():
        data.append(
            {
                "type": "bar",
                "name": f"{role}/{stage}",
                "x": labels,
                "y": [round(inside.get((step, (role, stage)), 0.0), 3) for step in steps],
                "marker": {"color": color},
                "hovertemplate": f"{escape(role)}/{escape(stage)}, %{{x}}: %{{y:.2f}} ms<extra></extra>",
            }
        )
    outside = [round(max(0.0, whole[step] - in_regions[step]), 3) if step in whole else 0.0 for step in steps]
    if any(outside):  # fused traces: the step's time outside every region, on top
        data.append(
            {
                "type": "bar",
                "name": "outside regions",
                "x": labels,
                "y": outside,
                "marker": {"color": WHOLE_STEP},
                "hovertemplate": "outside regions, %{x}: %{y:.2f} ms<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": layout(
            height=320,
            barmode="stack",
            legend=True,
            margin={"l": 60, "r": 30, "t": 60, "b": 40},
            xaxis={"type": "category"},
            yaxis={"title": {"text": "wall ms"}, "rangemode": "tozero"},
        ),
    }


def _spread_table(inside: dict[tuple[int, tuple[str, str]], float]) -> str:
    per_region: dict[tuple[str, str], dict[int, float]] = {}
    for (step, region), ms in inside.items():
        per_region.setdefault(region, {})[step] = ms
    rows = []
    for (role, stage), ran in sorted(per_region.items()):
        slowest = max(sorted(ran), key=lambda step: ran[step])
        rows.append(
            f"<tr><td>{escape(role)}/{escape(stage)}</td><td>{len(ran)}</td>"
            f"<td>{statistics.median(ran.values()):.2f}</td><td>{min(ran.values()):.2f}</td>"
            f"<td>{ran[slowest]:.2f} (step {slowest})</td></tr>"
        )
    return (
        '<table class="diff spread"><thead><tr><th>region</th><th>steps</th><th>median ms</th>'
        f"<th>min ms</th><th>max ms</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
