"""Regions of other threads and asyncio tasks while a trace records: timed spans, on a track each.

torch's ranges are per thread and must nest. A region entered in another thread, or in another
asyncio task of the owner's thread (tasks interleave: their ranges would not nest, and torch's
range stack breaks, then the interpreter crashes), is timed here instead and written into the
trace at export as a ``user_annotation`` event on a track of its own: the thread's native id for
a thread, a synthetic id per task (named by a ``thread_name`` metadata event).

torch records other threads only under its ``profile_all_threads`` option, which costs ~10% on
a small step, drops memory events, and crashes when threads open ranges while the profiler
stops: spans avoid all of that.
"""

from __future__ import annotations

import json
import os
import threading
import time
from asyncio import _get_running_loop
from asyncio import current_task as _current_task
from typing import Any, Iterator, Optional

__all__ = ["SpanLog", "ThreadSpan", "running_task"]

# Linux thread ids stay below 2**22 (pid_max): synthetic task tracks cannot meet a real thread's.
TASK_TRACK_BASE = 1 << 30


def running_task() -> Any:
    """The asyncio task running in this thread, or None; asks asyncio only when a loop runs
    here (docs/hot-path.md, "Cheap questions first")."""
    loop = _get_running_loop()
    return None if loop is None else _current_task(loop)


class ThreadSpan:
    """A region that is not a torch range of the trace's owner (see the module docstring)."""

    __slots__ = ("_log", "_name", "_role")

    def __init__(self, log: SpanLog, name: str, role: Optional[str]) -> None:
        self._log = log
        self._name = name
        self._role = role

    def __enter__(self) -> ThreadSpan:
        self._log.open(self, self._name, self._role)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._log.close(self, time.time_ns())


class SpanLog:
    """The spans of one trace: opened, closed, cut off when the trace stops; and their tracks.

    It also guards the trace's ``roles`` (a fused trace's file name and metadata name them): a
    role joins only while the trace records, and a span's role joins with the span, so the
    roles are exactly those with an event in the trace, frozen when it stops.
    """

    def __init__(self, owner_thread: int, roles: list[str]) -> None:
        self._owner_thread = owner_thread
        self._roles = roles
        self._lock = threading.Lock()
        self._stopped = False
        self._open: dict[Any, tuple[str, int, int]] = {}
        self.spans: list[tuple[str, int, int, int]] = []  # (range name, tid, start ns, end ns)
        self.tracks: dict[int, str] = {}  # tid -> track name
        self._task_tracks: dict[Any, int] = {}

    def add_role(self, role: str) -> None:
        """``role`` joins the trace, unless it stopped."""
        with self._lock:
            if not self._stopped and role not in self._roles:
                self._roles.append(role)

    def open(self, key: Any, name: str, role: Optional[str]) -> None:
        task = running_task()
        with self._lock:
            if self._stopped:
                return
            if role is not None and role not in self._roles:
                self._roles.append(role)
            tid = self._track(task)
            self._open[key] = (name, tid, time.time_ns())

    def close(self, key: Any, end_ns: int) -> None:
        """A span ended; one still open when the trace stops is cut off there, as torch does."""
        with self._lock:
            opened = self._open.pop(key, None)
            if opened is not None and not self._stopped:
                self.spans.append((*opened, end_ns))

    def stop(self) -> None:
        """The trace stops: spans still open end now; later spans and roles are not recorded."""
        with self._lock:
            self._stopped = True
            stop_ns = time.time_ns()
            self.spans.extend((*opened, stop_ns) for opened in self._open.values())
            self._open.clear()

    def _track(self, task: Any) -> int:
        # Called under the lock.
        thread = threading.current_thread()
        if task is None and threading.get_ident() != self._owner_thread:
            tid = threading.get_native_id()
            if tid not in self.tracks:
                self.tracks[tid] = f"thread {thread.name} (torchstep_prof regions)"
            return tid
        # A task, or the owner's thread outside its task (a loop callback): never the owner's
        # track, where torch's ranges are.
        key = task if task is not None else ("loop callbacks", threading.get_ident())
        track = self._task_tracks.get(key)
        if track is None:
            track = self._task_tracks[key] = TASK_TRACK_BASE + len(self._task_tracks) + 1
            label = f"asyncio task {task.get_name()}" if task is not None else "asyncio loop callbacks"
            self.tracks[track] = f"{label} in thread {thread.name} (torchstep_prof regions)"
        return track

    def events(self, base_ns: int) -> Iterator[bytes]:
        """The spans and their tracks' names as Chrome trace events (JSON, one per item);
        ``ts`` counts µs from ``base_ns`` (torch's ``baseTimeNanoseconds``)."""
        pid = os.getpid()
        used = {tid for _, tid, _, _ in self.spans}
        for tid, track in self.tracks.items():
            if tid in used:
                yield json.dumps(
                    {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}}
                ).encode()
        for name, tid, start_ns, end_ns in self.spans:
            event = {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": (start_ns - base_ns) / 1000,
                "dur": (end_ns - start_ns) / 1000,
                "args": {"recorded by": "torchstep_prof (a region of another thread or asyncio task)"},
            }
            yield json.dumps(event).encode()
