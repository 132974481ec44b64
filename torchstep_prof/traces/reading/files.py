"""Reading trace files back: load one, describe it, scan a folder of them.

A torchstep_prof trace is a torch.profiler Chrome trace whose top level also carries a
``torchstep_prof`` object (role, stage, step, occurrence, rank, world_size, pid, discrete) and
``distributedInfo``. Older or renamed files fall back to the file name
(:func:`~torchstep_prof.naming.parse_trace_name`) and then to ``distributedInfo`` for the rank; a
trace without an ``occurrence`` is occurrence 1. Scanning reads one file at a time, so memory stays
bounded by the largest file, and reports files it cannot use, whatever the parser raised, instead
of raising.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Tuple

import attrs

from .events import MAX_TIME_US, OpTime, absurd_times, iter_events, region_ranges, region_time, top_ops
from .collective_calls import CollectiveCall, read_collectives
from .gpu_time import gpu_busy_ms
from .fused import RegionSpan, RegionTopOps, read_fused_regions, region_labels
from .loading import TraceReadError, describe_error as _describe, load_trace
from .memory_events import MemoryUse, read_memory
from ...naming import FUSED_STAGE, METADATA_KEY, TRACE_SUFFIXES, TraceName, parse_trace_name, sanitize_label

__all__ = [
    "OpTime",
    "TraceFilter",
    "TraceInfo",
    "TraceReadError",
    "Unreadable",
    "find_trace_files",
    "iter_events",
    "load_trace",
    "read_or_skip",
    "read_trace_info",
    "scan_traces",
    "started_at",
    "top_ops",
    "trace_sort_key",
    "wanted_by_name",
]


@attrs.frozen(kw_only=True)
class TraceInfo:
    """What one trace file is: who wrote it, for which region and step, and how long it took.

    ``role`` and ``stage`` are the sanitized labels of file names. ``occurrence`` is the k-th
    entry of the region in its step (1 unless the region ran several times in the step, as with
    gradient accumulation). ``pid`` is the writing process (None when neither the metadata nor
    the name says). ``fused`` marks a trace of a whole step (``discrete: false``); its ``roles``
    are the roles of the regions it holds (for a discrete trace, its own role). ``wall_ms`` is
    the duration of the trace's ``ProfilerStep#<n>`` range (the owning block), or the span of its
    events when it has none; always finite and >= 0. ``start_ns`` is that range's start in epoch
    nanoseconds when the trace has a base time. ``top_ops`` is filled only when asked for
    (``scan_traces(..., top=n)``). A fused trace also has its ``regions``' entries on the
    step's clock and (with ``top``) each region's ``region_ops``
    (:mod:`~torchstep_prof.traces.reading.fused`). ``collectives`` are its collective events in order
    (:mod:`~torchstep_prof.traces.reading.collective_calls`), ``memory`` its ``[memory]`` events per device
    (:mod:`~torchstep_prof.traces.reading.memory_events`; empty unless recorded with ``contents("memory")``).
    ``gpu_ms`` is the time kernels ran inside the ``ProfilerStep`` range
    (:mod:`~torchstep_prof.traces.reading.gpu_time`; None unless recorded with ``contents("cuda")``).
    """

    path: str
    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    wall_ms: float
    base_time_ns: Optional[int]
    size_bytes: int
    occurrence: int = 1
    pid: Optional[int] = None
    fused: bool = False
    roles: Tuple[str, ...] = ()
    start_ns: Optional[int] = None
    top_ops: Tuple[OpTime, ...] = ()
    regions: Tuple[RegionSpan, ...] = ()
    region_ops: Tuple[RegionTopOps, ...] = ()
    collectives: Tuple[CollectiveCall, ...] = ()
    memory: Tuple[MemoryUse, ...] = ()
    gpu_ms: Optional[float] = None


@attrs.frozen(kw_only=True)
class Unreadable:
    """A file found while scanning that is not a usable trace, and why."""

    path: str
    reason: str


# A named function, not a lambda: attrs' mypy plugin types only named converters.
def _labels(values: Iterable[str]) -> Tuple[str, ...]:
    return tuple(map(sanitize_label, values))


@attrs.frozen(kw_only=True)
class TraceFilter:
    """Which traces to keep; an empty field keeps everything.

    Roles and stages are kept as sanitized labels, so ``compute_log_prob`` selects the
    ``compute-log-prob`` files.
    """

    roles: Tuple[str, ...] = attrs.field(default=(), converter=_labels)
    stages: Tuple[str, ...] = attrs.field(default=(), converter=_labels)
    steps: Tuple[int, ...] = attrs.field(default=(), converter=tuple)
    ranks: Tuple[int, ...] = attrs.field(default=(), converter=tuple)
    pids: Tuple[int, ...] = attrs.field(default=(), converter=tuple)

    def matches(self, trace: TraceInfo | TraceName) -> bool:
        """Whether ``trace`` (a scanned trace or a parsed file name) passes every field.

        A fused trace passes a role it holds (``--role trainer`` keeps ``eval-trainer_train``).
        A file name alone cannot tell which roles a fused name joins, so a name of stage
        ``train`` passes any role filter (the file's contents then decide).
        """
        if isinstance(trace, TraceInfo):
            roles = {trace.role, *trace.roles} if trace.fused else {trace.role}
        else:
            roles = {trace.role} if trace.stage != FUSED_STAGE else set(self.roles)
        return (
            (not self.roles or not roles.isdisjoint(self.roles))
            and (not self.stages or trace.stage in self.stages)
            and (not self.steps or trace.step in self.steps)
            and (not self.ranks or trace.rank in self.ranks)
            and (not self.pids or trace.pid in self.pids)
        )


def read_trace_info(path: str | os.PathLike[str], trace: dict[str, Any] | None = None, *, top: int = 0) -> TraceInfo:
    """Describe the trace at ``path`` (loading it unless ``trace`` is given).

    Fields come from the ``torchstep_prof`` metadata, else the file name, else (rank and world
    size) ``distributedInfo``. Raises :class:`TraceReadError` for a file that is not a trace, or
    a trace that says nothing of its role, stage and step.
    """
    path = os.fspath(path)
    if trace is None:
        trace = load_trace(path)
    try:
        return _describe_trace(path, trace, top)
    except TraceReadError:
        raise
    except Exception as exc:  # odd contents the description did not foresee: still one file
        raise TraceReadError(f"{path}: cannot describe ({_describe(exc)})") from exc


def _describe_trace(path: str, trace: dict[str, Any], top: int) -> TraceInfo:
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise TraceReadError(f"{path}: not a Chrome trace (no traceEvents list)")
    fields = _identity(path, trace)
    base_ns = _base_time(path, trace)
    absurd, example = absurd_times(events)
    if absurd:
        raise TraceReadError(
            f"{path}: absurd times ({absurd} event(s) with a ts or dur that is no time: "
            f"beyond {MAX_TIME_US:.0e} µs or not finite; first {example})"
        )
    wall_ms, start_us = region_time(events, fields["step"])
    start_ns = None if base_ns is None or start_us is None else base_ns + round(start_us * 1000)
    if start_ns is not None and not 0 <= start_ns <= MAX_EPOCH_NS:
        raise TraceReadError(
            f"{path}: absurd start time (baseTimeNanoseconds plus the step's ts is {start_ns / 1e9:.3g} s since 1970)"
        )
    roles: Tuple[str, ...] = (fields["role"],)
    if fields["fused"]:
        ranges = region_ranges(events)
        roles = tuple(dict.fromkeys(region_labels(r.name)[0] for r in ranges)) or roles
        spans, region_ops, ops = read_fused_regions(trace, ranges, start_us, wall_ms, top)
    else:
        spans, region_ops, ops = (), (), top_ops(trace, top)
    return TraceInfo(
        path=path,
        **fields,
        roles=roles,
        wall_ms=wall_ms,
        base_time_ns=base_ns,
        size_bytes=_size(path),
        start_ns=start_ns,
        top_ops=ops,
        regions=spans,
        region_ops=region_ops,
        collectives=read_collectives(events),
        memory=read_memory(events),
        gpu_ms=None if start_us is None else gpu_busy_ms(events, start_us, start_us + wall_ms * 1000.0),
    )


MAX_EPOCH_NS = 10**20
"""Epoch times past this (year 5138; :data:`~torchstep_prof.traces.reading.events.MAX_TIME_US` in ns) or
before 1970 are corrupt: such a base time would stretch a merged timeline over centuries, and no
date can be written for it."""


def _base_time(path: str, trace: dict[str, Any]) -> int | None:
    """The trace's ``baseTimeNanoseconds`` (None when it has none); a value that is not a time
    within 1970..:data:`MAX_EPOCH_NS` is a :class:`TraceReadError`, never guessed around."""
    value = trace.get("baseTimeNanoseconds")
    if value is None:
        return None
    # Exact types: a bool is no time. NaN and infinities fail the comparison.
    if type(value) not in (int, float) or not 0 <= value <= MAX_EPOCH_NS:
        try:
            text = repr(value)
        except ValueError:  # an integer of more digits than Python prints
            text = "a huge integer"
        text = text if len(text) <= 24 else text[:21] + "..."
        raise TraceReadError(f"{path}: absurd baseTimeNanoseconds ({text}): not a time since 1970")
    return value if isinstance(value, int) else int(value)


def _identity(path: str, trace: dict[str, Any]) -> dict[str, Any]:
    meta = trace.get(METADATA_KEY)
    meta = meta if isinstance(meta, dict) else {}
    try:
        name: TraceName | None = parse_trace_name(path)
    except ValueError:
        name = None
    dist = trace.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}

    def pick(key: str, name_value: Any, dist_default: Optional[int] = None) -> Any:
        value = _label(meta.get(key)) if key in ("role", "stage") else _int(meta.get(key))
        if value is None:
            value = name_value
        if value is None and dist_default is not None:  # then distributedInfo, then the default
            value = _int(dist.get(key))
            value = dist_default if value is None else value
        return value

    fields = {
        "role": pick("role", name and name.role),
        "stage": pick("stage", name and name.stage),
        "step": pick("step", name and name.step),
        "rank": pick("rank", name and name.rank, dist_default=0),
        "world_size": pick("world_size", name and name.world_size, dist_default=1),
        "pid": pick("pid", name and name.pid),
    }
    missing = [key for key in ("role", "stage", "step") if fields[key] is None]
    if missing:
        raise TraceReadError(
            f"{path}: a Chrome trace, but not a torchstep_prof one (no {METADATA_KEY!r} "
            f"metadata and not a trace file name: {', '.join(missing)} unknown)"
        )
    occurrence = _int(meta.get("occurrence"))
    fields["occurrence"] = occurrence if occurrence is not None and occurrence >= 1 else 1
    discrete = meta.get("discrete")
    # Older fused traces may lack the flag: every fused trace is stage "train".
    fields["fused"] = discrete is False or (discrete is None and fields["stage"] == FUSED_STAGE)
    return fields


def _label(value: Any) -> str | None:
    """A label as file names write it (metadata written by hand may hold the raw one)."""
    return sanitize_label(value) if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def find_trace_files(directory: str | os.PathLike[str], *, recursive: bool = False) -> list[str]:
    """The ``.json`` / ``.json.gz`` files in ``directory`` (its subfolders too when
    ``recursive``), sorted by path. Raises ``OSError`` when the folder cannot be listed."""
    found: list[str] = []
    if recursive:
        for root, _, files in os.walk(directory):
            found.extend(os.path.join(root, f) for f in files if f.endswith(TRACE_SUFFIXES))
    else:
        with os.scandir(directory) as entries:
            # Not only regular files: a fifo or a dangling link named *.json is listed, so that
            # reading it names it as skipped (see load_trace) rather than hiding it.
            found.extend(e.path for e in entries if e.name.endswith(TRACE_SUFFIXES) and not _is_dir(e))
    return sorted(found)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link loop, say: a file to name as skipped
        return False


def scan_traces(
    directory: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    filters: TraceFilter | None = None,
    *,
    top: int = 0,
) -> tuple[list[TraceInfo], list[Unreadable]]:
    """Describe every trace in a folder (or a list of files) that passes ``filters``.

    Returns ``(infos, unreadable)``: the traces sorted by role, stage, step, rank and path, and
    the files that are not usable traces (corrupt, not JSON, not a torchstep_prof trace) with
    the reason. Files whose names parse and fail the filters are not even opened. One file is in
    memory at a time.
    """
    filters = filters or TraceFilter()
    if isinstance(directory, (str, os.PathLike)):
        paths = find_trace_files(directory)
    else:
        paths = [os.fspath(p) for p in directory]
    infos: list[TraceInfo] = []
    unreadable: list[Unreadable] = []
    for path in paths:
        if wanted_by_name(path, filters):
            found = read_or_skip(path, top)
            if isinstance(found, Unreadable):
                unreadable.append(found)
            elif filters.matches(found):
                infos.append(found)
    infos.sort(key=trace_sort_key)
    return infos, unreadable


def read_or_skip(path: str, top: int = 0) -> TraceInfo | Unreadable:
    """:func:`read_trace_info` of ``path``, or the :class:`Unreadable` saying why it is skipped:
    never raises, whatever the parser raised (a scan never ends on one file; :func:`load_trace`
    and :func:`read_trace_info` turn any failure into a :class:`TraceReadError`)."""
    try:
        return read_trace_info(path, top=top)
    except TraceReadError as exc:
        return Unreadable(path=path, reason=_reason(exc, path))


def wanted_by_name(path: str, filters: TraceFilter) -> bool:
    """Whether ``path``'s name passes ``filters`` (a name that is no trace name passes: its
    metadata decides once read)."""
    try:
        return filters.matches(parse_trace_name(path))
    except ValueError:
        return True  # not a trace name: the metadata inside decides


def _reason(exc: Exception, path: str) -> str:
    text = str(exc)
    return text[len(path) + 2 :] if text.startswith(f"{path}: ") else text


def trace_sort_key(info: TraceInfo) -> tuple[str, str, int, int, int, str]:
    """Sort order of listings: role, stage, step, occurrence, rank, then path."""
    return (info.role, info.stage, info.step, info.occurrence, info.rank, info.path)


def started_at(info: TraceInfo) -> float:
    """When the trace's region started, in epoch seconds: from the trace's own clock when it has
    one, else the file name's timestamp, else the file's modification time."""
    if info.start_ns is not None:
        return info.start_ns / 1e9
    try:
        return parse_trace_name(info.path).timestamp.timestamp()
    except ValueError:
        pass
    try:
        return os.stat(info.path).st_mtime
    except OSError:
        return 0.0
