"""The ledger: each step across every process — busy and idle time, what each gap waited for, the critical path, the long tail.

Built from the span files (:mod:`.reading`) on one clock (:mod:`.clock`). A step's window runs
from the first start to the last end of its step blocks and regions on any process. Within it,
each process is busy while any of its regions runs, and idle otherwise; an idle gap *waited
for* the region of another process that ended last before the gap closed (within the clock
bound of the two), or is "unexplained". A gap at the window's end waited for the step's end.

Nothing smaller than the clock bound is stated as a fact: an idle time whose error (the bound
of the gaps at the window's edges) is as large as itself is marked ``within_clock_error``, and
so is a long tail no longer than the bound.

>>> from torchstep_prof.timeline.reading import SpanFolder
>>> build_ledger(SpanFolder(processes=(), problems=())).steps
()
"""

from __future__ import annotations

import bisect
import math
import statistics
from typing import Optional, Sequence

import attrs

from .clock import ClockEstimate, Contradiction, estimate_offsets
from .reading import ProcessSpans, SpanFolder

__all__ = [
    "Gap",
    "Ledger",
    "LongTail",
    "PathEntry",
    "ProcessInfo",
    "ProcessStep",
    "RoleIdle",
    "StepLedger",
    "build_ledger",
]

MIN_GAP_S = 0.001
"""Idle gaps shorter than this are counted in the idle time but not listed one by one."""
MAX_GAPS_LISTED = 8
MAX_PATH = 16
_MAX_CONTRADICTIONS = 3


@attrs.frozen(kw_only=True)
class ProcessInfo:
    """One process of the job: how the ledger names it, and its clock."""

    name: str
    role: str  # its process_role, else its regions' roles joined by '+'
    rank: Optional[int]
    host: str
    pid: int
    offset_s: float  # its clock minus the reference's
    bound_s: float  # the offset is right within this (inf: no anchor links it)
    ended: bool  # its span file ends with the line of a normal exit
    last_step: Optional[int] = None  # the last step block it finished (logged)


@attrs.frozen(kw_only=True)
class Gap:
    """An idle stretch of one process in a step (seconds from the step's start)."""

    start_s: float
    seconds: float
    waited_for: Optional[str]  # "role/stage", None: unexplained (or the step's end)
    waited_process: Optional[str]
    at_step_end: bool


@attrs.frozen(kw_only=True)
class ProcessStep:
    """One process in one step."""

    process: str
    role: str
    busy_s: float
    busy_by_region: tuple[tuple[str, float], ...]  # (role/stage, seconds), longest first
    idle_s: float
    idle_error_s: float  # the idle time is right within this (its gaps at the window's edges)
    within_clock_error: bool  # idle_s <= idle_error_s: no idle time stated
    gaps: tuple[Gap, ...]  # the longest, at most MAX_GAPS_LISTED, in time order
    incomplete: bool  # the process's span log ends in this step (it has no end line)
    bars: tuple[
        tuple[str, float, float], ...
    ] = ()  # its outermost regions: (role/stage, start_s, end_s) from the step's start


@attrs.frozen(kw_only=True)
class PathEntry:
    region: str
    process: str
    seconds: float
    start_s: float = 0.0  # from the step's start (a run of one region merged: its first start)
    end_s: float = 0.0


@attrs.frozen(kw_only=True)
class LongTail:
    """The process that ended a phase (a region run by several processes) last, and whose own
    time in it was longer than the median of the others' (one that merely started late is none)."""

    region: str
    process: str
    past_median_s: float  # its end, after the median end of the others
    longer_by_s: float  # its own time in the region, past the median of the others' (it was slow, not late)
    others: int
    within_clock_error: bool


@attrs.frozen(kw_only=True)
class RoleIdle:
    role: str
    processes: int
    idle_s: float  # mean over the role's processes
    waiting_s: float  # the part of it before the role's last region (not waiting for the step's end)
    share: float  # of the step's window
    waited_for: Optional[str]  # the region its gaps waited for longest
    within_clock_error: bool
    waited_for_s: float = 0.0  # the part of idle_s (mean over the role's processes) that waited for it


