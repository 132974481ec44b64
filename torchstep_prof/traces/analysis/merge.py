"""Merging traces: every input file becomes one process track of a single Chrome trace.

Tracks are named ``<role>/<stage> rank <r> step <n>`` (`` #k`` appended for occurrence k >= 2)
and sorted by step, role, stage, occurrence and rank,
so all ranks of a region sit side by side on one timeline. Inputs are aligned on wall-clock time:
an event's ``ts`` is relative to its own file's ``baseTimeNanoseconds``, so each file is shifted
by the difference between its base and the earliest one, which becomes the output's base. Given
the job's clocks from its span files (:mod:`.span_clocks`), a trace whose process has an
estimated offset is first moved onto the job's reference clock (its base minus the offset); one
without keeps its own clock, and the output's metadata says which is which.

Every pid of an input (torch writes string pids such as ``"Spans"``, ``"Traces"`` and ``""`` next
to the process id) maps to its track's pid, and the inputs' own process metadata is replaced, so
tracks never mix. Thread ids stay as they were within a track. Flow and async ids are made unique
per input so arrows still join the events they joined before.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import secrets
from typing import Any, Iterable, Iterator, Optional

import attrs

from ..reading._json import dumps
from .span_clocks import JobClocks, TraceClock
from ..reading.files import TraceInfo, TraceReadError, iter_events, load_trace, read_trace_info

__all__ = ["MergeResult", "MergedTrack", "merge_traces", "track_label"]

# Process-level metadata of the inputs; the merge writes its own per track.
_PROCESS_METADATA = frozenset({"process_name", "process_labels", "process_sort_index"})
_ID_KEYS = ("id", "bind_id")


@attrs.frozen(kw_only=True)
class MergedTrack:
    """One input of a merge: its file, the pid of its track, and the track's name."""

    path: str
    pid: int
    label: str


@attrs.frozen(kw_only=True)
class MergeResult:
    """What :func:`merge_traces` wrote."""

    path: str
    tracks: tuple[MergedTrack, ...]
    events: int
    skipped: tuple[tuple[str, str], ...] = ()  # (path, reason) of inputs left out
    clocks: tuple[TraceClock, ...] = ()  # per track, when merged with the job's clocks


def track_label(info: TraceInfo) -> str:
    """The name of an input's track: ``<role>/<stage> rank <r> step <n>``, then `` #k`` for
    occurrence k >= 2 (the region's k-th entry in that step, a micro-batch say)."""
    label = f"{info.role}/{info.stage} rank {info.rank} step {info.step}"
    return f"{label} #{info.occurrence}" if info.occurrence > 1 else label


def merge_traces(
    traces: Iterable[TraceInfo | str | os.PathLike[str]],
    out_path: str | os.PathLike[str],
    *,
    clocks: Optional[JobClocks] = None,
) -> MergeResult:
    """Write one Chrome trace holding every trace in ``traces``, each as its own process track.

    ``traces`` are :class:`~torchstep_prof.traces.reading.files.TraceInfo` records (from ``scan_traces``)
    or paths. The output is gzipped when ``out_path`` ends with ``.gz``, and appears complete or
    not at all. Inputs are read one at a time; one that is not a usable trace is left out and
    named in ``skipped``. Raises :class:`TraceReadError` when a path given is not a trace, and
    ``ValueError`` when there is nothing to merge. With ``clocks``, each input is moved by
    its process's estimated clock offset where there is one.

    >>> infos, _ = scan_traces("outputs/profile", TraceFilter(steps=[3]))  # doctest: +SKIP
    >>> merge_traces(infos, "step3.json.gz").tracks[0].label                 # doctest: +SKIP
    'actor/update rank 0 step 3'
    """
    infos = [t if isinstance(t, TraceInfo) else read_trace_info(t) for t in traces]
    if not infos:
        raise ValueError("no trace to merge")
    infos.sort(key=lambda i: (i.step, i.role, i.stage, i.occurrence, i.rank, i.path))
    per_trace = [clocks.clock_of(pid=i.pid, rank=i.rank) if clocks is not None else None for i in infos]
    # A trace without a base time comes from a torch that wrote epoch microseconds directly.
    bases = [(info.base_time_ns or 0) - _offset_ns(clock) for info, clock in zip(infos, per_trace)]
    base_ns = min(bases)
    tracks = tuple(
        MergedTrack(path=info.path, pid=index + 1, label=track_label(info)) for index, info in enumerate(infos)
    )
    out_path = os.fspath(out_path)
    written = 0
    merged: list[tuple[MergedTrack, TraceInfo, Optional[TraceClock]]] = []
    skipped: list[tuple[str, str]] = []
    with _atomic_output(out_path) as out:
        # The header goes last: only then is it known which inputs made it in.
        out.write(b'{"traceEvents":[')
        id_offset = 0
        device_properties: Any = None
        for index, (info, track, clock, own_base) in enumerate(zip(infos, tracks, per_trace, bases)):
            try:
                trace = load_trace(info.path)
                if not isinstance(trace.get("traceEvents"), list):
                    raise TraceReadError(f"{info.path}: not a Chrome trace (no traceEvents list)")
                shift_us = (own_base - base_ns) / 1000.0
                events, max_id = _track_events(trace, track, index, shift_us, id_offset)
                chunk = dumps(events)[1:-1]  # never empty: the track's own metadata comes first
            except Exception as exc:
                skipped.append((info.path, str(exc)))
                continue
            id_offset = max_id + 1
            if device_properties is None and trace.get("deviceProperties"):
                device_properties = trace["deviceProperties"]
            written += len(events)
            del trace, events
            out.write((b"," if merged else b"") + chunk)
            merged.append((track, info, clock))
        if not merged:
            raise ValueError("no trace to merge: every input was skipped")
        about: dict[str, Any] = {
            "inputs": [
                {
                    "file": t.path,
                    "pid": t.pid,
                    "track": t.label,
                    "rank": i.rank,
                    "step": i.step,
                    "occurrence": i.occurrence,
                    **({"clock": c.to_dict()} if c is not None else {}),
                }
                for t, i, c in merged
            ]
        }
        if clocks is not None:
            about["clock"] = clocks.to_dict()
        header = {
            "schemaVersion": 1,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base_ns,
            "torchstep_prof_merge": about,
        }
        out.write(b"]," + dumps(header)[1:-1])
        if device_properties is not None:
            out.write(b',"deviceProperties":' + dumps(device_properties))
        out.write(b"}")
    return MergeResult(
        path=out_path,
        tracks=tuple(t for t, _, _ in merged),
        events=written,
        skipped=tuple(skipped),
        clocks=tuple(c for _, _, c in merged if c is not None),
    )


