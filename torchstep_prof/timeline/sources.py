"""Where the timeline's spans come from: a folder's span files, else the spans its traces carry.

:func:`read_timeline_folder` reads the span files (:mod:`~torchstep_prof.timeline.reading`),
which cover every step, and only when there are none, the traces. A trace written by
torchstep_prof carries its process's spans for its window (the writer's
:mod:`~torchstep_prof.writing.trace_timeline`), so a folder of traces gives the ledger of the
traced steps with no span log. Only each file's head is read (torch's metadata, before
``traceEvents``): never the events, however big the trace. Files are opened without blocking
or following links, and each head is capped; a file that is not a trace, or a trace without
spans (written before traces carried them, or by another tool), is skipped and counted.

>>> folder = read_trace_folder("/nonexistent")
>>> folder.processes, folder.problems[0].startswith("/nonexistent")
((), True)
"""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
from typing import Any, Optional

import attrs

from ..naming import METADATA_KEY, TRACE_SUFFIXES
from .reading import (
    MAX_FILES,
    ProcessSpans,
    SpanFolder,
    _int,
    _text,
    newest_run,
    parse_items,
    read_span_folder,
)

__all__ = ["MAX_HEAD_BYTES", "read_timeline_folder", "read_trace_folder", "trace_files"]

MAX_HEAD_BYTES = 16 << 20
"""A trace's metadata (its head, decompressed) bigger than this is not read."""
_CHUNK = 1 << 16
_TRACE_EVENTS = b'"traceEvents"'
_METADATA = re.compile(rb'"' + METADATA_KEY.encode("ascii") + rb'"\s*:\s*')
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)


def read_timeline_folder(folder: str) -> SpanFolder:
    """The spans of ``folder``: its span files when it holds any (they cover every step), else
    the spans its traces carry (the traced steps; :func:`read_trace_folder`).

    >>> read_timeline_folder("/nonexistent").source
    'span files'
    """
    spans = read_span_folder(folder)
    try:
        traces = len(trace_files(folder))
    except OSError:
        traces = 0
    if spans.processes or not traces:
        if spans.processes and traces:
            note = (
                f"{folder} holds span files and {traces} trace{'s' if traces != 1 else ''}: "
                "the span files are read (they cover every step, the traces only the traced ones)"
            )
            return attrs.evolve(spans, note=note if spans.note is None else f"{spans.note}; {note}")
        return spans
    from_traces = read_trace_folder(folder)
    return attrs.evolve(from_traces, source="traces", problems=spans.problems + from_traces.problems)


def trace_files(folder: str) -> list[str]:
    """The names of the trace files in ``folder`` (not its subfolders). Raises ``OSError``."""
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if e.name.endswith(TRACE_SUFFIXES))


def read_trace_folder(folder: str) -> SpanFolder:
    """The spans of every trace in ``folder`` that carries them, one process per host and pid."""
    try:
        names = trace_files(folder)
    except OSError as exc:
        return SpanFolder(processes=(), problems=(f"{folder}: cannot be listed ({exc.strerror or exc})",))
    problems: list[str] = []
    if len(names) > MAX_FILES:
        problems.append(f"{folder}: {len(names)} traces; only the first {MAX_FILES} are read")
        names = names[:MAX_FILES]
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    without = 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            timeline = _timeline_of(path)
        except (OSError, EOFError, ValueError, RecursionError) as exc:  # BadGzipFile is an OSError
            problems.append(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}; skipped)")
            continue
        if timeline is None:
            without += 1
            continue
        try:
            _merge(merged, path, timeline)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append(
                f"{path}: its spans are not of the right shape ({type(exc).__name__}: {str(exc)[:80]}; skipped)"
            )
    if without:
        problems.append(
            f"{folder}: {without} trace{'s' if without != 1 else ''} without spans "
            "(written before traces carried them, or not by torchstep_prof)"
        )
    kept, note = newest_run([_process(m) for m in merged.values()], folder)
    return SpanFolder(processes=kept, problems=tuple(problems), note=note)


def _timeline_of(path: str) -> Optional[dict[str, Any]]:
    """The ``torchstep_prof.timeline`` object of the trace at ``path``, or None."""
    fd = os.open(path, _FLAGS)
    with open(fd, "rb") as raw:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        stream: Any = gzip.GzipFile(fileobj=raw) if path.endswith(".gz") else raw
        head = b""
        while _TRACE_EVENTS not in head:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            head += chunk
            if len(head) > MAX_HEAD_BYTES:
                raise ValueError(f"no trace events in its first {MAX_HEAD_BYTES} bytes")
    end = head.find(_TRACE_EVENTS)
    found = _METADATA.search(head, 0, end if end >= 0 else len(head))
    if found is None:
        return None
    metadata, _ = json.JSONDecoder().raw_decode(head.decode("latin-1"), found.end())
    timeline = metadata.get("timeline") if isinstance(metadata, dict) else None
    return timeline if isinstance(timeline, dict) else None


def _merge(merged: dict[tuple[str, int], dict[str, Any]], path: str, timeline: dict[str, Any]) -> None:
    spans, steps, anchors, ray = parse_items(timeline, "trace")
    key = (_text(timeline["host"]), _int(timeline["pid"]))
    process = merged.setdefault(
        key,
        {"path": path, "header": timeline, "spans": set(), "steps": {}, "anchors": set(), "ray": set()},
    )
    process["spans"].update(spans)
    process["anchors"].update(anchors)
    process["ray"].update(ray)
    for block in steps:  # each trace of a step adds to its block: the process's extent in the step
        known = process["steps"].get(block.number)
        process["steps"][block.number] = (
            block
            if known is None
            else known._replace(start=min(known.start, block.start), end=max(known.end, block.end))
        )


def _process(merged: dict[str, Any]) -> ProcessSpans:
    header = merged["header"]

    def optional(key: str) -> Optional[int]:
        value = header.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    role = header.get("process_role")
    return ProcessSpans(
        path=merged["path"],
        host=_text(header["host"]),
        pid=_int(header["pid"]),
        rank=optional("rank"),
        world_size=optional("world_size"),
        process_role=role[:200] if isinstance(role, str) else None,
        spans=tuple(sorted((s for s in merged["spans"] if s.end >= s.start), key=lambda s: s.start)),
        steps=tuple(sorted((b for b in merged["steps"].values() if b.end >= b.start), key=lambda b: b.start)),
        anchors=tuple(sorted((a for a in merged["anchors"] if a.end >= a.start), key=lambda a: (a.name, a.seq))),
        ray=tuple(sorted((r for r in merged["ray"] if r.end >= r.start), key=lambda r: r.start)),
        ended=True,  # a trace is written once its window closed: no step of it is cut short
    )