@attrs.frozen(kw_only=True)
class StepLedger:
    number: int
    seconds: float
    verdict: str
    processes: tuple[ProcessStep, ...]
    critical_path: tuple[PathEntry, ...]
    long_tails: tuple[LongTail, ...]
    role_idle: tuple[RoleIdle, ...]


@attrs.frozen(kw_only=True)
class Ledger:
    processes: tuple[ProcessInfo, ...]
    reference: Optional[str]
    steps: tuple[StepLedger, ...]
    problems: tuple[str, ...]  # files and lines skipped
    outside_steps: int  # regions in no step's window
    clock_notes: tuple[str, ...] = ()  # anchors that contradict each other, processes not aligned
    warnings: tuple[str, ...] = ()  # said before the verdicts: what the files say was lost


class _Item:
    """A region on the common clock, with its process's index (the working record)."""

    __slots__ = ("p", "label", "start", "end", "thread", "top")

    def __init__(self, p: int, label: str, start: float, end: float, thread: str) -> None:
        self.p, self.label, self.start, self.end, self.thread = p, label, start, end, thread
        self.top = True


def build_ledger(folder: SpanFolder) -> Ledger:
    """Every step's record, from the span files of ``folder``."""
    procs = folder.processes
    clock = estimate_offsets(
        {i: p.host for i, p in enumerate(procs)},
        {i: p.anchors for i, p in enumerate(procs)},
        {i: p.ray for i, p in enumerate(procs)},
    )
    infos = _infos(procs, clock)
    reference = infos[clock.reference].name if isinstance(clock.reference, int) else None
    clock_notes = [_contradiction_text(x, infos) for x in clock.contradictions[:_MAX_CONTRADICTIONS]]
    if len(clock.contradictions) > _MAX_CONTRADICTIONS:
        clock_notes.append(f"... and {len(clock.contradictions) - _MAX_CONTRADICTIONS} more pairs of processes")
    unaligned = [infos[i].name for i in range(len(procs)) if i != clock.reference and math.isinf(clock.bound(i))]
    if unaligned:
        clock_notes.append(
            f"no clock anchor links {', '.join(unaligned)} to {reference} "
            "(another host, no tsp.clock_anchor, no anchored Ray call, or anchors that contradict each other): "
            "their order against the others is not stated"
        )
    by_step, outside, blocks = _assign(procs, clock)
    finished = [{b.number for b in p.steps} for p in procs]
    steps = []
    for number in sorted(by_step):
        items, (w0, w1) = by_step[number]
        stopped = [
            i
            for i, p in enumerate(procs)
            if not p.ended and finished[i] and number not in finished[i] and number == max(finished[i]) + 1
        ]
        steps.append(_step(number, items, w0, w1, infos, clock, stopped, blocks))
    return Ledger(
        processes=tuple(infos),
        reference=reference,
        steps=tuple(steps),
        problems=folder.problems,
        outside_steps=outside,
        clock_notes=tuple(clock_notes),
        warnings=tuple(_warnings(procs, infos)),
    )


def _warnings(procs: Sequence[ProcessSpans], infos: list[ProcessInfo]) -> list[str]:
    """Processes whose anchored Ray calls ran but that logged no region: an ``async def``
    actor method runs in another thread and context than ``__init__``, so spans entered
    there are off in it (docs/timeline.md)."""
    said = []
    for i, p in enumerate(procs):
        ran = sum(1 for r in p.ray if r.what == "ran")
        if ran and not p.spans:
            who = infos[i].name if "pid" in infos[i].name else f"{infos[i].name} (pid {p.pid})"
            said.append(
                f"{who} ran {ran} anchored Ray call{'s' if ran != 1 else ''} but logged no region: "
                "an async actor method runs in another thread and context, so enter tsp.spans in the method "
                "(docs/timeline.md)"
            )
    return said


