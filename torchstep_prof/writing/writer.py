"""Writing stopped sessions' traces on one background thread: complete files or none, in order.

The block that ends a trace only stops torch's profiler and hands the session to
:meth:`TraceWriter.write`; one writer thread per process then exports the JSON (torch's
``export_chrome_trace`` of the stopped results, which releases the GIL and runs safely while a
new profiler starts, records and stops: tests/workers/export_while_recording.py proves it under
threads, asyncio and repeated windows), finishes its tail (other threads' spans,
``traceName``), compresses it, and gives it its name. Files are written in the order the traces
ended. When more than :data:`MAX_PENDING` traces wait, the next trace end waits for the writer,
so memory stays bounded. :meth:`TraceWriter.flush` waits for every trace ended so far; the scope
exit, the finish hook, ``tsp.flush()`` and interpreter exit call it.

Every write happens in a private work folder of its own
(:mod:`torchstep_prof.writing.temp_files`: ``save_path`` may be shared) and is checked (torch only
logs when it cannot write) before it is linked to its final name, never replacing a file
(``_part<i>`` on a clash). A write removes its work folder, torch's own temporary included, and a
failed one is warned about once per kind and recorded. The writer is a plain thread and queue, not ``concurrent.futures``: an executor
refuses work once interpreter shutdown began, and a training thread that outlives the main
script still ends traces then.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
import threading
import time
from typing import Callable, Optional

import attrs

from .. import background
from .memory_snapshot import write_snapshot
from .range_marks import mark_region_ranges
from .temp_files import WorkFolder, host_label, remove, remove_dead_temporaries
from .trace_tail import TraceTailError, finish_tail, set_trace_name
from ..errors import TraceWriteWarning, warn
from ..traces.names import TraceName, build_trace_name, with_part
from ..summary.records import STORE, TraceRecord
from ..interrupts import interruptible
from ..recording.range_names import RANGE_NAMES
from ..recording.session import TraceSession, records_cuda
from ..traces.reading.gpu_time import trace_gpu_ms

__all__ = ["MAX_PENDING", "TraceWriter", "TraceWriteWarning"]

MAX_PENDING = 4
"""Traces waiting for the writer beyond which the next trace end waits (each holds torch's
results in memory until written)."""
_GZIP_LEVEL = 6  # level 9 (torch's choice) costs ~2x the time for ~5% smaller files


class _ExportFailed(Exception):
    pass


class _Job:
    """One stopped session waiting for the writer."""

    __slots__ = ("session", "record", "name", "on_written")

    def __init__(
        self,
        session: TraceSession,
        record: TraceRecord,
        name: TraceName,
        on_written: Callable[[TraceRecord], None],
    ) -> None:
        self.session = session
        self.record = record
        self.name = name
        self.on_written = on_written


class TraceWriter:
    """The process's trace writer (one per engine) and its background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job was queued or done
        self._queue: collections.deque[_Job] = collections.deque()  # the head is being written
        self._queued = 0  # jobs ever queued / done: flush waits for a number, not for "empty"
        self._done = 0
        self._thread: Optional[threading.Thread] = None
        self._write_lock = threading.Lock()  # held by whichever thread writes the queue's head
        self._claimed: set[str] = set()
        self._cleaned: set[str] = set()  # folders already rid of dead processes' temporaries
        self._reported: set[tuple[str, str]] = set()
        self._cuda_target = 0  # the queue count up to the last job holding CUDA activity
        self._host = host_label()
        self._unregister = background.add(background.WRITES, self.flush)

    # --- public -------------------------------------------------------------------------------

    def write(self, session: TraceSession, on_written: Callable[[TraceRecord], None]) -> None:
        """Queue the stopped ``session`` for writing; ``on_written`` gets the record on the
        writer thread once the file is final. Failures are warned about once per kind and
        recorded. Waits (back-pressure) while more than :data:`MAX_PENDING` traces are queued;
        a KeyboardInterrupt there leaves the trace queued, to be written."""
        name = self._name_for(session)
        job = _Job(session, self._record_for(session, name), name, on_written)
        with self._lock:
            self._queue.append(job)
            self._queued += 1
            if records_cuda(session.config.contents):
                self._cuda_target = self._queued
            self._changed.notify_all()
            target = self._queued - MAX_PENDING
        if not self._ensure_thread():
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
        if not self._ensure_thread():
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

    @property
    def has_pending(self) -> bool:
        return self._done < self._queued

    def forget_after_fork(self) -> None:
        # The parent's writer thread does not exist in a forked child, which writes nothing.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._queued = self._done = 0
        self._thread = None
        self._unregister = background.add(background.WRITES, self.flush)

    # --- the writer thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread now (with the profiler's warm-up), so the first trace's end
        does not wait for a thread to start (~4 ms)."""
        self._ensure_thread()

    def _ensure_thread(self) -> bool:
        """Start the writer thread if needed; False when no thread can start (interpreter
        finalizing), and the caller writes in its own thread instead."""
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
                job = self._queue[0]
            self._write_one(job)
            return True

    def _write_one(self, job: _Job) -> None:
        try:
            self._write_now(job)
        except BaseException as exc:  # never let the writer thread die with work queued
            self._fail(job.record, f"unexpected error while writing: {exc!r}", 0.0)
        finally:
            job.session.release()
            with self._lock:
                self._queue.popleft()
                self._done += 1
                self._changed.notify_all()

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

    def _write_now(self, job: _Job) -> None:
        t0 = time.perf_counter()
        session, record, name = job.session, job.record, job.name
        folder = session.config.save_path
        work: Optional[WorkFolder] = None
        try:
            self._prepare_folder(folder)
            work = WorkFolder(folder, self._host, os.getpid())
            raw_path = work.file("trace.json")
            self._export(session, raw_path)
            step_s = mark_region_ranges(raw_path, _range_names(session), session.step)
            if step_s is not None:  # the file's own wall time, the one `ls` and `summarize` read
                record = attrs.evolve(record, wall_s=step_s)
            final_name = build_trace_name(name)
            target = self._free_target(folder, final_name)
            try:
                size = finish_tail(raw_path, os.path.abspath(target), session.spans)
            except TraceTailError as exc:
                raise _ExportFailed(str(exc)) from None
            gpu_ms = _gpu_ms(session, raw_path)
            export_s = time.perf_counter() - t0
            path, size = self._claim(raw_path, folder, final_name, target, size, compress=name.gzip)
            snapshot = self._snapshot(session, work.file("snapshot.pickle"), path)
        except (_ExportFailed, OSError) as exc:
            self._fail(record, _message(exc), t0, folder)
            return
        finally:
            if work is not None:
                work.remove()
        record = attrs.evolve(record, gpu_ms=gpu_ms, memory_snapshot=snapshot)
        self._finish(record, path, size, export_s, job.on_written)

    def _snapshot(self, session: TraceSession, temporary: str, path: str) -> Optional[str]:
        """Write the session's CUDA memory snapshot next to its trace at ``path`` (if it has
        one); a snapshot that cannot be kept is one warning per kind, the trace stays."""
        snapshot, session.memory_snapshot = session.memory_snapshot, None
        if snapshot is None:
            return None
        written, problem = write_snapshot(snapshot, temporary, path)
        if problem is not None:
            key = ("memory snapshot", "")  # one warning a process: each trace has its own
            with self._lock:
                first = key not in self._reported
                self._reported.add(key)
            if first:
                warn(f"torchstep_prof: {problem}", TraceWriteWarning, stacklevel=2)
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
    def _export(session: TraceSession, raw_path: str) -> None:
        prof = session.profile
        if session.no_output is not None:
            raise _ExportFailed(session.no_output)
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

    def _free_target(self, folder: str, final_name: str, start: int = 0) -> str:
        """The first name of ``final_name``, ``_part1``... that no file and no write of this
        process holds; reserved for this write."""
        part = start
        while True:
            target = os.path.join(folder, with_part(final_name, part))
            part += 1
            with self._lock:
                if target in self._claimed or os.path.lexists(target):
                    continue
                self._claimed.add(target)
                return target

    def _claim(
        self, raw_path: str, folder: str, final_name: str, target: str, size: int, *, compress: bool
    ) -> tuple[str, int]:
        """Give the finished file the name ``target`` (the next free one if another process
        took it meanwhile, with ``traceName`` following); returns its path and size."""
        while True:
            source = raw_path
            if compress:
                source = raw_path + ".gz"
                with open(raw_path, "rb") as plain, gzip.open(source, "wb", compresslevel=_GZIP_LEVEL) as packed:
                    shutil.copyfileobj(plain, packed, 1 << 20)
                size = os.path.getsize(source)
            if _link(source, target):
                return target, size  # the work folder, removed after, holds the other names
            # Another process took the name between the check and the link (rare): the next.
            target = self._free_target(folder, final_name, 1)
            if compress:
                remove(source)
            try:
                size = set_trace_name(raw_path, os.path.abspath(target))
            except TraceTailError as exc:
                raise _ExportFailed(str(exc)) from None

    # --- records ------------------------------------------------------------------------------

    @staticmethod
    def _name_for(session: TraceSession) -> TraceName:
        return TraceName(
            role=session.file_role,
            stage=session.file_stage,
            step=session.step,
            rank=session.topology.rank,
            world_size=session.topology.world_size,
            pid=os.getpid(),
            timestamp=session.started_at,
            gzip=session.config.gzip,
        )

    @staticmethod
    def _record_for(session: TraceSession, name: TraceName) -> TraceRecord:
        return TraceRecord(
            role=name.role,
            stage=name.stage,
            step=name.step,
            rank=name.rank,
            world_size=name.world_size,
            discrete=not session.fused,
            path=None,
            occurrence=session.occurrence,
            wall_s=session.wall_s,
            start_s=session.start_s,
            stop_s=session.stop_s,
        )

    def _finish(
        self, record: TraceRecord, path: str, size: int, export_s: float, on_written: Callable[[TraceRecord], None]
    ) -> None:
        final = attrs.evolve(record, path=path, size_bytes=size, export_s=export_s)
        STORE.add_costs(export_s=final.export_s)
        STORE.add_trace(final)
        try:
            on_written(final)
        except Exception as exc:  # the file is written and recorded: report, do not fail it
            warn(f"torchstep_prof: after writing {path}: {exc!r}", TraceWriteWarning, stacklevel=2)

    def _fail(self, record: TraceRecord, error: str, t0: float, folder: Optional[str] = None) -> None:
        export_s = time.perf_counter() - t0 if t0 else 0.0
        final = attrs.evolve(record, error=error, export_s=export_s)
        STORE.add_costs(export_s=export_s)
        STORE.add_trace(final)
        # The kind of failure, without the (per-file) path quoted in it: one warning per kind.
        key = (folder or "", error.split("'")[0])
        with self._lock:
            first = key not in self._reported
            self._reported.add(key)
        if first:
            warn(
                f"torchstep_prof: trace {record.role}/{record.stage} step {record.step} not written: {error}. "
                "Training continues; later failures of this kind are only recorded.",
                TraceWriteWarning,
                stacklevel=2,
            )


def _gpu_ms(session: TraceSession, raw_path: str) -> Optional[float]:
    """The GPU time of a trace that recorded CUDA activity (read back from the exported file,
    on this thread: one rule with ``summarize``); None otherwise, or when it cannot be read."""
    if not records_cuda(session.config.contents):
        return None
    try:
        with open(raw_path, "rb") as f:
            trace = json.load(f)
        return trace_gpu_ms(trace, session.step) if isinstance(trace, dict) else None
    except (OSError, ValueError):
        return None


def _range_names(session: TraceSession) -> set[str]:
    """Every region range name the trace may hold: each (role, stage) pair seen so far (the
    table only grows; ``list()`` copies it whole while the training thread may add to it)."""
    names = {name for stages in list(RANGE_NAMES.values()) for name in list(stages.values())}
    if session.owner_range is not None:
        names.add(session.owner_range)
    return names


def _link(source: str, target: str) -> bool:
    """Name ``source`` ``target`` unless a file holds that name; False when one does."""
    try:
        os.link(source, target)  # fails if the target exists: no overwrite, no race
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        # A file system without hard links: check, then rename (same folder, atomic).
        if os.path.lexists(target):
            return False
        try:
            os.rename(source, target)
        except OSError:
            raise _ExportFailed(f"cannot name the trace {target!r}: {exc.strerror or exc}") from None
        return True


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        # A file of the write's work folder is reached through /proc/self/fd: not a name to show.
        where = f" ({exc.filename})" if exc.filename and not str(exc.filename).startswith("/proc/") else ""
        return f"cannot write the trace: {exc.strerror or exc}{where}"
    return str(exc)
