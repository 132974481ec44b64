"""Region ranges filed as torch files user ranges, and the step range's time, read in one pass.

torch writes a ``record_function`` range with ``"cat": "user_annotation"``; the fast range that
regions use (docs/hot-path.md, "torch's fast range") comes out as ``"cat": "cpu_op"``, the
operators' category, so HolisticTraceAnalysis, Perfetto queries and users' scripts that look for
user annotations found no region. The writer files each region range as a user annotation in
torch's exported JSON, in place: the whitespace torch puts between an event's keys pays for the
longer category, so the file keeps its size and nothing else is rewritten. A layout without that
room is parsed and rewritten whole; one this pass does not recognise keeps ``cpu_op``, which the
readers still take for a region (traces written before this change have it too).

On the way it reads the ``ProfilerStep#<n>`` range's duration: the wall time the summary at exit
prints is then the one ``ls``, ``summarize`` and ``report`` read from the file; and, for the
spans a trace carries (:mod:`~torchstep_prof.writing.trace_timeline`), each range's thread,
start and duration, so the file is searched once.
"""

from __future__ import annotations

import json
import mmap
import re
from typing import IO, Collection, NamedTuple, Optional

__all__ = ["USER_CATEGORY", "Range", "mark_region_ranges"]


class Range(NamedTuple):
    """A range as torch exported it: its name, thread, start and duration (µs from the
    trace's ``baseTimeNanoseconds``)."""

    name: str
    tid: str
    ts: float
    dur: float


USER_CATEGORY = "user_annotation"
_STEP_RANGE = re.compile(  # the CPU range: a CUDA trace also holds a GPU copy (gpu_user_annotation)
    rb'"cat":\s*"(?:user_annotation|cpu_op)",\s*"name":\s*"ProfilerStep#(\d+)",\s*"pid":\s*[^,]*,\s*"tid":\s*([^,]*),\s*"ts":\s*([^,]*),\s*"dur":\s*([-+0-9.eE]+)'
)
# After a range's name, as torch writes it: its thread, start and duration (read, never rewritten).
_TIMES = rb'(?:(?=,\s*"pid":\s*[^,]*,\s*"tid":\s*([^,]*),\s*"ts":\s*([-+0-9.eE]+),\s*"dur":\s*([-+0-9.eE]+)))?'


def mark_region_ranges(
    path: str, names: Collection[str], step: int, ranges: Optional[list[Range]] = None
) -> Optional[float]:
    """File the ranges named ``names`` in the trace at ``path`` as user annotations; returns
    the duration of its ``ProfilerStep#<step>`` range in seconds (None when it has none).
    ``ranges``, when given, gets each of those ranges and the step range (in file order).

    ``names`` are region range names as torch wrote them (ASCII, no quote or backslash).
    Raises ``OSError`` when the file cannot be read or written.
    """
    found: list[Range] = []
    with open(path, "r+b") as f:
        if f.seek(0, 2) == 0:
            return None
        with mmap.mmap(f.fileno(), 0) as body:
            seconds = _step_seconds(body, step, found)
            if names and not _patch_in_place(body, names, found):
                body.close()
                found.clear()
                whole = _rewrite_whole(f, names, step, found)
                seconds = whole if whole is not None else seconds
            else:
                body.flush()
    if ranges is not None:
        ranges.extend(found)
    return seconds


def _ranges(names: Collection[str]) -> re.Pattern[bytes]:
    alternatives = b"|".join(re.escape(n.encode("ascii", "replace")) for n in sorted(names, key=len, reverse=True))
    return re.compile(rb'"ph":\s*"X",\s*"cat":\s*"cpu_op",\s*"name":\s*("(?:' + alternatives + rb')")' + _TIMES)


_HEAD = b'"ph":"X",'
_CATEGORY = b'"cat":"' + USER_CATEGORY.encode("ascii") + b'",'


def _patch_in_place(body: mmap.mmap, names: Collection[str], found: list[Range]) -> bool:
    """Rewrite each region range's category where it stands, the keys in their order and the
    whitespace between them giving up the room; False (nothing written) when a range has too
    little whitespace to take the longer name. Each range's times go to ``found``."""
    replacements = []
    for match in _ranges(names).finditer(body):
        _found(found, match.group(1)[1:-1], match.group(2), match.group(3), match.group(4))
        compact = _CATEGORY + b'"name":' + match.group(1)
        room = len(match.group()) - len(_HEAD) - len(compact)
        if room < 0:
            return False
        padding = b"\n" + b" " * (room - 1) if room else b""
        replacements.append((match.start(), _HEAD + padding + compact))
    for start, new in replacements:
        body[start : start + len(new)] = new
    return True


def _found(found: list[Range], name: bytes, tid: Optional[bytes], ts: Optional[bytes], dur: Optional[bytes]) -> None:
    if tid is None or ts is None or dur is None:
        return  # a layout this pass does not read: the range is filed, its times are not kept
    try:
        found.append(
            Range(name.decode("ascii", "replace"), tid.strip(b' "').decode("ascii", "replace"), float(ts), float(dur))
        )
    except ValueError:
        pass


def _step_seconds(body: mmap.mmap, step: int, found: list[Range]) -> Optional[float]:
    seen = None
    for match in _STEP_RANGE.finditer(body):
        if seen is None or int(match.group(1)) == step:
            seen = match
            if int(match.group(1)) == step:
                _found(found, b"ProfilerStep#" + match.group(1), match.group(2), match.group(3), match.group(4))
                break
    try:
        return float(seen.group(4)) / 1e6 if seen is not None else None
    except ValueError:
        return None


def _rewrite_whole(f: IO[bytes], names: Collection[str], step: int, found: list[Range]) -> Optional[float]:
    """The file parsed, its region ranges re-filed and written back whole (a layout with no room
    to patch in place); the file is left as it was when it does not parse."""
    f.seek(0)
    try:
        trace = json.load(f)
    except ValueError:  # torch wrote something unescaped: the tail's checks report it
        return None
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return None
    wanted = set(names)
    seconds = None
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        if event.get("cat") == "cpu_op" and event.get("name") in wanted:
            event["cat"] = USER_CATEGORY
            _found_event(found, event)
        if event.get("name") == f"ProfilerStep#{step}" and isinstance(event.get("dur"), (int, float)):
            seconds = event["dur"] / 1e6
            _found_event(found, event)
    f.seek(0)
    f.write(json.dumps(trace).encode("ascii"))
    f.truncate()
    return seconds


def _found_event(found: list[Range], event: dict) -> None:
    ts, dur = event.get("ts"), event.get("dur")
    if isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and not isinstance(ts, bool):
        found.append(Range(str(event.get("name")), str(event.get("tid")), float(ts), float(dur)))