def _contradiction_text(x: Contradiction, infos: list[ProcessInfo]) -> str:
    a, b = (infos[p].name if isinstance(p, int) else str(p) for p in (x.a, x.b))
    if x.same_host:
        return (
            f"clock anchor {x.name!r} #{x.seq} puts {a} and {b}, of one host (one clock), "
            f"{format_seconds(x.seconds)} further apart than their host allows: one name was used by two barriers "
            "(two runs in one folder?); those processes are aligned by host only"
        )
    if x.against is None:
        return f"clock anchors contradict each other (through other processes) for {a} and {b}: aligned by host only"
    against = f"#{x.against[1]}" if x.against[0] == x.name else f"{x.against[0]!r} #{x.against[1]}"
    return (
        f"clock anchor {x.name!r} #{x.seq} contradicts {against} (and the anchors before it) for {a} and {b} "
        f"by {format_seconds(x.seconds)}: a clock stepped, or one name was used by two barriers; "
        "those processes are aligned by host only"
    )


def _infos(procs: Sequence[ProcessSpans], clock: ClockEstimate) -> list[ProcessInfo]:
    roles = []
    for p in procs:
        if p.process_role:
            roles.append(p.process_role)
            continue
        total: dict[str, float] = {}
        for s in p.spans:
            total[s.role] = total.get(s.role, 0.0) + (s.end - s.start)
        roles.append("+".join(sorted(total)[:4]) or "?")  # colocated roles: one name whatever their times
    hosts = {p.host for p in procs}
    names = []
    for i, p in enumerate(procs):
        same = [j for j in range(len(procs)) if roles[j] == roles[i]]
        ranks = {procs[j].rank for j in same}
        if len(same) == 1:
            name = roles[i] if p.rank is None or (p.world_size or 1) == 1 else f"{roles[i]} rank {p.rank}"
        elif len(ranks) == len(same) and (p.world_size or 1) > 1:
            name = f"{roles[i]} rank {p.rank}"
        else:
            name = f"{roles[i]} pid {p.pid}"
        if len(hosts) > 1:
            name += f"@{p.host}"
        names.append(name)
    return [
        ProcessInfo(
            name=names[i],
            role=roles[i],
            rank=p.rank,
            host=p.host,
            pid=p.pid,
            offset_s=clock.offset(i),
            bound_s=clock.bound(i),
            ended=p.ended,
            last_step=max((b.number for b in p.steps), default=None),
        )
        for i, p in enumerate(procs)
    ]


def _assign(
    procs: Sequence[ProcessSpans], clock: ClockEstimate
) -> tuple[dict[int, tuple[list[_Item], tuple[float, float]]], int, dict[int, dict[int, tuple[float, float]]]]:
    """Each region's step (its process's step block around it, else the job's window around
    its middle), on the common clock; each step's window; each process's blocks per step."""
    windows: dict[int, list[float]] = {}
    items: dict[int, list[_Item]] = {}
    loose: list[_Item] = []
    blocks: dict[int, dict[int, tuple[float, float]]] = {}
    for i, p in enumerate(procs):
        off = clock.offset(i)
        ordered = sorted(p.steps, key=lambda b: b.start)
        starts = [b.start for b in ordered]
        for b in ordered:
            start, end = b.start - off, b.end - off
            blocks.setdefault(b.number, {})[i] = (start, end)
            _widen(windows, b.number, start, end)
        for s in p.spans:
            item = _Item(i, f"{s.role}/{s.stage}", s.start - off, s.end - off, s.thread)
            k = bisect.bisect_right(starts, s.start) - 1
            if k >= 0 and s.start <= ordered[k].end:
                number = ordered[k].number
                items.setdefault(number, []).append(item)
                _widen(windows, number, item.start, item.end)
            else:
                loose.append(item)
    order = sorted(windows, key=lambda n: windows[n][0])
    window_starts = [windows[n][0] for n in order]
    outside = 0
    for item in loose:
        middle = (item.start + item.end) / 2
        k = bisect.bisect_right(window_starts, middle) - 1
        if k >= 0 and middle <= windows[order[k]][1]:
            items.setdefault(order[k], []).append(item)
        else:
            outside += 1
    for number in order:  # a loose region may reach past its window's edges: widen to hold it
        for item in items.get(number, ()):
            _widen(windows, number, item.start, item.end)
    return {n: (items.get(n, []), (windows[n][0], windows[n][1])) for n in order}, outside, blocks


def _widen(windows: dict[int, list[float]], number: int, start: float, end: float) -> None:
    w = windows.get(number)
    if w is None:
        windows[number] = [start, end]
    else:
        w[0], w[1] = min(w[0], start), max(w[1], end)