def _offset_ns(clock: Optional[TraceClock]) -> int:
    """How far the trace's clock is ahead of the job's reference clock (0 when not aligned)."""
    return round(clock.offset_s * 1e9) if clock is not None and clock.aligned else 0


def _track_events(
    trace: dict[str, Any], track: MergedTrack, index: int, shift_us: float, id_offset: int
) -> tuple[list[dict[str, Any]], int]:
    """The events of one input, moved onto its track; returns them and the largest id used."""
    pid = track.pid
    events: list[dict[str, Any]] = [
        _metadata("process_name", pid, {"name": track.label}),
        _metadata("process_labels", pid, {"labels": os.path.basename(track.path)}),
        _metadata("process_sort_index", pid, {"sort_index": index}),
    ]
    # Thread ids are kept, unless two of the input's processes share one (two GPUs' stream 7).
    tid_owner: dict[Any, Any] = {}
    max_id = id_offset - 1
    for event in iter_events(trace):
        if event.get("ph") == "M" and event.get("name") in _PROCESS_METADATA:
            continue
        if not _placeable(event):
            continue  # a NaN or infinite time has no place on a timeline (nor in strict JSON)
        event = dict(event)
        old_pid = event.get("pid")
        event["pid"] = pid
        if "tid" in event:
            tid = event["tid"]
            owner = tid_owner.setdefault(_hashable(tid), old_pid)
            if owner != old_pid:
                event["tid"] = f"{old_pid}/{tid}"
        ts = event.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool) and shift_us:
            event["ts"] = ts + shift_us
        for key in _ID_KEYS:
            if key in event:
                event[key], max_id = _unique_id(event[key], index, id_offset, max_id)
        if event.get("ph") in ("i", "I") and event.get("s") == "g":
            event["s"] = "p"  # a global instant would cross every track of the merge
        events.append(event)
    return events, max_id


def _placeable(event: dict[str, Any]) -> bool:
    for key in ("ts", "dur"):
        value = event.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return False
    return True


def _metadata(name: str, pid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": 0, "ts": 0, "args": args}


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (int, str, float)) else repr(value)


def _unique_id(value: Any, index: int, offset: int, max_id: int) -> tuple[Any, int]:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value + offset, max(max_id, value + offset)
    return f"{index}:{value}", max_id


@contextlib.contextmanager
def _atomic_output(path: str) -> Iterator[io.BufferedIOBase]:
    """A binary file written under a temporary name beside ``path`` and renamed over it on
    success (gzip-compressed when ``path`` ends with ``.gz``); removed on failure."""
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open with 0o666 lets the umask decide the mode, as for any file the user creates.
    raw = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb")
    try:
        with raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6) as zipped:
                    yield zipped
            else:
                yield raw
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
