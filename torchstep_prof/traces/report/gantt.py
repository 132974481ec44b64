"""The report's Gantt of every process of a job, step by step, from its span files (docs/timeline.md).

One row per process (as the timeline names it: role and rank), on one clock: its regions as
bars, each idle gap shaded and labelled with what it waited for, and the critical path drawn as
a line through the regions on it; the ledger's verdict lines come first. Only the slowest
:data:`GANTT_STEPS` steps are drawn, so that a run of thousands of steps keeps a small page;
``torchstep-prof timeline`` prints any other. A chart holds at most :data:`GANTT_ROWS` processes
(those on the step's critical path and its long tails first, then the others in order), so
that a job of hundreds of processes keeps charts of a readable height; the page says how many
are left out, and ``timeline`` lists them all. Every name comes from span files anyone may write:
each goes through ``rendering.safe_text`` and is escaped for the page (:mod:`.text`).
"""

from __future__ import annotations

import math
from typing import AbstractSet, Any, Sequence

from ...rendering import safe_text
from ...timeline.ledger import Gap, Ledger, ProcessStep, StepLedger, format_seconds
from ...timeline.output import MAX_VERDICTS
from .content import Report
from .steps import COLORS
from .template import Chart, layout
from .text import escape, label_margin

__all__ = ["GANTT_ROWS", "GANTT_STEPS", "gantt_figure", "gantt_section", "gap_label", "rows_drawn", "steps_drawn"]

GANTT_STEPS = 3
"""Steps drawn as a Gantt: the slowest ones."""
GANTT_ROWS = 48
"""Processes drawn in one step's Gantt, at most (:func:`rows_drawn` says which)."""
IDLE = "#E6E6E6"
IDLE_TEXT = "#444444"
PATH = "#111111"
_MAX_PROBLEMS = 20


def gantt_section(report: Report, chart: Chart) -> str:
    """The section: what was read, the verdicts, then a Gantt per slowest step; "" without spans."""
    ledger = report.timeline
    if ledger is None:
        return ""
    folder = report.spans or "?"
    hosts = {p.host for p in ledger.processes}
    unaligned = [p.name for p in ledger.processes if not math.isfinite(p.bound_s)]
    out = ['<section id="timeline"><h2>Every process, step by step</h2>']
    if report.spans_warning:
        out.append(f'<p class="warning">Warning: {_e(report.spans_warning)}.</p>')
    out += [
        f'<p class="meta">From the span files in <code>{_e(folder)}</code>: {len(ledger.processes)} process(es) '
        f"on {len(hosts)} host(s), {len(ledger.steps)} step(s). {_e(_clock_words(ledger, unaligned))}</p>",
    ]
    steps = ledger.steps
    if not steps:
        out.append(
            "<p>No step has spans: mark steps with <code>tsp.step(n)</code> in the processes that log spans.</p>"
        )
    verdicts = steps
    if len(steps) > MAX_VERDICTS:
        slowest = {s.number for s in sorted(steps, key=lambda s: -s.seconds)[:MAX_VERDICTS]}
        verdicts = tuple(s for s in steps if s.number in slowest)
        out.append(f'<p class="meta">The {MAX_VERDICTS} slowest of {len(steps)} steps:</p>')
    if verdicts:
        out.append('<ul class="verdicts">')
        out.extend(f"<li>{_e(s.verdict)}</li>" for s in verdicts)
        out.append("</ul>")
    drawn = steps_drawn(steps)
    if drawn:
        which = "the slowest step" if len(drawn) == 1 else f"the {len(drawn)} slowest steps"
        out.append(
            f'<p class="meta">Drawn below: {which} of {len(steps)}, a row per process: its regions, its idle '
            "gaps shaded and labelled with what they waited for (hover for the whole label), the critical "
            f"path as a black line. <code>torchstep-prof timeline {_e(folder)} --step N</code> prints any step.</p>"
        )
    for step in drawn:
        out.append(f'<div class="card gantt" id="timeline-step-{step.number}"><h3>{_e(step.verdict)}</h3>')
        out.append(chart(gantt_figure(step, unaligned=set(unaligned)), "gantt"))
        left_out = len(step.processes) - len(rows_drawn(step))
        if left_out:
            out.append(
                f'<p class="meta rows-left-out">{len(step.processes) - left_out} of {len(step.processes)} processes '
                f"drawn (those on the critical path and the long tails first, then the others in order); "
                f"{left_out} not drawn. <code>torchstep-prof timeline {_e(folder)} --step {step.number}</code> "
                "lists them all.</p>"
            )
        if step.critical_path:
            path = " → ".join(f"{e.region} ({e.process}, {format_seconds(e.seconds)})" for e in step.critical_path)
            out.append(f'<p class="meta path">critical path: {_e(path)}</p>')
        out.append("</div>")
    if ledger.clock_notes:  # contradicting anchors, processes no anchor links: why a row is not aligned
        out.append('<p class="meta">Clocks:</p><ul class="clock-notes">')
        out.extend(f"<li>{_e(note)}</li>" for note in ledger.clock_notes[:_MAX_PROBLEMS])
        out.append("</ul>")
    if ledger.problems:
        out.append(
            f'<details class="skipped"><summary>{len(ledger.problems)} problem(s) with the span files</summary><ul>'
        )
        out.extend(f"<li>{_e(problem)}</li>" for problem in ledger.problems[:_MAX_PROBLEMS])
        if len(ledger.problems) > _MAX_PROBLEMS:
            out.append(f"<li>... and {len(ledger.problems) - _MAX_PROBLEMS} more (torchstep-prof timeline --json)</li>")
        out.append("</ul></details>")
    out.append("</section>")
    return "\n".join(out)