def _mark_nested(items: list[_Item]) -> None:
    by_thread: dict[tuple[int, str], list[_Item]] = {}
    for item in items:
        by_thread.setdefault((item.p, item.thread), []).append(item)
    for group in by_thread.values():
        group.sort(key=lambda x: (x.start, -x.end))
        reach = -math.inf
        for item in group:
            item.top = item.end > reach
            if item.top:
                reach = item.end


def _step(
    number: int,
    items: list[_Item],
    w0: float,
    w1: float,
    infos: list[ProcessInfo],
    clock: ClockEstimate,
    stopped: list[int],
    blocks: dict[int, dict[int, tuple[float, float]]],
) -> StepLedger:
    _mark_nested(items)
    window = w1 - w0
    per_process: dict[int, list[_Item]] = {}
    for item in items:
        per_process.setdefault(item.p, []).append(item)
    for p in blocks.get(number, {}):
        per_process.setdefault(p, [])
    for p in stopped:
        per_process.setdefault(p, [])
    ends = sorted(items, key=lambda x: x.end)
    end_times = [x.end for x in ends]
    first = min(items + [_Item(-1, "", w0, w0, "")], key=lambda x: x.start).p
    last = ends[-1].p if ends else -1
    edge_p = {"start": first, "end": last}
    for p, (start, end) in blocks.get(number, {}).items():  # a step block may open or close the window
        if start <= w0:
            edge_p["start"] = p
        if end >= w1:
            edge_p["end"] = p

    def waited_for(p: int, g0: float, g1: float) -> Optional[_Item]:
        """The region of another process that ended last before ``g1`` (within the two's bound)."""
        reach = max((clock.pair_bound(p, q) for q in per_process if q != p), default=0.0)
        k = bisect.bisect_right(end_times, g1 + (reach if math.isfinite(reach) else 0.0))
        for index in range(k - 1, -1, -1):
            x = ends[index]
            if x.p == p:
                continue
            tol = clock.pair_bound(p, x.p)
            if not math.isfinite(tol):
                continue
            if x.end <= g1 + tol:
                return x if x.end >= g0 - tol else None
        return None

    rows: list[ProcessStep] = []
    gaps_of: dict[int, list[tuple[float, float, Optional[_Item], bool]]] = {}
    for p in sorted(per_process, key=lambda q: infos[q].name):
        mine = per_process[p]
        busy_by: dict[str, float] = {}
        for x in mine:
            busy_by[x.label] = busy_by.get(x.label, 0.0) + (x.end - x.start)
        merged = _union([(x.start, x.end) for x in mine if x.top])
        busy = sum(b - a for a, b in merged)
        gaps = []
        cursor = w0
        for a, b in merged + [(w1, w1)]:
            if a > cursor:
                gaps.append((cursor, a))
            cursor = max(cursor, b)
        error = 0.0
        listed = []
        found = []
        for g0, g1 in gaps:
            at_end = g1 >= w1
            if g0 <= w0:
                error += clock.pair_bound(p, edge_p["start"]) if edge_p["start"] >= 0 else 0.0
            if at_end:
                error += clock.pair_bound(p, edge_p["end"]) if edge_p["end"] >= 0 else 0.0
            cause = None if at_end else waited_for(p, g0, g1)
            found.append((g0, g1, cause, at_end))
            if g1 - g0 >= MIN_GAP_S:
                listed.append(
                    Gap(
                        start_s=g0 - w0,
                        seconds=g1 - g0,
                        waited_for=cause.label if cause else None,
                        waited_process=infos[cause.p].name if cause else None,
                        at_step_end=at_end,
                    )
                )
        gaps_of[p] = found
        listed = sorted(sorted(listed, key=lambda g: -g.seconds)[:MAX_GAPS_LISTED], key=lambda g: g.start_s)
        idle = max(window - busy, 0.0)
        rows.append(
            ProcessStep(
                process=infos[p].name,
                role=infos[p].role,
                busy_s=busy,
                busy_by_region=tuple(sorted(busy_by.items(), key=lambda kv: -kv[1])),
                idle_s=idle,
                idle_error_s=error,
                within_clock_error=idle <= error,
                gaps=tuple(listed),
                incomplete=p in stopped,
                bars=tuple((x.label, x.start - w0, x.end - w0) for x in sorted(mine, key=lambda x: x.start) if x.top),
            )
        )
    path = _critical_path(items, w0, gaps_of, infos)
    tails = _long_tails(items, infos, clock)
    role_idle = _role_idle(rows, gaps_of, infos, per_process, window)
    step = StepLedger(
        number=number,
        seconds=window,
        verdict="",
        processes=tuple(rows),
        critical_path=path,
        long_tails=tails,
        role_idle=role_idle,
    )
    return attrs.evolve(step, verdict=_verdict(step))


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            if b > merged[-1][1]:
                merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def _critical_path(
    items: list[_Item],
    w0: float,
    gaps_of: dict[int, list[tuple[float, float, Optional[_Item], bool]]],
    infos: list[ProcessInfo],
) -> tuple[PathEntry, ...]:
    """Back from the region that ended the step: each region's predecessor is what the gap
    before it waited for, else the region before it on its own process."""
    top = [x for x in items if x.top]
    if not top:
        return ()
    own: dict[int, list[_Item]] = {}
    for x in sorted(top, key=lambda x: x.end):
        own.setdefault(x.p, []).append(x)
    own_ends = {p: [x.end for x in xs] for p, xs in own.items()}
    current = max(top, key=lambda x: x.end)
    path = [current]
    for _ in range(len(top)):
        p = current.p
        gap = next((g for g in gaps_of.get(p, ()) if abs(g[1] - current.start) < 1e-9), None)
        before: Optional[_Item] = None
        # A gap too short to be a wait (back-to-back regions, or within the clock's error) is
        # not followed: the region before it on the same process is the predecessor.
        if gap is not None and gap[2] is not None and gap[2].end < current.end and gap[1] - gap[0] >= MIN_GAP_S:
            before = gap[2]
        else:
            k = bisect.bisect_right(own_ends[p], current.start + 1e-9) - 1
            while k >= 0 and own[p][k] is current:
                k -= 1
            if k >= 0 and own[p][k].end < current.end:
                before = own[p][k]
        if before is None or before in path:
            break
        path.append(before)
        current = before
    entries: list[PathEntry] = []
    for x in reversed(path):
        name = infos[x.p].name
        if entries and entries[-1].region == x.label and entries[-1].process == name:
            last = entries[-1]
            entries[-1] = attrs.evolve(last, seconds=last.seconds + x.end - x.start, end_s=x.end - w0)
        else:
            entries.append(
                PathEntry(region=x.label, process=name, seconds=x.end - x.start, start_s=x.start - w0, end_s=x.end - w0)
            )
    return tuple(entries[-MAX_PATH:])


