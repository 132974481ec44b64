"""The span log's writing side: every region and step block of this process, one file, appended per batch.

With spans on (``tsp.spans(DIR)``, the ``spans`` config section, ``run --spans DIR``), every
timed region's exit hands ``(role, stage, start, end)`` to its thread's list
(``region_metrics/recorder.py``, the metrics' hand-off), and a step block's end hands its
number, start and end. This module's one thread takes those lists twice a second and appends
them to ``DIR/spans-<host>-<pid>.jsonl`` as JSON lines, so the training thread never formats
or writes anything, and a killed job keeps every batch written before it died.

The file, one JSON object a line (the reader is :mod:`torchstep_prof.timeline.reading`):

- ``{"kind": "process", "format": 1, "host", "pid", "rank", "world_size", "local_rank",
  "process_role", "start"}`` first;
- ``{"kind": "batch", "thread", "rank", "spans": [[role, stage, start, end], ...],
  "steps": [[number, start, end], ...], "anchors": [[name, seq, start, end], ...],
  "ray": [[task id, "submitted" | "returned" | "ran", start, end], ...]}`` (``ray``: the
  Ray calls of ``torchstep_prof.integrations.ray``, an instant for the first two; a key a
  reader that does not know it skips, so the format stays 1);
- ``{"kind": "end", "at"}`` last, written at a clean interpreter exit (a file without it
  belongs to a process that was killed: its last step is incomplete).

Times are seconds since the epoch on this host's clock (``perf_counter`` plus one offset
taken at start, so spans keep the monotonic clock's order); ``torchstep-prof timeline``
aligns the hosts' clocks with the anchors (docs/timeline.md).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from typing import Any, Optional

from .._fork import at_fork_in_child
from .._shared_files import create_exclusively
from ..errors import warn
from ..region_metrics import recorder as _recorder
from ..topology import current_topology
from .idle import IdleTracker
from .wall_clock import note_anchor, use_base, wall_minus_perf

__all__ = [
    "FILE_PREFIX",
    "FILE_SUFFIX",
    "FORMAT",
    "clock_anchor",
    "flush_spans",
    "span_dir",
    "start_span_log",
]

FILE_PREFIX = "spans-"
FILE_SUFFIX = ".jsonl"
FORMAT = 1
"""The span file's format number (its first line's ``format``)."""
WRITE_EVERY_S = 0.5
_MAX_NAME_TRIES = 20
_MAX_LABELS = 4096  # label pairs whose JSON is kept (labels made from data are formatted each time)


class _SpanLog:
    """The process's one span log: its folder, its file (opened at the first batch) and its thread."""

    def __init__(self, folder: str, process_role: Optional[str]) -> None:
        self.folder = folder
        self.process_role = process_role
        self.base = wall_minus_perf()
        self.started = time.time()
        self.idle = IdleTracker()
        self.labels: dict[tuple[Any, Any], str] = {}  # (role, stage) -> its JSON, '"actor", "update"'
        self.fd: Optional[int] = None
        self.path: Optional[str] = None
        self.failed = False  # nowhere to write: spans are taken and dropped
        self.closed = False
        self.lock = threading.Lock()  # one writer at a time: the thread, exit, flush_spans
        self.thread = threading.Thread(target=self._write_forever, name="torchstep_prof spans", daemon=True)

    def _write_forever(self) -> None:
        while not self.closed:
            time.sleep(WRITE_EVERY_S)
            self.write()

    def write(self, final: bool = False) -> None:
        with self.lock:
            if self.failed or self.closed:
                # Regions still hand their spans over (they are timed under the scope): taken
                # and dropped, so the lists stay short with nowhere to write them.
                _recorder.take_spans()
                return
            try:
                lines = self._lines()
                if final:
                    lines.append(json.dumps({"kind": "end", "at": round(time.time(), 6)}))
                if lines and self._open():
                    os.write(self.fd, ("\n".join(lines) + "\n").encode())  # type: ignore[arg-type]
            except Exception as exc:  # a full disk, a folder removed: stop logging, never raise into training
                self._fail(f"could not write the span log in {self.folder!r}: {exc}")

    def _lines(self) -> list[str]:
        # Formatted by hand, each label's JSON made once: json.dumps of nested lists costs
        # several times more per span, on the GIL the training thread shares.
        base = self.base
        labels = self.labels
        rank = current_topology().rank
        lines = []
        for thread, flat in _recorder.take_spans():
            if _recorder.BOUNDS:  # metrics on too: each ended step's idle time, live
                try:
                    self.idle.add(thread, flat)
                except Exception:  # the idle series are extra: never lose the spans for them  # pragma: no cover
                    pass
            spans, steps, anchors, ray = [], [], [], []
            for i in range(0, len(flat), 4):
                role, stage, start, end = flat[i : i + 4]
                times = f"{start + base:.6f},{end + base:.6f}"
                if role is None:
                    if isinstance(stage, int):  # a step block that did not say its number: not a step here
                        steps.append(f"[{stage},{times}]")
                elif role is _recorder.ANCHOR:
                    name, _, seq = stage.rpartition("\x00")
                    anchors.append(f"[{json.dumps(name)},{int(seq)},{times}]")
                elif role is _recorder.RAY:
                    what, _, task = stage.partition("\x00")
                    ray.append(f"[{json.dumps(task)},{json.dumps(what)},{times}]")
                else:
                    try:
                        pair = labels[role, stage]
                    except (KeyError, TypeError):
                        pair = json.dumps([_text(role), _text(stage)])[1:-1]
                        if len(labels) < _MAX_LABELS:
                            try:
                                labels[role, stage] = pair
                            except TypeError:  # an unhashable label
                                pass
                    spans.append(f"[{pair},{times}]")
            head = json.dumps({"kind": "batch", "thread": thread.name, "rank": rank})[:-1]
            line = f'{head}, "spans": [{",".join(spans)}]'
            for key, items in (("steps", steps), ("anchors", anchors), ("ray", ray)):
                if items:
                    line += f', "{key}": [{",".join(items)}]'
            lines.append(line + "}")
        return lines

    def _open(self) -> bool:
        if self.fd is not None:
            return True
        os.makedirs(self.folder, exist_ok=True)
        host = socket.gethostname()
        stem = f"{FILE_PREFIX}{_safe(host)}-{os.getpid()}"
        for attempt in range(_MAX_NAME_TRIES):  # someone's file at our name: never written through
            path = os.path.join(self.folder, f"{stem}{'' if attempt == 0 else f'.{attempt}'}{FILE_SUFFIX}")
            try:
                self.fd = create_exclusively(path)
                break
            except FileExistsError:
                continue
        else:
            self._fail(f"no free span file name in {self.folder!r} ({stem}*{FILE_SUFFIX} all taken)")
            return False
        self.path = path
        topology = current_topology()
        header = {
            "kind": "process",
            "format": FORMAT,
            "host": host,
            "pid": os.getpid(),
            "rank": topology.rank,
            "world_size": topology.world_size,
            "local_rank": topology.local_rank,
            "process_role": self.process_role,
            "start": round(self.started, 6),
        }
        os.write(self.fd, (json.dumps(header) + "\n").encode())
        return True

    def _fail(self, message: str) -> None:
        self.failed = True
        warn(f"torchstep_prof: {message}; spans are no longer recorded")

    def close(self) -> None:
        self.write(final=True)
        with self.lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None
            self.closed = True  # the thread stops (interpreter exit)


