"""Finishing torch's exported JSON in place: whole, with spans, pointing at its final name.

torch writes ``{ <metadata>, "traceEvents": [ <events> ],"traceName": "<path>" }`` with the path
unescaped (a ``"`` in it makes the file invalid JSON) and naming the temporary file. Rewriting a
50 MB file to fix that would cost as much as the export, so only the tail is rewritten: the end
of the events array (where other threads' spans go) and the ``traceName`` key, written by us with
JSON escaping. A file whose head or tail does not look as torch writes it is parsed and rewritten
whole instead; one that does not parse at all is reported, never claimed complete.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..recording.spans import SpanLog

__all__ = ["TraceTailError", "finish_tail", "read_head", "set_trace_name"]


_HEAD_BYTES = 1 << 16
_MAX_HEAD_BYTES = 1 << 22  # metadata (deviceProperties, pg_config) bigger than this: parse all
_TAIL_BYTES = 1 << 16
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_TRACE_EVENTS = b'"traceEvents"'
_TRACE_NAME = b'"traceName"'


class TraceTailError(Exception):
    """The file is not a whole trace (cut short, invalid JSON); the message says what is wrong."""


def finish_tail(path: str, final_path: str, spans: SpanLog) -> int:
    """Check the trace at ``path`` is whole, add ``spans``, and set ``traceName`` to
    ``final_path``; returns the file's new size. Raises :class:`TraceTailError`."""
    try:
        with open(path, "r+b") as f:
            base_ns = _checked_head(f)
            tail_start, tail = _tail(f)
            end_of_events = _end_of_events(tail) if base_ns is not None else None
            if base_ns is None or end_of_events is None:
                return _rewrite_whole(f, final_path, spans)
            events = b"".join(b",\n" + event for event in spans.events(base_ns))
            f.seek(tail_start + end_of_events)
            f.write(events + _closing(final_path))
            f.truncate()
            return f.tell()
    except OSError as exc:
        raise TraceTailError(f"cannot finish the trace file: {exc.strerror or exc}") from None


def set_trace_name(path: str, final_path: str) -> int:
    """Point ``traceName`` at ``final_path`` in a trace :func:`finish_tail` already finished
    (another name was taken meanwhile); returns the file's size."""
    try:
        with open(path, "r+b") as f:
            tail_start, tail = _tail(f)
            key = tail.rfind(b"]," + _TRACE_NAME)
            if key < 0:
                raise TraceTailError("the trace's end is not the one written a moment ago")
            f.seek(tail_start + key + 1)
            f.write(_closing(final_path))
            f.truncate()
            return f.tell()
    except OSError as exc:
        raise TraceTailError(f"cannot rename the trace inside its file: {exc.strerror or exc}") from None


def _tail(f: Any) -> tuple[int, bytes]:
    """Where the file's last bytes start, and those bytes."""
    start = f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
    return start, f.read()


def _closing(final_path: str) -> bytes:
    # ensure_ascii: any character of the path (quote, backslash, newline, non-ASCII) is escaped.
    return b"]," + _TRACE_NAME + b": " + json.dumps(final_path).encode("ascii") + b"}\n"


def read_head(f: Any) -> tuple[bytes, int]:
    """The start of the trace file ``f`` (read from its position) up to past its ``"traceEvents"``
    key, and that key's offset in it (-1: not within the first 4 MiB, or not there)."""
    head = f.read(_HEAD_BYTES)
    events_key = head.find(_TRACE_EVENTS)
    while events_key < 0 and len(head) < _MAX_HEAD_BYTES:
        more = f.read(len(head))
        if not more:
            break
        head += more
        events_key = head.find(_TRACE_EVENTS)
    return head, events_key


def _checked_head(f: Any) -> Optional[int]:
    """The trace's base time when its top-level keys before ``traceEvents`` are valid JSON
    (torch writes metadata unescaped); None when the head does not look as torch writes it."""
    f.seek(0)
    head, events_key = read_head(f)
    base = _BASE_TIME.search(head, 0, events_key if events_key >= 0 else len(head))
    if events_key < 0 or base is None:
        return None
    try:
        json.loads(head[:events_key] + _TRACE_EVENTS + b": []}")
    except ValueError:
        return None
    return int(base.group(1))


def _end_of_events(tail: bytes) -> Optional[int]:
    """Where the ``]`` closing ``traceEvents`` is in ``tail``, once the last event and what
    follows were checked; None when the tail does not look as torch writes it."""
    # `...}\n  ],"traceName": "<path>" }`: the last "traceName" key follows the events' end.
    # The path is unescaped: search from the key, never parse what follows it.
    trace_name = tail.rfind(_TRACE_NAME)
    end = tail.rfind(b"]", 0, trace_name) if trace_name > 0 else -1
    if end <= 0 or tail[end + 1 : trace_name].strip() != b"," or not tail.rstrip().endswith(b"}"):
        return None
    events = tail[:end].rstrip()
    last_start = events.rfind(b"},")  # the end of the event before the last
    if not events.endswith(b"}") or last_start < 0:
        return None
    try:
        last = json.loads(events[last_start + 2 :])
    except ValueError:
        return None
    return end if isinstance(last, dict) else None


def _rewrite_whole(f: Any, final_path: str, spans: SpanLog) -> int:
    f.seek(0)
    try:
        trace = json.load(f)
    except ValueError as exc:  # cut short, or torch wrote something unescaped
        raise TraceTailError(f"torch wrote no complete, valid JSON trace ({exc})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise TraceTailError("torch wrote JSON that is not a Chrome trace")
    base_ns = int(trace.get("baseTimeNanoseconds") or 0)
    trace["traceEvents"].extend(json.loads(event) for event in spans.events(base_ns))
    trace["traceName"] = final_path
    f.seek(0)
    f.write(json.dumps(trace).encode("ascii"))
    f.truncate()
    return f.tell()