def _long_tails(items: list[_Item], infos: list[ProcessInfo], clock: ClockEstimate) -> tuple[LongTail, ...]:
    ends: dict[str, dict[int, float]] = {}
    spent: dict[str, dict[int, float]] = {}
    for x in items:
        per = ends.setdefault(x.label, {})
        per[x.p] = max(per.get(x.p, -math.inf), x.end)
        took = spent.setdefault(x.label, {})
        took[x.p] = took.get(x.p, 0.0) + (x.end - x.start)
    tails = []
    for label, per in ends.items():
        if len(per) < 2:
            continue
        slowest = max(per, key=lambda p: per[p])
        others = [per[p] for p in per if p != slowest]
        past = per[slowest] - statistics.median(others)
        error = clock.bound(slowest) + max(clock.bound(p) for p in per if p != slowest)
        longer = spent[label][slowest] - statistics.median(v for p, v in spent[label].items() if p != slowest)
        if longer <= 0:  # it ended last only because it started late: not this phase's tail
            continue
        tails.append(
            LongTail(
                region=label,
                process=infos[slowest].name,
                past_median_s=past,
                longer_by_s=longer,
                others=len(others),
                within_clock_error=past <= error,
            )
        )
    return tuple(sorted(tails, key=lambda t: -t.past_median_s))


