"""Reading the events of a Chrome trace: wall time, region ranges, operators by self time.

Operators are ranked for the whole trace and, in the same pass, for each region range they run in
(a fused trace holds every region of its step).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator, Sequence, Tuple

import attrs

__all__ = [
    "OP_CATEGORIES",
    "OpTime",
    "RegionRange",
    "absurd_times",
    "is_operator",
    "iter_events",
    "op_stats_by_region",
    "outer_ranges",
    "ranked_ops",
    "region_ranges",
    "region_time",
    "top_ops",
    "top_ops_by_region",
]

_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")

OP_CATEGORIES = frozenset({"cpu_op", "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver"})
"""Event categories counted as operators by :func:`top_ops` (not ranges nor Python frames)."""


def is_operator(name: str, cat: str) -> bool:
    """Whether an event counts in :func:`top_ops`.

    Region ranges (``<role>/<stage>``) are user annotations; in traces written before the
    writer re-filed them (writing/range_marks.py) they are under ``cpu_op``, like a real
    operator, and are told apart by their name: a ``/`` and no ``::`` (every ATen, c10d or
    autograd operator has a namespace).
    """
    return cat in OP_CATEGORIES and not (cat == "cpu_op" and "/" in name and "::" not in name)


@attrs.frozen(kw_only=True)
class OpTime:
    """An operator's total self time in one trace, in milliseconds."""

    name: str
    self_ms: float


GPU_ANNOTATION = "gpu_user_annotation"
"""With CUDA activity, Kineto copies each ``record_function`` range (``ProfilerStep#<n>`` too)
onto the GPU's timeline under this category, spanning the kernels launched inside it: not the
region's wall time, which is the CPU range's."""


def region_time(events: list[Any], step: int) -> tuple[float, float | None]:
    """(wall ms, start µs relative to the base time) of the ``ProfilerStep#<step>`` range (the
    CPU's, never its GPU copy), else of every complete event together (torch's own
    profiler-span rows aside)."""
    chosen = None
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X" or event.get("cat") == GPU_ANNOTATION:
            continue
        match = _PROFILER_STEP.match(str(event.get("name", "")))
        dur, ts = time_us(event.get("dur"), duration=True), time_us(event.get("ts"))
        if match and dur is not None and ts is not None:
            if chosen is None or int(match[1]) == step:
                chosen = event
                if int(match[1]) == step:
                    break
    if chosen is not None:
        return float(chosen["dur"]) / 1000.0, float(chosen["ts"])
    first = last = None
    for event in events:
        if not isinstance(event, dict) or event.get("cat") == "Trace":
            continue
        ts = time_us(event.get("ts"))
        if ts is None or event.get("ph") == "M":
            continue
        end = ts + (time_us(event.get("dur"), duration=True) or 0.0)
        first = ts if first is None else min(first, ts)
        last = end if last is None else max(last, end)
    if first is None or last is None:
        return 0.0, None
    return (last - first) / 1000.0, first


MAX_TIME_US = 1e17
"""Times past this many microseconds (3000 years) are corrupt values, ignored like missing ones:
a ``ts`` of 1e300 must not make a region last 1e297 ms."""