def _e(text: object) -> str:
    return escape(safe_text(str(text)))


def _clock_words(ledger: Ledger, unaligned: Sequence[str]) -> str:
    if not ledger.processes:
        return "No usable span file: nothing to draw."
    finite = [p.bound_s for p in ledger.processes if math.isfinite(p.bound_s)]
    text = (
        f"One clock, {ledger.reference}'s: every other process's offset is estimated from clock anchors, "
        f"right within {format_seconds(max(finite, default=0.0))}."
    )
    if unaligned:
        text += f" Not aligned (no anchor links them; their order against the others is not stated): {', '.join(unaligned)}."
    return text


def gap_label(gap: Gap) -> str:
    """What an idle gap is labelled with: what it waited for, the step's end, or "unexplained".

    >>> gap_label(Gap(start_s=0, seconds=1, waited_for="ref/fwd", waited_process="ref", at_step_end=False))
    'idle: waited for ref/fwd on ref'
    """
    if gap.at_step_end:
        return "idle until the step's end"
    if gap.waited_for:
        return f"idle: waited for {gap.waited_for} on {gap.waited_process}"
    return "idle: unexplained"


def _stated_gaps(p: ProcessStep) -> list[Gap]:
    """The gaps the timeline states (none within the clock's error, as ``timeline`` prints)."""
    if p.within_clock_error:
        return []
    return [g for g in p.gaps if not (g.seconds <= p.idle_error_s and (g.at_step_end or g.start_s == 0.0))]


def gantt_figure(step: StepLedger, *, unaligned: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """A plotly figure of one step: a row per process drawn (:func:`rows_drawn`), first on top
    (plain data, text not yet escaped)."""
    drawn = rows_drawn(step)
    rows = {p.process: safe_text(p.process) + (" (not aligned)" if p.process in unaligned else "") for p in drawn}
    labels = list(rows.values())
    regions = sorted({label for p in drawn for label, _, _ in p.bars})
    colors = {label: COLORS[i % len(COLORS)] for i, label in enumerate(regions)}
    data: list[dict[str, Any]] = []
    idle = [(rows[p.process], g) for p in drawn for g in _stated_gaps(p)]
    if idle:
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": "idle",
                "y": [row for row, _ in idle],
                "x": [_ms(g.seconds) for _, g in idle],
                "base": [_ms(g.start_s) for _, g in idle],
                "marker": {"color": IDLE, "line": {"color": "#BBBBBB", "width": 1}},
                "text": [safe_text(gap_label(g)) for _, g in idle],
                "textposition": "inside",
                "insidetextanchor": "middle",
                "textfont": {"color": IDLE_TEXT},
                "customdata": [[format_seconds(g.seconds)] for _, g in idle],
                "hovertemplate": "%{y}: %{text}<br>%{customdata[0]} from %{base:.1f} ms<extra></extra>",
            }
        )
    for region in regions:
        placed = [(rows[p.process], a, b) for p in drawn for label, a, b in p.bars if label == region]
        data.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": safe_text(region),
                "y": [row for row, _, _ in placed],
                "x": [_ms(b - a) for _, a, b in placed],
                "base": [_ms(a) for _, a, _ in placed],
                "marker": {"color": colors[region]},
                "customdata": [[safe_text(region), format_seconds(b - a)] for _, a, b in placed],
                "hovertemplate": "%{y}: %{customdata[0]}<br>%{customdata[1]} from %{base:.1f} ms<extra></extra>",
            }
        )
    path = [e for e in step.critical_path if e.process in rows]
    if path:
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "critical path",
                "x": [_ms(t) for e in path for t in (e.start_s, e.end_s)],
                "y": [rows[e.process] for e in path for _ in (0, 1)],
                "line": {"color": PATH, "width": 3},
                "marker": {"color": PATH, "size": 7},
                "customdata": [[safe_text(f"{e.region} ({e.process})")] for e in path for _ in (0, 1)],
                "hovertemplate": "critical path: %{customdata[0]}<extra></extra>",
            }
        )
    return {
        "data": data,
        "layout": layout(
            height=max(180, 110 + 34 * len(labels)),
            barmode="overlay",
            legend=True,
            uniformtext={"mode": "hide", "minsize": 9},  # a label that does not fit its gap is left to the hover
            margin={"l": label_margin(labels) + 12, "r": 30, "t": 40, "b": 45},
            xaxis={"title": {"text": f"ms since step {step.number}'s start"}, "rangemode": "tozero"},
            yaxis={"type": "category", "categoryorder": "array", "categoryarray": list(reversed(labels))},
        ),
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def steps_drawn(steps: Sequence[StepLedger]) -> list[StepLedger]:
    """The steps given a Gantt: the slowest :data:`GANTT_STEPS`, slowest first."""
    return sorted(steps, key=lambda s: -s.seconds)[:GANTT_STEPS]


def rows_drawn(step: StepLedger) -> list[ProcessStep]:
    """The processes one step's Gantt draws, in the ledger's order: every one up to
    :data:`GANTT_ROWS`; past it, those on the critical path and the long tails first, then the
    others in order, up to :data:`GANTT_ROWS`."""
    if len(step.processes) <= GANTT_ROWS:
        return list(step.processes)
    first = {e.process for e in step.critical_path} | {t.process for t in step.long_tails}
    kept = [p.process for p in step.processes if p.process in first][:GANTT_ROWS]
    kept += [p.process for p in step.processes if p.process not in first][: GANTT_ROWS - len(kept)]
    chosen = set(kept)
    return [p for p in step.processes if p.process in chosen]
