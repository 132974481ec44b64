"""Writing a stopped session's trace: complete files or none, never an overwrite.

torch writes the JSON under a hidden temporary name inside ``save_path``, unique to the process
and the write (same folder, so the final step is a link or rename; no shared scratch folder that
another thread or rank could remove mid-write); the file is checked (torch only logs when it
cannot write), then given its name without ever replacing an existing file (``_part<i>`` on a
clash). With ``gzip=True`` the compression runs on one background thread;
:meth:`TraceWriter.flush` waits for it.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import itertools
import os
import re
import shutil
import threading
import time
from typing import Callable, Optional

import attrs

from .errors import TraceWriteWarning, warn
from .naming import TraceName, build_trace_name, with_part
from .record_store import STORE, TraceRecord
from ._spans import SpanLog
from .session import TraceSession

__all__ = ["TraceWriter", "TraceWriteWarning"]

TEMP_PREFIX = ".torchstep_prof-partial-"
_GZIP_LEVEL = 6  # level 9 (torch's choice) costs ~2x the time for ~5% smaller files


class _ExportFailed(Exception):
    pass


class TraceWriter:
    """Exports sessions to files; process-wide (one per engine)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimed: set[str] = set()
        self._pending: list[concurrent.futures.Future[None]] = []
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._reported: set[tuple[str, str]] = set()
        self._writes = itertools.count(1)

    # --- public -------------------------------------------------------------------------------

    def write(self, session: TraceSession, on_written: Callable[[TraceRecord], None]) -> None:
        """Export ``session``; ``on_written`` gets the record once the file is final (for gzip,
        later, on the compression thread). Failures are warned about once and recorded."""
        t0 = time.perf_counter()
        name = self._name_for(session)
        record = self._record_for(session, name)
        folder = session.config.save_path
        final_name = build_trace_name(name)
        # Short, so that a final name near the 255-byte limit never fails at the temporary step.
        raw_path = os.path.join(folder, f"{TEMP_PREFIX}{os.getpid()}-{next(self._writes)}.partial")
        try:
            size = self._export(session, folder, raw_path)
            if not name.gzip:
                path = self._claim(raw_path, folder, final_name)
                self._finish(record, path, size, time.perf_counter() - t0, on_written)
                return
        except _ExportFailed as exc:
            self._fail(record, str(exc), t0, raw_path)
            return
        export_s = time.perf_counter() - t0
        future = self._pool().submit(self._compress, raw_path, final_name, record, export_s, folder, on_written)
        with self._lock:
            self._pending.append(future)

    def flush(self) -> None:
        """Wait until every pending (gzip) file is on disk."""
        with self._lock:
            pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def forget_after_fork(self) -> None:
        # The parent's compression thread does not exist in a forked child.
        self._executor = None
        self._pending = []
        self._lock = threading.Lock()

    # --- steps --------------------------------------------------------------------------------

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
            wall_s=session.wall_s,
            start_s=session.start_s,
            stop_s=session.stop_s,
        )

    def _export(self, session: TraceSession, folder: str, raw_path: str) -> int:
        """Export to ``raw_path``; returns the file's size."""
        if not os.path.isdir(folder):  # a hook may have moved or removed it since the last trace
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise _ExportFailed(f"cannot create {folder!r}: {exc.strerror or exc}") from None
        prof = session.profile
        if prof is None:
            raise _ExportFailed("no profiler output to export")
        try:
            prof.export_chrome_trace(raw_path)
        except Exception as exc:  # torch raises a bare RuntimeError for some failures
            raise _ExportFailed(f"torch could not export the trace: {exc}") from None
        # torch does not raise when it cannot write: it only logs. Check the file is whole.
        size = _complete_size(raw_path)
        if not size:
            raise _ExportFailed(f"torch wrote no complete trace to {raw_path!r} (is the folder writable, the disk full?)")
        if session.spans:
            size = _add_thread_spans(raw_path, session.spans)
        return size

    def _compress(
        self,
        raw_path: str,
        final_name: str,
        record: TraceRecord,
        export_s: float,
        save_path: str,
        on_written: Callable[[TraceRecord], None],
    ) -> None:
        t0 = time.perf_counter()
        gz_path = raw_path + ".gz"
        try:
            with open(raw_path, "rb") as source, gzip.open(gz_path, "wb", compresslevel=_GZIP_LEVEL) as target:
                shutil.copyfileobj(source, target, 1 << 20)
            _remove(raw_path)
            size = os.path.getsize(gz_path)
            path = self._claim(gz_path, save_path, final_name)
        except (OSError, _ExportFailed) as exc:
            self._fail(record, f"cannot write the gzip trace: {exc}", t0, raw_path, gz_path, export_s=export_s)
            return
        # The compression ran off the training thread: only the export counts as its cost.
        self._finish(record, path, size, export_s, on_written)

    def _claim(self, source: str, save_path: str, final_name: str) -> str:
        """Give ``source`` the first free name of ``final_name``, ``_part1``...; never replace a file."""
        part = 0
        while True:
            target = os.path.join(save_path, with_part(final_name, part))
            part += 1
            with self._lock:
                if target in self._claimed:
                    continue
                self._claimed.add(target)
            try:
                os.link(source, target)  # fails if the target exists: no overwrite, no race
            except FileExistsError:
                continue
            except OSError as exc:
                # A file system without hard links: check, then rename (same folder, atomic).
                if os.path.exists(target):
                    continue
                try:
                    os.rename(source, target)
                except OSError:
                    raise _ExportFailed(f"cannot name the trace {target!r}: {exc.strerror or exc}") from None
                return target
            _remove(source)
            return target

    def _finish(
        self, record: TraceRecord, path: str, size: int, export_s: float, on_written: Callable[[TraceRecord], None]
    ) -> None:
        final = attrs.evolve(record, path=path, size_bytes=size, export_s=export_s)
        STORE.add_costs(export_s=final.export_s)
        STORE.add_trace(final)
        on_written(final)

    def _fail(self, record: TraceRecord, error: str, t0: float, *leftovers: str, export_s: float = 0.0) -> None:
        for path in leftovers:
            _remove(path)
        final = attrs.evolve(record, error=error, export_s=export_s + time.perf_counter() - t0)
        STORE.add_costs(export_s=final.export_s)
        STORE.add_trace(final)
        # The kind of failure, without the (per-file) path quoted in it: one warning per kind.
        key = (os.path.dirname(leftovers[0]) if leftovers else "", error.split("'")[0])
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

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="torchstep_prof-gzip")
            return self._executor


