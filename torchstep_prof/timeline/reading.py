"""Span files read back without trusting them: capped, non-blocking, every bad line skipped and counted.

A span folder is shared by every process of a job, so anything may be in it: a FIFO or a link
at a span file's name, a file of gigabytes, a line cut short by a killed process, JSON of the
wrong shape. :func:`read_span_folder` never blocks on or follows such a file (it is read through
``_shared_files.read_capped``), never raises for one, and says what it skipped.

>>> folder = read_span_folder("/nonexistent")
>>> folder.processes, folder.problems[0].startswith("/nonexistent")
((), True)
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, NamedTuple, Optional, Sequence

import attrs

from .._shared_files import SharedFileError, read_capped
from .span_log import FILE_PREFIX, FILE_SUFFIX

__all__ = [
    "MAX_FILES",
    "MAX_SPAN_FILE_BYTES",
    "Anchor",
    "ProcessSpans",
    "RayCall",
    "Span",
    "SpanFolder",
    "StepBlock",
    "newest_run",
    "parse_items",
    "read_span_folder",
]

MAX_SPAN_FILE_BYTES = 512 << 20
"""A span file bigger than this is refused (about 5 million spans: weeks of a busy process)."""
MAX_FILES = 4096
"""At most this many span files are read from one folder (the rest are named as skipped)."""
_MAX_PROBLEMS_PER_FILE = 5


class Span(NamedTuple):
    """One region's run: its labels, its start and end (seconds, this process's clock), its thread."""

    role: str
    stage: str
    start: float
    end: float
    thread: str


class StepBlock(NamedTuple):
    """One step block: its number, start and end (this process's clock) and thread."""

    number: int
    start: float
    end: float
    thread: str


class Anchor(NamedTuple):
    """A clock anchor (``tsp.clock_anchor``): the ``seq``-th barrier named ``name``, entered at
    ``start`` and left at ``end`` (this process's clock)."""

    name: str
    seq: int
    start: float
    end: float


RAY_WHATS = ("submitted", "returned", "ran")


class RayCall(NamedTuple):
    """One side of a Ray call (``torchstep_prof.integrations.ray``): task ``task`` was
    ``submitted`` or its result ``returned`` here (an instant: ``start == end``), or it ``ran``
    here from ``start`` to ``end`` (this process's clock)."""

    task: str
    what: str
    start: float
    end: float


@attrs.frozen(kw_only=True)
class ProcessSpans:
    """Everything one span file says about its process."""

    path: str
    host: str
    pid: int
    rank: Optional[int]
    world_size: Optional[int]
    process_role: Optional[str]
    spans: tuple[Span, ...]
    steps: tuple[StepBlock, ...]
    anchors: tuple[Anchor, ...]
    ray: tuple[RayCall, ...] = ()  # files written before Ray calls were logged have none
    ended: bool  # the file's last line says the process exited normally
    started: Optional[float] = None  # when its span log started (the process line), if it says

    def lifetime(self) -> tuple[float, float]:
        """From its first to its last time logged (its clock); ``(inf, -inf)`` when it logged none."""
        starts = [x.start for group in (self.spans, self.steps, self.anchors, self.ray) for x in group]
        ends = [x.end for group in (self.spans, self.steps, self.anchors, self.ray) for x in group]
        if self.started is not None:
            starts.append(self.started)
        return min(starts, default=math.inf), max(ends + starts, default=-math.inf)


@attrs.frozen(kw_only=True)
class SpanFolder:
    """The span files of a folder, read; ``problems`` names each file or line skipped."""

    processes: tuple[ProcessSpans, ...]
    problems: tuple[str, ...]
    source: str = "span files"  # or "traces": what the processes were read from
    note: Optional[str] = None  # said before the ledger (both kinds of file were there)


def read_span_folder(folder: str) -> SpanFolder:
    """Read every ``spans-*.jsonl`` file in ``folder`` (not its subfolders)."""
    problems: list[str] = []
    try:
        names = sorted(
            e.name for e in os.scandir(folder) if e.name.startswith(FILE_PREFIX) and e.name.endswith(FILE_SUFFIX)
        )
    except OSError as exc:
        return SpanFolder(processes=(), problems=(f"{folder}: cannot be listed ({exc.strerror or exc})",))
    if len(names) > MAX_FILES:
        problems.append(f"{folder}: {len(names)} span files; only the first {MAX_FILES} are read")
        names = names[:MAX_FILES]
    processes = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            data = read_capped(path, MAX_SPAN_FILE_BYTES)
        except SharedFileError as exc:
            problems.append(f"{exc} (skipped)")
            continue
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({exc.strerror or exc}; skipped)")
            continue
        process = _parse(path, data, problems)
        if process is not None:
            processes.append(process)
    kept, note = newest_run(processes, folder)
    return SpanFolder(processes=kept, problems=tuple(problems), note=note)


def newest_run(processes: Sequence[ProcessSpans], folder: str) -> tuple[tuple[ProcessSpans, ...], Optional[str]]:
    """The processes of the newest run in ``folder``, and a note naming what was left out.

    A run is the processes whose lifetimes (first to last time logged) overlap, transitively:
    torchrun's ranks start together, and a Ray actor started late still overlaps its driver. A
    process that starts after every earlier one's last time starts a new run; a second job
    written into the same folder would otherwise stretch each step's window over both.

    >>> newest_run([], "DIR")
    ((), None)
    """
    timed = sorted(((p.lifetime(), i) for i, p in enumerate(processes)), key=lambda t: t[0][0])
    runs: list[list[int]] = []
    reach = -math.inf
    for (first, last), i in timed:
        if not runs or (math.isfinite(first) and first > reach):
            runs.append([])
        runs[-1].append(i)
        reach = max(reach, last)
    if len(runs) <= 1:
        return tuple(processes), None
    newest = set(runs[-1])
    older = len(processes) - len(newest)
    note = (
        f"{older} process{'es' if older != 1 else ''} of {len(runs) - 1} older run{'s' if len(runs) > 2 else ''} "
        f"in {folder} ignored; give each run its own folder"
    )
    return tuple(p for i, p in enumerate(processes) if i in newest), note


def _parse(path: str, data: bytes, problems: list[str]) -> Optional[ProcessSpans]:
    lines = data.split(b"\n")
    cut_short = lines[-1] != b""
    if not cut_short:
        lines.pop()
    header: Optional[dict[str, Any]] = None
    spans: list[Span] = []
    steps: list[StepBlock] = []
    anchors: list[Anchor] = []
    ray: list[RayCall] = []
    ended = False
    bad: list[str] = []
    for number, raw in enumerate(lines, 1):
        if cut_short and number == len(lines):
            bad.append(f"line {number} has no line end (still being written, or its process stopped while writing it)")
            continue
        try:
            record = json.loads(raw)
            kind = record["kind"]
            if kind == "process":
                header = record if header is None else header
            elif kind == "batch":
                line_spans, line_steps, line_anchors, line_ray = parse_items(record, _text(record.get("thread", "?")))
                spans += line_spans
                steps += line_steps
                anchors += line_anchors
                ray += line_ray
            elif kind == "end":
                ended = True
            else:
                raise ValueError(f"unknown kind {kind!r}")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            bad.append(f"line {number} skipped ({type(exc).__name__}: {str(exc)[:80]})")
    for text in bad[:_MAX_PROBLEMS_PER_FILE]:
        problems.append(f"{path}: {text}")
    if len(bad) > _MAX_PROBLEMS_PER_FILE:
        problems.append(f"{path}: {len(bad) - _MAX_PROBLEMS_PER_FILE} more lines skipped")
    if header is None:
        problems.append(f"{path}: no process line (not a span file, or cut short before it; skipped)")
        return None
    try:
        return ProcessSpans(
            path=path,
            host=_text(header.get("host", "?")),
            pid=_int(header.get("pid", 0)),
            rank=_optional_int(header.get("rank")),
            world_size=_optional_int(header.get("world_size")),
            process_role=None if header.get("process_role") is None else _text(header["process_role"]),
            spans=tuple(s for s in spans if s.end >= s.start),
            steps=tuple(s for s in steps if s.end >= s.start),
            anchors=tuple(a for a in anchors if a.end >= a.start),
            ray=tuple(r for r in ray if r.end >= r.start),
            ended=ended,
            started=_time(header["start"]) if header.get("start") is not None else None,
        )
    except (ValueError, TypeError) as exc:
        problems.append(f"{path}: a bad process line ({exc}; skipped)")
        return None


def parse_items(batch: Any, thread: str) -> tuple[list[Span], list[StepBlock], list[Anchor], list[RayCall]]:
    """A batch's items (a span file's line, a trace's ``timeline``) checked and made records,
    all or none: the first bad item raises ``ValueError``, ``TypeError`` or ``KeyError``. A
    span is ``[role, stage, start, end]`` on ``thread``, or names its own as a fifth item; a
    side of a Ray call is ``[task, "submitted" | "returned" | "ran", start, end]`` (files and
    traces written before Ray calls were logged have none)."""
    made = []
    for role, stage, start, end, *own in batch["spans"]:
        if len(own) > 1:
            raise ValueError(f"a span of {5 + len(own) - 1} items")
        made.append(Span(_text(role), _text(stage), _time(start), _time(end), _text(own[0]) if own else thread))
    blocks = [StepBlock(_int(n), _time(a), _time(b), thread) for n, a, b in batch.get("steps", ())]
    passed = [Anchor(_text(n), _int(q), _time(a), _time(b)) for n, q, a, b in batch.get("anchors", ())]
    ray = [RayCall(_text(t), _what(w), _time(a), _time(b)) for t, w, a, b in batch.get("ray", ())]
    return made, blocks, passed, ray


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {type(value).__name__}")
    return value[:200]


def _what(value: Any) -> str:
    if value not in RAY_WHATS:
        raise ValueError(f"expected one of {', '.join(RAY_WHATS)}, got {value!r:.40}")
    return str(value)


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"expected a time in seconds, got {value!r:.40}")
    return float(value)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r:.40}")
    return value


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else _int(value)
