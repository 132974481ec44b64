"""The spans a written trace carries for the timeline: its regions, step and anchors on the wall clock.

``torchstep-prof timeline`` reads span files (``tsp.spans``) or, for the steps that were traced,
the traces themselves, with the span log off as well as on. So the writer puts the process's
spans for the trace's window under the trace's ``torchstep_prof`` key, as ``timeline``, in the
span file's shapes (:mod:`torchstep_prof.timeline.span_log`)::

    "torchstep_prof": {"role": ..., "step": 7, ...,
      "timeline": {"format": 1, "host": "node3", "pid": 4242, "rank": 0, "world_size": 2,
                   "local_rank": 0, "spans": [["actor", "update", 1796470372.640406, 1796470372.64084, "4242"]],
                   "steps": [[7, 1796470372.640365, 1796470372.64087]], "anchors": []}}

The source is what the trace already holds: the region ranges torch recorded (``ts`` counts µs
from ``baseTimeNanoseconds``: torch's monotonic clock turned into Unix time with one offset
taken when its profiler starts, as the span log turns ``perf_counter`` into wall time), the
``ProfilerStep#<n>`` range, the spans of other threads and tasks (wall nanoseconds), and the
clock anchors and the sides of Ray calls noted since the process's previous trace (the span
log's conversion, :func:`~torchstep_prof.timeline.wall_clock.to_wall`).

The ranges come from the pass :mod:`~torchstep_prof.writing.range_marks` makes over the
exported file anyway (one search of the file); inserting the key rewrites the head, torch's
metadata, ahead of the events, which costs a copy of the file (``copy_file_range``: in the
kernel, no Python loop).
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any, Collection, Optional

from ..naming import METADATA_KEY
from .range_marks import Range
from .trace_tail import read_head

__all__ = ["FORMAT", "TIMELINE_KEY", "embed_timeline", "process_identity", "trace_timeline"]

TIMELINE_KEY = "timeline"
"""The key under the trace's ``torchstep_prof`` object holding its spans."""
FORMAT = 1
_METADATA = re.compile(rb'"' + METADATA_KEY.encode("ascii") + rb'"\s*:\s*')
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def trace_timeline(
    path: str,
    ranges: Collection[Range],
    labels: dict[str, tuple[str, str]],
    thread_spans: Collection[tuple[str, int, int, int]],
    anchors: Collection[tuple[str, int, float, float]],
    identity: dict[str, Any],
    ray: Collection[tuple[str, str, float, float]] = (),
) -> Optional[dict[str, Any]]:
    """The ``timeline`` object of the exported trace at ``path``, from the ``ranges``
    :func:`~torchstep_prof.writing.range_marks.mark_region_ranges` found in it: ``labels`` maps
    each region range name to its (role, stage) (the step range, ``ProfilerStep#<n>``, gives the
    step); ``thread_spans`` are other threads' (range name, tid, start ns, end ns); ``anchors``
    (name, seq, start, end) in wall seconds, those passed since the process's previous trace
    (anchors align clocks whatever step they are in: each goes in one trace); ``identity`` the
    process's host, pid, rank...; ``ray`` (task, what, start, end) in wall seconds, the sides of
    Ray calls noted since the previous trace (``torchstep_prof.integrations.ray``), under ``ray``
    when there are some. None when the file has no base time (not as torch writes it)."""
    with open(path, "rb") as f:
        head, events_key = read_head(f)
    base = _BASE_TIME.search(head, 0, events_key if events_key >= 0 else len(head))
    if base is None:
        return None
    base_s = int(base.group(1)) / 1e9
    spans: list[list[Any]] = []
    steps: list[list[Any]] = []
    for r in ranges:
        start = base_s + r.ts / 1e6
        end = start + r.dur / 1e6
        if r.name.startswith("ProfilerStep#"):
            steps.append([int(r.name[len("ProfilerStep#") :]), round(start, 6), round(end, 6)])
        else:
            role, stage = labels.get(r.name) or _split(r.name)
            spans.append([role, stage, round(start, 6), round(end, 6), r.tid])
    for name, tid, start_ns, end_ns in thread_spans:
        role, stage = labels.get(name) or _split(name)
        spans.append([role, stage, round(start_ns / 1e9, 6), round(end_ns / 1e9, 6), str(tid)])
    kept = [[n, q, round(a, 6), round(b, 6)] for n, q, a, b in anchors]
    timeline = {"format": FORMAT, **identity, "spans": spans, "steps": steps, "anchors": kept}
    if ray:
        timeline["ray"] = [[task, what, round(a, 6), round(b, 6)] for task, what, a, b in ray]
    return timeline


def _split(name: str) -> tuple[str, str]:
    role, _, stage = name.partition("/")
    return role, stage


def process_identity(
    rank: int, world_size: int, local_rank: Optional[int], process_role: Optional[str]
) -> dict[str, Any]:
    """The process's identity as a span file's first line gives it."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "process_role": process_role,
    }


def embed_timeline(path: str, work_path: str, timeline: dict[str, Any]) -> bool:
    """Add ``timeline`` under the ``torchstep_prof`` key of the trace at ``path`` (its metadata,
    before ``traceEvents``), writing the result through ``work_path`` (a free name in the same
    private folder) and moving it over ``path``. False, the file untouched, when its head does
    not look as torch writes it."""
    with open(path, "rb") as f:
        head, events_key = read_head(f)
        if events_key < 0:
            return False
        found = _METADATA.search(head, 0, events_key)
        if found is None:
            return False
        # latin-1 maps bytes to characters one to one: the decoder's index is the byte offset.
        try:
            metadata, end = json.JSONDecoder().raw_decode(head[:events_key].decode("latin-1"), found.end())
        except ValueError:
            return False
        if not isinstance(metadata, dict):
            return False
        metadata[TIMELINE_KEY] = timeline
        new = json.dumps(metadata, separators=(",", ":"), allow_nan=False).encode("ascii")
        fd = os.open(work_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, head[: found.end()] + new)
            f.seek(end)
            _copy_rest(f.fileno(), fd)
        finally:
            os.close(fd)
    os.replace(work_path, path)
    return True


def _copy_rest(source: int, target: int) -> None:
    """Copy ``source`` from its position to its end onto ``target``, in the kernel where it can."""
    copy = getattr(os, "copy_file_range", None)
    if copy is not None:
        try:
            while copy(source, target, 1 << 30):
                pass
            return
        except OSError:  # another file system, an old kernel: copied in Python below
            pass
    while True:
        chunk = os.read(source, 1 << 20)
        if not chunk:
            return
        os.write(target, chunk)