def time_us(value: Any, *, duration: bool = False) -> float | None:
    """A time in µs that makes sense: finite, within :data:`MAX_TIME_US`, and >= 0 for a
    duration; None for anything else (a string, NaN, a negative duration...)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    if not math.isfinite(number) or abs(number) > MAX_TIME_US or (duration and number < 0):
        return None
    return number


def absurd_times(events: list[Any]) -> tuple[int, str]:
    """How many events carry a ``ts`` or ``dur`` that is a number but no time (past
    :data:`MAX_TIME_US`, NaN, infinite), and the first one in words (``""`` when none).

    Such a file is corrupt: read around, its region would show as a 0.0 ms row. A negative
    duration is ignored like a missing one, not counted here.

    >>> absurd_times([{"ph": "X", "name": "aten::mm", "ts": 1e300, "dur": 1}])
    (1, "'aten::mm' ts=1e+300")
    """
    count, first = 0, ""
    for event in events:
        if not isinstance(event, dict):
            continue
        for key in ("ts", "dur"):
            value = event.get(key)
            if type(value) is float or type(value) is int:
                if -MAX_TIME_US <= value <= MAX_TIME_US:  # NaN fails this too
                    continue
                count += 1
                if not first:
                    if isinstance(value, int):
                        shown = "a huge integer"
                    else:
                        shown = f"{value:.3g}" if math.isfinite(value) else "not finite"
                    first = f"{str(event.get('name', ''))[:60]!r} {key}={shown}"
                break
    return count, first


@attrs.frozen(kw_only=True)
class RegionRange:
    """A region range (``<role>/<stage>``, the raw label) of a trace: its track, its start
    (``ts``, µs) and its duration (µs)."""

    name: str
    track: Any
    ts: float
    dur: float


def region_ranges(events: list[Any]) -> list[RegionRange]:
    """The region ranges in ``events`` (``user_annotation`` ranges and spans; ``cpu_op`` ones in
    traces written before the writer re-filed them), in trace order; those with absurd times are
    left out."""
    found = []
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        name, cat = event.get("name"), event.get("cat")
        if isinstance(name, str) and cat in ("cpu_op", "user_annotation") and _is_region(name):
            ts, dur = time_us(event.get("ts")), time_us(event.get("dur"), duration=True)
            if ts is not None and dur is not None:
                track = (event.get("pid"), event.get("tid"))
                found.append(RegionRange(name=name, track=repr(track), ts=ts, dur=dur))
    return found


def outer_ranges(ranges: Sequence[RegionRange], start_us: float, end_us: float) -> list[RegionRange]:
    """The outermost of ``ranges`` on each track (a nested region is inside its parent's bar),
    cut to ``[start_us, end_us]`` (the owning block), in order of start."""
    tracks: dict[Any, list[RegionRange]] = {}
    for r in ranges:
        tracks.setdefault(r.track, []).append(r)
    outer = []
    for _, mine in sorted(tracks.items()):
        mine.sort(key=lambda r: (r.ts, -r.dur))
        end = -math.inf
        for r in mine:
            if r.ts < end:  # nested in (or overlapping) the range kept before it
                continue
            end = r.ts + r.dur
            first, last = max(r.ts, start_us), min(end, end_us)
            if last > first or (r.dur == 0 and start_us <= r.ts <= end_us):
                outer.append(attrs.evolve(r, ts=first, dur=max(0.0, last - first)))
    outer.sort(key=lambda r: (r.ts, r.name))
    return outer


def _is_region(name: str) -> bool:
    return "/" in name and "::" not in name and not name.startswith("ProfilerStep#")


def top_ops(trace: dict[str, Any], n: int) -> Tuple[OpTime, ...]:
    """The ``n`` operators with the most self time in ``trace``, summed over calls.

    An event's self time is its duration minus the durations of the events directly nested in
    it on the same pid/tid. Only operator-like events count (``cpu_op``, GPU kernels, memcpy /
    memset, CUDA runtime calls): not ranges (``user_annotation``, region ranges) nor Python
    frames.
    """
    return top_ops_by_region(trace, n, by_region=False)[0]


def top_ops_by_region(
    trace: dict[str, Any], n: int, *, by_region: bool = True
) -> tuple[Tuple[OpTime, ...], dict[str, Tuple[OpTime, ...]]]:
    """:func:`top_ops` of the whole trace and, in the same pass, of each region range: the
    ``n`` operators with the most self time directly or indirectly inside a ``<role>/<stage>``
    range (the innermost one, on the same thread), keyed by the range's raw label.

    Operators of other tracks (GPU kernels on their streams) count for the whole trace only: a
    kernel is not nested in the CPU range that launched it.
    """
    if n <= 0:
        return (), {}
    totals: dict[str, float] = {}
    regions: dict[str, dict[str, float]] = {}
    for name, us, region in _operator_times(trace, by_region):
        totals[name] = totals.get(name, 0.0) + us
        if region is not None:
            ops = regions.setdefault(region, {})
            ops[name] = ops.get(name, 0.0) + us
    return ranked_ops(totals, n), {region: ranked_ops(ops, n) for region, ops in regions.items()}


def _operator_times(trace: dict[str, Any], by_region: bool) -> Iterator[tuple[str, float, str | None]]:
    """(name, self µs, innermost region range or None) of each operator event of ``trace``."""
    for rows in _thread_rows(trace).values():
        # Parents before children: earlier start first, and the longer of two that start together.
        rows.sort(key=lambda row: (row[0], -row[1]))
        self_us, inside = _self_times(rows, by_region)
        for (_, _, name, cat), us, region in zip(rows, self_us, inside):
            if is_operator(name, cat):
                yield name, us, region


def _thread_rows(trace: dict[str, Any]) -> dict[Any, list[tuple[float, float, str, str]]]:
    """The complete events of ``trace`` with sane times, as (ts, dur, name, cat) per pid/tid."""
    threads: dict[Any, list[tuple[float, float, str, str]]] = {}
    numbers = (int, float)  # exact types: bool is not a time
    for event in iter_events(trace):
        if event.get("ph") != "X":
            continue
        # Any: the checks below narrow them (an exact-type test mypy cannot follow, kept for speed).
        ts: Any = event.get("ts")
        dur: Any = event.get("dur")
        # The common case without a call: plain, sane numbers (NaN fails the comparisons).
        if not (
            type(ts) in numbers
            and type(dur) in numbers
            and -MAX_TIME_US <= ts <= MAX_TIME_US
            and 0 <= dur <= MAX_TIME_US
        ):
            ts, dur = time_us(ts), time_us(dur, duration=True)
            if ts is None or dur is None:
                continue
        key = (event.get("pid"), event.get("tid"))
        try:
            rows = threads.get(key)
        except TypeError:  # an unhashable id (a list): its text names the track
            key = (repr(key[0]), repr(key[1]))
            rows = threads.get(key)
        if rows is None:
            rows = threads[key] = []
        name, cat = event.get("name", ""), event.get("cat", "")
        rows.append((ts, dur, name if type(name) is str else str(name), cat if type(cat) is str else str(cat)))
    return threads


def op_stats_by_region(trace: dict[str, Any]) -> dict[str | None, dict[str, list[float]]]:
    """Every operator's self time (µs) and call count, per innermost region range it ran in
    (keyed by the range's raw label; ``None``: outside any region range, GPU streams included).

    >>> trace = {"traceEvents": [
    ...     {"ph": "X", "name": "a/b", "cat": "cpu_op", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
    ...     {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 4, "pid": 1, "tid": 1}]}
    >>> op_stats_by_region(trace)
    {'a/b': {'aten::mm': [4.0, 1]}}
    """
    stats: dict[str | None, dict[str, list[float]]] = {}
    for name, us, region in _operator_times(trace, True):
        entry = stats.setdefault(region, {}).setdefault(name, [0.0, 0])
        entry[0] += us
        entry[1] += 1
    return stats


def ranked_ops(totals: dict[str, float], n: int, divisor: float = 1000.0) -> Tuple[OpTime, ...]:
    """The ``n`` largest of ``totals`` (name: time), largest first then by name, each divided by
    ``divisor`` (µs to ms by default)."""
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:n]
    return tuple(OpTime(name=name, self_ms=total / divisor) for name, total in ranked)


def _self_times(rows: Sequence[tuple[float, float, str, str]], by_region: bool) -> tuple[list[float], list[str | None]]:
    """Each row's self time, and (``by_region``) the innermost region range it is in."""
    self_us = [dur for _, dur, _, _ in rows]
    inside: list[str | None] = [None] * len(rows)
    stack: list[tuple[int, float]] = []  # (index, end) of the open ancestors
    for i, (ts, dur, name, cat) in enumerate(rows):
        while stack and stack[-1][1] <= ts:
            stack.pop()
        if stack:
            self_us[stack[-1][0]] -= dur
            if by_region:
                inside[i] = inside[stack[-1][0]]
        if by_region and cat in ("cpu_op", "user_annotation") and _is_region(name):
            inside[i] = name
        stack.append((i, ts + dur))
    return [max(0.0, us) for us in self_us], inside


def iter_events(trace: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The trace's events that are JSON objects (anything else in ``traceEvents`` is skipped)."""
    for event in trace.get("traceEvents") or ():
        if isinstance(event, dict):
            yield event