_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')
_HEAD_BYTES = 1 << 16
_TAIL_BYTES = 1 << 16


def _add_thread_spans(path: str, spans: SpanLog) -> int:
    """Write other threads' and asyncio tasks' regions into the trace at ``path``; returns its new size.

    Only traces during which another thread entered a region pay for this. The events are
    spliced in before the end of torch's ``traceEvents`` array (the file's tail is rewritten,
    not the file), falling back to a full parse when the file does not look as torch writes it.
    """
    try:
        with open(path, "r+b") as f:
            head = f.read(_HEAD_BYTES)
            size = f.seek(0, os.SEEK_END)
            tail_start = max(0, size - _TAIL_BYTES)
            f.seek(tail_start)
            tail = f.read()
            base = _BASE_TIME.search(head)
            # torch ends the file with `...}\n  ],"traceName": "<path>" }`: the `]` before the
            # last "traceName" key closes traceEvents.
            trace_name = tail.rfind(b'"traceName"')
            end_of_events = tail.rfind(b"]", 0, trace_name) if trace_name > 0 else -1
            before = tail[:end_of_events].rstrip() if end_of_events > 0 else b""
            if base is None or not before.endswith(b"}"):
                return _rewrite_with_spans(path, spans)
            events = b"".join(b",\n" + event for event in spans.events(int(base.group(1))))
            f.seek(tail_start + end_of_events)
            f.write(events + tail[end_of_events:])
            f.truncate()
            return f.tell()
    except (OSError, ValueError) as exc:
        raise _ExportFailed(f"cannot add other threads' regions to the trace: {exc}") from None


def _rewrite_with_spans(path: str, spans: SpanLog) -> int:
    with open(path, "rb") as f:
        trace = json.load(f)  # ValueError for a file torch wrote unescaped: the caller reports it
    base_ns = int(trace.get("baseTimeNanoseconds") or 0)
    trace.setdefault("traceEvents", []).extend(json.loads(event) for event in spans.events(base_ns))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return os.path.getsize(path)


def _complete_size(path: str) -> int:
    """The size of the JSON file at ``path`` when it ends as a whole trace does, else 0."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, 64, max(0, size - 64)) if size else b""
    except OSError:
        return 0
    finally:
        os.close(fd)
    return size if tail.rstrip().endswith(b"}") else 0


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