def _role_idle(
    rows: list[ProcessStep],
    gaps_of: dict[int, list[tuple[float, float, Optional[_Item], bool]]],
    infos: list[ProcessInfo],
    per_process: dict[int, list[_Item]],
    window: float,
) -> tuple[RoleIdle, ...]:
    by_role: dict[str, list[ProcessStep]] = {}
    for row in rows:
        by_role.setdefault(row.role, []).append(row)
    waited: dict[str, dict[str, float]] = {}
    waiting: dict[str, float] = {}
    for p, gaps in gaps_of.items():
        role = infos[p].role
        for g0, g1, cause, at_end in gaps:
            if not at_end:
                waiting[role] = waiting.get(role, 0.0) + (g1 - g0)
            if cause is not None:
                per = waited.setdefault(role, {})
                per[cause.label] = per.get(cause.label, 0.0) + (g1 - g0)
    result = []
    for role, members in by_role.items():
        idle = sum(r.idle_s for r in members) / len(members)
        causes = waited.get(role, {})
        result.append(
            RoleIdle(
                role=role,
                processes=len(members),
                idle_s=idle,
                waiting_s=waiting.get(role, 0.0) / len(members),
                share=idle / window if window > 0 else 0.0,
                waited_for=max(causes, key=lambda k: causes[k]) if causes else None,
                within_clock_error=all(r.within_clock_error for r in members),
                waited_for_s=max(causes.values(), default=0.0) / len(members),
            )
        )
    return tuple(sorted(result, key=lambda r: -r.share))


def format_seconds(value: float) -> str:
    """A duration for a sentence: ``12.4 s``, ``35.2 ms``, ``80 µs``.

    >>> format_seconds(12.43), format_seconds(0.0352), format_seconds(8e-05)
    ('12.4 s', '35.2 ms', '80 µs')
    """
    if not math.isfinite(value):
        return "?"
    if abs(value) >= 1:
        return f"{value:.1f} s"
    if abs(value) >= 0.001:
        return f"{value * 1000:.1f} ms"
    return f"{value * 1e6:.0f} µs"


def _verdict(step: StepLedger) -> str:
    """The step in one sentence: its length, the idlest role and what it waited for, the long tail."""
    parts = [f"step {step.number}: {format_seconds(step.seconds)}"]
    # The role that waited longest for something (idle after its own work, until the step's
    # end, is the other roles' doing: it shows as their long tail or critical path).
    waiting = [r for r in step.role_idle if not r.within_clock_error and r.waiting_s >= MIN_GAP_S]
    idle = max(waiting, key=lambda r: r.waiting_s, default=None)
    if idle is not None:
        who = f"{idle.role} ranks" if idle.processes > 1 else idle.role
        said = f"{who} idle {format_seconds(idle.idle_s)} ({idle.share:.0%})"
        if idle.waited_for is None or idle.waited_for_s < MIN_GAP_S:
            parts.append(f"{said} unexplained")
        elif idle.waited_for_s >= idle.idle_s / 2:  # the region accounts for most of it
            parts.append(f"{said} waiting for {idle.waited_for}")
        else:  # only part of it: say how much, never pin the whole idle time on one region
            parts.append(f"{said}, {format_seconds(idle.waited_for_s)} of it waiting for {idle.waited_for}")
    elif step.role_idle:
        parts.append("no process idle for longer than 1 ms and its clock error")
    # The tail of the phase that was itself slow there, not one that merely started late after it.
    tails = [
        t
        for t in step.long_tails
        if not t.within_clock_error and t.past_median_s >= MIN_GAP_S and t.longer_by_s >= MIN_GAP_S
    ]
    tail = max(tails, key=lambda t: (t.longer_by_s, t.past_median_s), default=None)
    if tail is not None:
        median = "the other" if tail.others == 1 else "the median of the others"
        parts.append(f"{tail.process} finished {tail.region} {format_seconds(tail.past_median_s)} after {median}")
    stopped = [p.process for p in step.processes if p.incomplete]
    if stopped:  # its log ends here: killed, or torn down (and its last half second lost) after another was
        parts.append(f"incomplete: {', '.join(s + chr(39) + 's' for s in stopped)} span log ends in this step")
    return "; ".join(parts)
