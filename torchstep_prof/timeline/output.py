"""The ledger printed: a verdict per step, the chosen steps in detail, the clocks; or as JSON.

Every label and name comes from files anyone may have written, so each is escaped
(``rendering.safe_text``) before it is printed.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Optional, Sequence

import attrs

from ..rendering import safe_text
from .ledger import Ledger, RoleIdle, StepLedger, format_seconds

__all__ = ["MAX_VERDICTS", "ledger_lines", "ledger_to_dict"]

MAX_VERDICTS = 30
"""Verdict lines printed at most (the slowest steps, in step order); ``--json`` has them all."""


def ledger_to_dict(ledger: Ledger, folder: str) -> dict[str, Any]:
    """The ledger as plain data (an unknown bound is ``null``)."""
    return _finite({"folder": folder, **attrs.asdict(ledger, recurse=True)})  # type: ignore[no-any-return]


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def ledger_lines(ledger: Ledger, folder: str, detail: Optional[Sequence[int]] = None) -> Iterator[str]:
    """The printed timeline; ``detail`` names the steps shown in full (default: the slowest)."""
    hosts = {p.host for p in ledger.processes}
    yield safe_text(
        f"timeline of {folder}: {len(ledger.processes)} processes on {len(hosts)} host{'s' if len(hosts) != 1 else ''}, "
        f"{len(ledger.steps)} steps"
    )
    for warning in ledger.warnings:
        yield safe_text(f"warning: {warning}")
    unended = [p for p in ledger.processes if not p.ended]
    if unended:
        listed = ", ".join(
            f"{p.name} (last step finished: {'none' if p.last_step is None else p.last_step})" for p in unended
        )
        yield safe_text(
            f"no exit line (killed, or still running): {listed}; a process torn down (torchrun's SIGTERM "
            "after another rank failed, ray.shutdown()) loses what it logged in its last half second"
        )
    steps = ledger.steps
    if not steps:
        yield "no step has spans: mark steps with tsp.step(n) (or begin_step) in the processes that log spans"
    shown = steps
    if len(steps) > MAX_VERDICTS:
        slowest = {s.number for s in sorted(steps, key=lambda s: -s.seconds)[:MAX_VERDICTS]}
        shown = tuple(s for s in steps if s.number in slowest)
        yield f"the {MAX_VERDICTS} slowest of {len(steps)} steps (--json: every step):"
    for step in shown:
        yield safe_text(step.verdict)
    by_number = {s.number: s for s in steps}
    if detail is None:
        chosen = [max(steps, key=lambda s: s.seconds)] if steps else []
    else:  # the command checked that each is there
        chosen = [by_number[n] for n in detail if n in by_number]
    for step in chosen:
        yield ""
        yield from _detail(step)
    yield ""
    yield from _clocks(ledger)
    if ledger.outside_steps:
        yield f"{ledger.outside_steps} regions ran outside every step's window (not counted)"
    if ledger.problems:
        yield "problems reading the files:"
    for problem in ledger.problems[:20]:
        yield safe_text(f"  {problem}")
    if len(ledger.problems) > 20:
        yield f"... and {len(ledger.problems) - 20} more problems (--json lists them all)"


def _detail(step: StepLedger) -> Iterator[str]:
    yield f"step {step.number} ({format_seconds(step.seconds)}), process by process:"
    width = max((len(safe_text(p.process)) for p in step.processes), default=8)
    for p in step.processes:
        idle = (
            "within clock error"
            if p.within_clock_error
            else f"{format_seconds(p.idle_s)} ({_share(p.idle_s, step.seconds)})"
        )
        regions = ", ".join(f"{r} {format_seconds(s)}" for r, s in p.busy_by_region[:4])
        flag = "  INCOMPLETE (its span log ends in this step)" if p.incomplete else ""
        yield safe_text(f"  {p.process:<{width}}  busy {format_seconds(p.busy_s):>9}  idle {idle:<18}  {regions}{flag}")
        if p.within_clock_error:
            continue
        for gap in p.gaps:
            if gap.seconds <= p.idle_error_s and (gap.at_step_end or gap.start_s == 0.0):
                continue  # an edge gap no longer than the clock's error: not stated
            at = f"{format_seconds(gap.start_s)} for {format_seconds(gap.seconds)}"
            if gap.at_step_end:
                why = "until the step's end"
            elif gap.waited_for:
                why = f"until {gap.waited_for} on {gap.waited_process} ended"
            else:
                why = "unexplained"
            yield safe_text(f"  {'':<{width}}    idle at {at}: {why}")
    if step.critical_path:
        path = " → ".join(f"{e.region} ({e.process}, {format_seconds(e.seconds)})" for e in step.critical_path)
        yield safe_text(f"  critical path: {path}")
    for tail in step.long_tails[:3]:
        if tail.within_clock_error:
            yield safe_text(f"  long tail of {tail.region}: within clock error")
        else:
            median = "the other" if tail.others == 1 else f"the median of {tail.others} others"
            yield safe_text(
                f"  long tail of {tail.region}: {tail.process}, {format_seconds(tail.past_median_s)} after {median}"
            )
    shares = ", ".join(
        f"{r.role} {'within clock error' if r.within_clock_error else _share(r.idle_s, step.seconds)}"
        + (_waited(r) if r.waited_for and not r.within_clock_error else "")
        for r in step.role_idle
    )
    if shares:
        yield safe_text(f"  idle share by role: {shares}")


def _waited(r: RoleIdle) -> str:
    if r.waited_for_s >= r.idle_s / 2:  # most of it: as the verdict says it
        return f" (waiting for {r.waited_for})"
    return f" ({format_seconds(r.waited_for_s)} of it waiting for {r.waited_for})"


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.0%}" if whole > 0 else "-"


def _clocks(ledger: Ledger) -> Iterable[str]:
    if not ledger.processes:
        return
    aligned = [p.bound_s for p in ledger.processes if p.name != ledger.reference and math.isfinite(p.bound_s)]
    if aligned:
        within = f"every aligned offset is right within {format_seconds(max(aligned))}"
    elif len(ledger.processes) > 1:
        within = "no other process is aligned to it"
    else:
        within = "one process"
    yield safe_text(f"clocks: on {ledger.reference}'s; {within}")
    for note in ledger.clock_notes:
        yield safe_text(f"  {note}")
    for p in ledger.processes:
        if abs(p.offset_s) > p.bound_s or not math.isfinite(p.bound_s):
            bound = "unknown (not aligned)" if not math.isfinite(p.bound_s) else f"± {format_seconds(p.bound_s)}"
            yield safe_text(f"  {p.name}: clock {p.offset_s:+.6f} s off, {bound}")