def _text(label: Any) -> str:
    return label if isinstance(label, str) else str(label)


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host)[:64] or "host"


_LOG: list[_SpanLog] = []  # the process's span log, once started
_LOG_LOCK = threading.Lock()
_ANCHOR_SEQ: dict[str, int] = {}  # name -> anchors passed so far


def start_span_log(folder: str, process_role: Optional[str] = None) -> None:
    """Record spans from now on into ``folder`` (the first folder a process names; a later,
    different one is warned about and ignored)."""
    with _LOG_LOCK:
        if _LOG:
            if os.path.abspath(_LOG[0].folder) != os.path.abspath(folder) and not _LOG[0].failed:
                warn(
                    f"torchstep_prof: spans already go to {_LOG[0].folder!r}; {folder!r} is ignored (one span log a process)"
                )
            return
        log = _SpanLog(folder, process_role)
        _LOG.append(log)
        use_base(log.base)  # traces' anchors and this log's spans on one clock
        _recorder.spans_on(True)
        log.thread.start()
        atexit.register(log.close)


def span_dir() -> Optional[str]:
    """The folder this process's span log writes to, or None when spans are off.

    >>> import torchstep_prof.timeline.span_log as s
    >>> s.span_dir() is None or isinstance(s.span_dir(), str)
    True
    """
    return _LOG[0].folder if _LOG and not _LOG[0].failed else None


def flush_spans() -> Optional[str]:
    """Write every span recorded so far now; the span file's path (None: spans are off)."""
    if not _LOG:
        return None
    _LOG[0].write()
    return _LOG[0].path


def clock_anchor(name: str = "barrier", *, group: Any = None) -> None:
    """Run ``torch.distributed.barrier(group)`` and note its entry and exit in the span log, so
    ``torchstep-prof timeline`` can align this process's clock with every other process that
    passed the same barrier. Call it at the same point on every rank of ``group`` (it *is* a
    barrier), every few steps; ``name`` tells anchors of different groups apart.

    Without torch.distributed initialized there is no barrier, and nothing is noted. With spans
    off the barrier still runs (every rank must call it) and nothing is noted.

    >>> import torchstep_prof as tsp
    >>> tsp.clock_anchor()        # no process group: nothing to do
    """
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    with _LOG_LOCK:  # counted with spans on or off: the nth anchor of a name is the same barrier everywhere
        seq = _ANCHOR_SEQ[name] = _ANCHOR_SEQ.get(name, 0) + 1
    start = _recorder._perf()
    dist.barrier(group=group)
    end = _recorder._perf()
    _recorder.record_anchor(name, seq, start, end)
    note_anchor(name, seq, start, end)


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) writes no spans: its parent's file and thread are not its own.
    global _LOG_LOCK
    _LOG_LOCK = threading.Lock()
    _LOG.clear()


at_fork_in_child(_after_fork_in_child)
