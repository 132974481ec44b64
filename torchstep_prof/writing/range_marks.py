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
prints is then the one ``ls``, ``summarize`` and ``report`` read from the file.
"""

from __future__ import annotations

import json
import mmap
import re
from typing import IO, Collection, Optional

__all__ = ["USER_CATEGORY", "mark_region_ranges"]

USER_CATEGORY = "user_annotation"
_WIDER = len(USER_CATEGORY) - len("cpu_op")  # bytes the whitespace must give up per range
_STEP_RANGE = re.compile(  # the CPU range: a CUDA trace also holds a GPU copy (gpu_user_annotation)
    rb'"cat":\s*"(?:user_annotation|cpu_op)",\s*"name":\s*"ProfilerStep#(\d+)",\s*"pid":\s*[^,]*,\s*"tid":\s*[^,]*,\s*"ts":\s*[^,]*,\s*"dur":\s*([-+0-9.eE]+)'
)


def mark_region_ranges(path: str, names: Collection[str], step: int) -> Optional[float]:
    """File the ranges named ``names`` in the trace at ``path`` as user annotations; returns
    the duration of its ``ProfilerStep#<step>`` range in seconds (None when it has none).

    ``names`` are region range names as torch wrote them (ASCII, no quote or backslash).
    Raises ``OSError`` when the file cannot be read or written.
    """
    with open(path, "r+b") as f:
        if f.seek(0, 2) == 0:
            return None
        with mmap.mmap(f.fileno(), 0) as body:
            seconds = _step_seconds(body, step)
            if names and not _patch_in_place(body, names):
                body.close()
                whole = _rewrite_whole(f, names, step)
                return whole if whole is not None else seconds
            body.flush()
    return seconds


def _ranges(names: Collection[str]) -> re.Pattern[bytes]:
    alternatives = b"|".join(re.escape(n.encode("ascii", "replace")) for n in sorted(names, key=len, reverse=True))
    return re.compile(rb'"ph":\s*"X",\s*"cat":\s*"cpu_op",\s*"name":\s*("(?:' + alternatives + rb')")')


_HEAD = b'"ph":"X",'
_CATEGORY = b'"cat":"' + USER_CATEGORY.encode("ascii") + b'",'


def _patch_in_place(body: mmap.mmap, names: Collection[str]) -> bool:
    """Rewrite each region range's category where it stands, the keys in their order and the
    whitespace between them giving up the room; False (nothing written) when a range has too
    little whitespace to take the longer name."""
    replacements = []
    for match in _ranges(names).finditer(body):
        compact = _CATEGORY + b'"name":' + match.group(1)
        room = len(match.group()) - len(_HEAD) - len(compact)
        if room < 0:
            return False
        padding = b"\n" + b" " * (room - 1) if room else b""
        replacements.append((match.start(), _HEAD + padding + compact))
    for start, new in replacements:
        body[start : start + len(new)] = new
    return True


def _step_seconds(body: mmap.mmap, step: int) -> Optional[float]:
    found = None
    for match in _STEP_RANGE.finditer(body):
        if found is None or int(match.group(1)) == step:
            found = match.group(2)
            if int(match.group(1)) == step:
                break
    try:
        return float(found) / 1e6 if found is not None else None
    except ValueError:
        return None


def _rewrite_whole(f: IO[bytes], names: Collection[str], step: int) -> Optional[float]:
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
        if event.get("name") == f"ProfilerStep#{step}" and isinstance(event.get("dur"), (int, float)):
            seconds = event["dur"] / 1e6
    f.seek(0)
    f.write(json.dumps(trace).encode("ascii"))
    f.truncate()
    return seconds
