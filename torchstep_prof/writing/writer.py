"""Writing stopped traces on one background thread: complete files or none, in order.

The block that ends a trace only stops torch's profiler and hands its record (a
:class:`~torchstep_prof.recording.stopped.StoppedTrace`) to :meth:`TraceWriter.write`. One writer
thread per process then exports the JSON (torch's ``export_chrome_trace``, which releases the GIL
and runs safely beside a new profiler's start, recording and stop:
tests/workers/export_while_recording.py), finishes its tail (other threads' spans,
``traceName``), compresses it and gives it the name the record holds, in the order the traces
ended. Past :data:`MAX_PENDING` waiting traces the next trace end waits, so memory stays bounded;
:meth:`TraceWriter.flush` (scope exit, the finish hook, ``tsp.flush()``, interpreter exit) waits
for every trace ended so far.

Each write works in a private folder (:mod:`torchstep_prof.writing.temp_files`: ``save_path``
may be shared), is checked (torch only logs when it cannot write), then linked to its final
name, never replacing a file (``_part<i>`` on a clash); a failure is warned about once per kind
and recorded. A plain thread and queue, not ``concurrent.futures``: an executor refuses work once
interpreter shutdown began, and a training thread outliving the main script still ends traces.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
import threading
import time
from typing import Any, Callable, Optional

import attrs

from .. import background
from .memory_snapshot import write_snapshot
from .range_marks import Range, mark_region_ranges
from .temp_files import WorkFolder, host_label, link_exclusively, remove, remove_dead_temporaries
from .trace_tail import TraceTailError, finish_tail, set_trace_name
from .trace_timeline import embed_timeline, process_identity, trace_timeline
from ..errors import TraceWriteWarning, warn
from ..naming import TraceName, build_trace_name
from ..summary.records import STORE, TraceRecord
from ..interrupts import interruptible
from ..recording.range_names import RANGE_NAMES
from ..recording.stopped import Outcome, StoppedTrace
from ..traces.reading.gpu_time import trace_gpu_ms

__all__ = ["MAX_PENDING", "OnWritten", "TraceWriter", "TraceWriteWarning"]

MAX_PENDING = 4
"""Traces waiting for the writer beyond which the next trace end waits (each holds torch's
results in memory until written)."""
_GZIP_LEVEL = 6  # level 9 (torch's choice) costs ~2x the time for ~5% smaller files


OnWritten = Callable[[TraceRecord], None]
"""Called on the writer thread with the summary's row once a trace's file is final."""


class _ExportFailed(Exception):
    pass


class TraceWriter:
    """The process's trace writer (one per engine) and its background thread."""

    def __init__(self) -> None:
        self.forget_after_fork()
        self._write_lock = threading.Lock()  # held by whichever thread writes the queue's head
        self._claimed: set[str] = set()
        self._cleaned: set[str] = set()  # folders already rid of dead processes' temporaries
        self._reported: set[tuple[str, str]] = set()
        self._cuda_target = 0  # the queue count up to the last job holding CUDA activity
        self._host = host_label()
        self._anchors_until = float("-inf")  # the end of the last clock anchor a trace carries
        self._ray_until = 0  # the number of the last side of a Ray call a trace carries

    # --- public -------------------------------------------------------------------------------

    def write(self, trace: StoppedTrace, on_written: OnWritten) -> None:
        """Queue the stopped ``trace`` for writing; ``on_written`` gets its summary row on the
        writer thread once the file is final. Failures are warned about once per kind and
        recorded. Waits (back-pressure) while more than :data:`MAX_PENDING` traces are queued;
        a KeyboardInterrupt there leaves the trace queued, to be written."""
        with self._lock:
            self._queue.append((trace, on_written))
            self._queued += 1
            if trace.records_cuda:
                self._cuda_target = self._queued
            self._changed.notify_all()
            target = self._queued - MAX_PENDING
        if not self.start():
            self._drain_here()
            return
        if target > self._done:
            self._wait_until(target, None, count=True)

    def flush(self, timeout: Optional[float] = None, *, count: bool = True) -> bool:
        """Wait until every trace queued so far is written (or recorded as failed); returns
        False when ``timeout`` ran out first. ``count``: add the wait to the costs' writer_wait_s
        (the training thread waiting)."""
        if threading.current_thread() is self._thread:
            return True  # a callback on the writer thread: waiting for itself would never end
        with self._lock:
            target = self._queued
            if self._done >= target:
                return True
        if not self.start():
            self._drain_here()
            return True
        return self._wait_until(target, timeout, count=count)

    def wait_for_cuda_exports(self) -> None:
        """Wait until every queued trace holding CUDA activity is written: a profiler started
        while one is exported leaves that trace's CUDA events with zero times (seen with torch
        2.11 and CUDA 13: kernels and runtime calls at ts 0, dur 0), so the next window's start
        waits for them. CPU-only traces keep being exported beside the next window."""
        with self._lock:
            target = self._cuda_target
            if self._done >= target:
                return
        self._wait_until(target, None, count=True)

    def forget_after_fork(self) -> None:
        """An empty queue and no thread: how a writer starts, and what a forked child has (the
        parent's writer thread does not exist there, and the child writes nothing)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job was queued or done
        # Stopped traces waiting for the writer; the head is being written.
        self._queue: collections.deque[tuple[StoppedTrace, OnWritten]] = collections.deque()
        self._queued = 0  # jobs ever queued / done: flush waits for a number, not for "empty"
        self._done = 0
        self._thread: Optional[threading.Thread] = None
        background.add(background.WRITES, self.flush)  # for good: a flush with nothing queued returns at once

    # --- the writer thread ------------------------------------------------------------------

    def start(self) -> bool:
        """Start the writer thread if needed (the engine calls it with the profiler's warm-up,
        so the first trace's end does not wait for a thread to start, ~4 ms); False when no
        thread can start (interpreter finalizing), and the caller writes in its own thread
        instead."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return True
            thread = threading.Thread(target=self._run, name="torchstep_prof-writer", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # "can't create new thread at interpreter shutdown"
                self._thread = None
                return False
            self._thread = thread
            return True

    def _run(self) -> None:
        # Daemon: it must not keep the interpreter alive; the at-exit flush waits for its work.
        while True:
            with self._lock:
                while not self._queue:
                    self._changed.wait()
            self._write_head()

    def _drain_here(self) -> None:
        """Write the queue in the calling thread (no writer thread can run)."""
        while self._write_head():
            pass

    def _write_head(self) -> bool:
        with self._write_lock:
            with self._lock:
                if not self._queue:
                    return False
                trace, on_written = self._queue[0]
            try:
                self._write_now(trace, on_written)
            except BaseException as exc:  # never let the writer thread die with work queued
                self._fail(trace.row(), f"unexpected error while writing: {exc!r}", 0.0)
            finally:
                _release(trace.results)
                with self._lock:
                    self._queue.popleft()
                    self._done += 1
                    self._changed.notify_all()
            return True

    @interruptible
    def _wait_until(self, target: int, timeout: Optional[float], *, count: bool) -> bool:
        t0 = time.perf_counter()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                with self._lock:
                    if self._done >= target:
                        return True
                    thread = self._thread
                    alive = thread is not None and thread.is_alive()
                if not alive:
                    self._drain_here()  # the writer thread is gone: nobody else will write these
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                # Polled outside the lock, not Condition.wait: Ctrl-C may land anywhere here
                # (see background.wait_for_event).
                time.sleep(background.POLL_S if left is None else min(left, background.POLL_S))
        finally:
            if count:
                STORE.add_costs(writer_wait_s=time.perf_counter() - t0)

    # --- one write ----------------------------------------------------------------------------

    def _write_now(self, trace: StoppedTrace, on_written: OnWritten) -> None:
        t0 = time.perf_counter()
        record, name, folder = trace.row(), trace.name, trace.save_path
        work: Optional[WorkFolder] = None
        try:
            self._prepare_folder(folder)
            work = WorkFolder(folder, self._host, os.getpid())
            raw_path = work.file("trace.json")
            self._export(trace, raw_path)
            ranges: list[Range] = []
            labels = _range_labels(trace)
            step_s = mark_region_ranges(raw_path, labels, name.step, ranges)
            if step_s is not None:  # the file's own wall time, the one `ls` and `summarize` read
                record = attrs.evolve(record, wall_s=step_s)
            self._add_timeline(trace, raw_path, ranges, labels, work.file("timeline.json"))
            target = self._free_target(folder, name)
            try:
                size = finish_tail(raw_path, os.path.abspath(target), trace.spans)
            except TraceTailError as exc:
                raise _ExportFailed(str(exc)) from None
            gpu_ms = _gpu_ms(trace, raw_path)
            export_s = time.perf_counter() - t0
            path, size = self._claim(raw_path, folder, name, target, size)
            snapshot = self._snapshot(trace, work.file("snapshot.pickle"), path)
        except (_ExportFailed, OSError) as exc:
            self._fail(record, _message(exc), t0, folder)
            return
        finally:
            if work is not None:
                work.remove()
        final = attrs.evolve(
            record, gpu_ms=gpu_ms, memory_snapshot=snapshot, path=path, size_bytes=size, export_s=export_s
        )
        STORE.add_costs(export_s=export_s)
        STORE.add_trace(final)
        try:
            on_written(final)
        except Exception as exc:  # the file is written and recorded: report, do not fail it
            warn(f"torchstep_prof: after writing {path}: {exc!r}", TraceWriteWarning)

    def _snapshot(self, trace: StoppedTrace, temporary: str, path: str) -> Optional[str]:
        """Write the trace's CUDA memory snapshot next to its file at ``path`` (if it has one);
        a snapshot that cannot be kept is one warning per kind, the trace stays."""
        if trace.memory_snapshot is None:
            return None
        written, problem = write_snapshot(trace.memory_snapshot, temporary, path)
        if problem is not None:
            if self._first(("memory snapshot", "")):  # one warning a process: each trace has its own
                warn(f"torchstep_prof: {problem}", TraceWriteWarning)
        return written

    def _prepare_folder(self, folder: str) -> None:
        if not os.path.isdir(folder):  # a hook may have moved or removed it since the last trace
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise _ExportFailed(f"cannot create {folder!r}: {exc.strerror or exc}") from None
        if folder not in self._cleaned:
            self._cleaned.add(folder)
            remove_dead_temporaries(folder, self._host)

    @staticmethod
    def _export(trace: StoppedTrace, raw_path: str) -> None:
        prof = trace.results
        if trace.outcome is Outcome.FAILED:
            raise _ExportFailed(trace.reason or "torch's stop failed")
        if prof is None:
            raise _ExportFailed("no profiler output to export")
        try:
            prof.export_chrome_trace(raw_path)
        except Exception as exc:  # torch raises a bare RuntimeError for some failures
            raise _ExportFailed(f"torch could not export the trace: {exc}") from None
        # torch does not raise when it cannot write (a full disk, a file size limit): it only
        # logs, and may leave its own ``.tmp`` file (removed with the other leftovers).
        if not os.path.exists(raw_path):
            raise _ExportFailed("torch wrote no complete trace (is the folder writable, the disk full?)")

    def _free_target(self, folder: str, name: TraceName, start: int = 0) -> str:
        """The first file name of ``name``, then with ``_part1``... that no file and no write of
        this process holds; reserved for this write."""
        part = start
        while True:
            target = os.path.join(folder, build_trace_name(attrs.evolve(name, part=part)))
            part += 1
            with self._lock:
                if target in self._claimed or os.path.lexists(target):
                    continue
                self._claimed.add(target)
                return target

    def _claim(self, raw_path: str, folder: str, name: TraceName, target: str, size: int) -> tuple[str, int]:
        """Give the finished file the name ``target`` (the next free one if another process
        took it meanwhile, with ``traceName`` following); returns its path and size."""
        compress = name.gzip
        while True:
            source = raw_path
            if compress:
                source = raw_path + ".gz"
                with open(raw_path, "rb") as plain, gzip.open(source, "wb", compresslevel=_GZIP_LEVEL) as packed:
                    shutil.copyfileobj(plain, packed, 1 << 20)
                size = os.path.getsize(source)
            try:
                if link_exclusively(source, target):
                    return target, size  # the work folder, removed after, holds the other names
            except OSError as exc:
                raise _ExportFailed(f"cannot name the trace {target!r}: {exc.strerror or exc}") from None
            # Another process took the name between the check and the link (rare): the next.
            target = self._free_target(folder, name, 1)
            if compress:
                remove(source)
            try:
                size = set_trace_name(raw_path, os.path.abspath(target))
            except TraceTailError as exc:
                raise _ExportFailed(str(exc)) from None

    def _add_timeline(
        self,
        trace: StoppedTrace,
        raw_path: str,
        ranges: list[Range],
        labels: dict[str, tuple[str, str]],
        work_path: str,
    ) -> None:
        """Put the process's spans for the trace's window in its ``torchstep_prof`` key, for
        ``torchstep-prof timeline`` (writing/trace_timeline.py), with the clock anchors passed
        and the sides of Ray calls noted since the previous trace. Extra: a trace whose spans cannot be read or added is written
        without them."""
        from ..timeline.wall_clock import recent_anchors, recent_ray
        from ..topology import current_topology

        anchors = [a for a in recent_anchors() if a[3] > self._anchors_until]
        ray, ray_until = recent_ray(after=self._ray_until)
        n = trace.name
        try:
            identity = process_identity(n.rank, n.world_size, current_topology().local_rank, trace.process_role)
            timeline = trace_timeline(raw_path, ranges, labels, list(trace.spans.spans), anchors, identity, ray)
            if timeline is not None and embed_timeline(raw_path, work_path, timeline):
                if anchors:
                    self._anchors_until = max(a[3] for a in anchors)
                self._ray_until = ray_until
        except (OSError, ValueError):
            remove(work_path)

    # --- records ------------------------------------------------------------------------------

    def _first(self, kind: tuple[str, str]) -> bool:
        """Whether a failure of this ``kind`` is the first of the process (then warned about)."""
        with self._lock:
            first = kind not in self._reported
            self._reported.add(kind)
        return first

    def _fail(self, record: TraceRecord, error: str, t0: float, folder: Optional[str] = None) -> None:
        export_s = time.perf_counter() - t0 if t0 else 0.0
        final = attrs.evolve(record, error=error, export_s=export_s)
        STORE.add_costs(export_s=export_s)
        STORE.add_trace(final)
        # The kind of failure, without the (per-file) path quoted in it: one warning per kind.
        if self._first((folder or "", error.split("'")[0])):
            warn(
                f"torchstep_prof: trace {record.role}/{record.stage} step {record.step} not written: {error}. "
                "Training continues; later failures of this kind are only recorded.",
                TraceWriteWarning,
            )


def _gpu_ms(trace: StoppedTrace, raw_path: str) -> Optional[float]:
    """The GPU time of a trace that recorded CUDA activity (read back from the exported file,
    on this thread: one rule with ``summarize``); None otherwise, or when it cannot be read."""
    if not trace.records_cuda:
        return None
    try:
        with open(raw_path, "rb") as f:
            data = json.load(f)
        return trace_gpu_ms(data, trace.name.step) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _release(results: Any) -> None:
    """Drop torch's results once the trace is written or failed: they hold every event, and,
    after a failed export (a full disk), torch's ``.tmp`` file open, so its space would stay
    taken until a garbage collection found the profile object."""
    inner = getattr(results, "profiler", None)
    if inner is not None and hasattr(inner, "kineto_results"):
        inner.kineto_results = None


def _range_labels(trace: StoppedTrace) -> dict[str, tuple[str, str]]:
    """Every region range name the trace may hold, with its (role, stage): each pair seen so
    far (the table only grows; ``list()`` copies it whole while the training thread may add to
    it), and the owner's."""
    labels = {name: (role, stage) for role, stages in list(RANGE_NAMES.items()) for stage, name in list(stages.items())}
    if trace.owner_range is not None and trace.owner_range not in labels:
        labels[trace.owner_range] = (trace.name.role, trace.name.stage)
    return labels


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        # A file of the write's work folder is reached through /proc/self/fd: not a name to show.
        where = f" ({exc.filename})" if exc.filename and not str(exc.filename).startswith("/proc/") else ""
        return f"cannot write the trace: {exc.strerror or exc}{where}"
    return str(exc)
