"""The profiling engine: who owns this process's one torch profiler, and what happens when it stops.

Exactly one profiler runs per process, owned by the outermost profiled block (a region in
discrete mode, a ``step`` block in fused mode). Everything entered while it records, in any
thread or asyncio task, becomes a range in that trace. The engine is process-wide by nature
(torch's profiler is), so its state sits on one object guarded by a lock; the scope stacks
themselves live in context variables (:mod:`torchstep_prof.selection.frames`). What interpreter
exit and a fork do to it is :mod:`torchstep_prof.process_exit`; the profiler's one-time warm-up
is :mod:`torchstep_prof.recording.warm_up`.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import itertools
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch

from . import background
from .recording.foreign import foreign_profiler
from .errors import ForeignProfilerWarning, ProfilerStartWarning, TorchstepProfWarning, warn
from .recording.range_names import range_name
from .selection import open_blocks
from .selection.frames import Frame, HookScope, when_env_sets_a_hook
from .selection.rules import StepAction, last_selected_step
from .recording.session import NESTED_FAST_PATH, TraceSession, entered, new_range
from .region_metrics.endpoint import when_started as when_metrics_start
from .topology import current_topology

if TYPE_CHECKING:
    from .summary.records import TraceRecord
    from .writing.writer import TraceWriter

__all__ = ["CURRENT_STEP", "ENGINE", "ForeignProfilerWarning", "ProfilerStartWarning"]


# The innermost ``step(n)`` block of this thread / task (an object with a ``number``).
CURRENT_STEP: contextvars.ContextVar[Any] = contextvars.ContextVar("torchstep_prof_step")

class _OwnedTrace:
    """Returned to the block that owns a trace; its ``__exit__`` stops and writes it, once
    (interpreter exit may have done it before a suspended generator's block exits)."""

    __slots__ = ("_engine", "session", "_done")

    def __init__(self, engine: Engine, session: TraceSession) -> None:
        self._engine = engine
        self.session = session
        self._done = False

    def __exit__(self, *exc_info: Any) -> None:
        with self._engine.lock:
            if self._done:
                return
            self._done = True
        self._engine.stop_session(self.session)


_WRITER_LOCK = threading.Lock()  # makes the one writer (never held while it writes)


class Engine:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: Optional[TraceSession] = None  # the trace recording now, if any
        self._owner: Optional[_OwnedTrace] = None  # what stops it (interpreter exit may have to)
        # A thread is starting or stopping torch's profiler (under self.lock): Kineto crashes
        # when one thread starts a profiler while another stops one. (Exporting a stopped one
        # on the writer thread meanwhile is safe: see writing/writer.py.)
        self._busy = False
        self._stopping = False  # a thread is stopping and writing the last trace
        self._writer: Optional[TraceWriter] = None  # made with the first trace: see writer
        self.forked = False
        self.warmed = False
        self.warm_up_deferred = False  # torchstep-prof run warms up near its first selected step
        # role -> stage -> counter (two lookups of interned strings beat building a tuple key)
        self.counters: dict[str, dict[str, Iterator[int]]] = {}
        # (role, stage, step) -> traces started so far; (None, None, step) for fused ones
        self._occurrences: dict[tuple[Optional[str], Optional[str], int], int] = {}
        self._atexit_registered = False
        # Hook scopes finished while a trace was recording: started once it is written.
        self._deferred_finishes: list[tuple[HookScope, Any]] = []
        self._warned: set[str] = set()
        self.summary_wanted = True  # the ``summary`` field of the last config that profiled

    @property
    def writer(self) -> TraceWriter:
        """The background trace writer, made (and its module imported) when first needed."""
        writer = self._writer
        if writer is None:
            with _WRITER_LOCK:
                if self._writer is None:
                    from .writing.writer import TraceWriter

                    self._writer = TraceWriter()
                writer = self._writer
        return writer

    # --- regions and steps -------------------------------------------------------------------

    def start_region(self, frame: Frame, role: str, stage: str, step: int, action: StepAction) -> Any:
        """Carry out what ``profile_region`` decided (``action`` for ``step`` under ``frame``):
        start a trace, or be a range in one another thread started meanwhile. Returns an object
        whose ``__exit__`` must be called when the region exits, or None."""
        if self.forked:
            return None
        session = self.session
        if session is not None:
            return entered(self.range_in(session, role, stage))
        return self._start(frame, role, stage, step, action)

    @staticmethod
    def range_in(session: TraceSession, role: str, stage: str) -> Any:
        """A region's range in the running ``session``, not yet entered: a torch range in the
        owner's thread and asyncio task, a span (written in at export) in any other."""
        name = range_name(role, stage)
        if session.owns_here():
            if session.fused:
                session.add_role(role)
            return new_range(name)
        return session.span(name, role)

    def enter_step(self, frame: Frame, number: int, action: StepAction) -> Any:
        """A fused ``step`` block's entry: start the trace it owns (its step is selected)."""
        if self.forked or self.session is not None:
            return None
        return self._start(frame, None, None, number, action)

    def step_began_in_trace(self, number: int) -> None:
        """A step block begins while a trace records: remember it if the trace belongs to a
        region left open past its own step's end (its trace now holds this step's work)."""
        session = self.session
        if session is not None and session.left_open and number != session.step:
            with self.lock:
                if number not in session.later_steps:
                    session.later_steps.append(number)

    def step_ending(self, block: Any) -> None:
        """A step block ends while a trace records: a region that owns it, entered in that
        block, is being left open across steps (a generator suspended inside it, say)."""
        session = self.session
        if session is not None and session.step_block is block and not session.fused:
            session.left_open = True

    def step_exited(self, frame: Frame, number: int) -> None:
        """After a ``step`` block: finish every enclosing hook scope whose schedule has just run
        its last selected step: the schedule in force where its ``on_finish`` was entered, or,
        for an ``on_finish`` entered outside any schedule, the one in force at this step."""
        scope = frame.hook_scope
        while scope is not None:
            if not scope.finished:
                last = last_selected_step(scope.config.schedule or frame.config.schedule)
                if last is not None and number >= last:
                    self.finish(scope, frame.config)
            scope = scope.parent

    def forget_occurrences(self) -> None:
        """Count occurrences afresh, as a new process would (tests running many jobs in one)."""
        with self.lock:
            self._occurrences.clear()

    def count(self, role: str, stage: str) -> int:
        """The next number of the per-process counter of (role, stage), from 1."""
        stages = self.counters.get(role)
        if stages is None:
            stages = self.counters.setdefault(role, {})
        counter = stages.get(stage)
        if counter is None:  # regions call next() on it (cheaper than its bound __next__)
            counter = stages.setdefault(stage, itertools.count(1))
        return next(counter)

    # --- the profiler window -----------------------------------------------------------------

    def _start(self, frame: Frame, role: Optional[str], stage: Optional[str], step: int, action: StepAction) -> Any:
        session = TraceSession(
            config=frame.config,
            role=role,
            stage=stage,
            step=step,
            action=action,
            topology=current_topology(),
            hook_scope=frame.hook_scope,
        )
        while True:
            with self.lock:
                if not self._busy or self.session is not None:
                    running = self.session
                    if running is None:
                        self._busy = True
                        key = (role, stage, step)
                        session.occurrence = self._occurrences[key] = self._occurrences.get(key, 0) + 1
                    break
            # Another thread starting, stopping or warming up a profiler: wait for it (a few ms,
            # ~1 s for a warm-up) rather than lose this selected step's trace. Polled outside the
            # lock, not Condition.wait: a Ctrl-C may land anywhere (see background.wait_for_event).
            time.sleep(background.POLL_S)
        if running is not None:  # another thread's trace is recording: be a range in it
            if role is None:
                return None
            return entered(self.range_in(running, role, stage or ""))
        if self._foreign_profiler_running():  # none of ours runs (busy is ours): theirs
            self._set_idle()
            if role is not None and torch.autograd._profiler_enabled():
                # Theirs records in this very thread: a range in their trace is harmless there.
                return entered(new_range(range_name(role, stage or "")))
            return None
        self.ensure_atexit()
        self.summary_wanted = frame.config.summary
        try:
            if not self.warmed:
                self._warm_up_now(frame.config.contents)
            session.start()
        except BaseException as exc:
            self._set_idle()
            if not isinstance(exc, Exception):  # KeyboardInterrupt: nothing left half-started
                raise
            label = f"{role}/{stage}" if role is not None else "fused trace"
            warn(
                f"torchstep_prof: the profiler failed to start for {label} step {step} ({exc!r}); "
                "the block runs unprofiled",
                ProfilerStartWarning,
                stacklevel=4,
            )
            session.record_unwritten(f"profiler failed to start: {exc!r}")
            return None
        owner = _OwnedTrace(self, session)
        if role is not None:
            session.step_block = CURRENT_STEP.get(None)
        with self.lock:
            # Published only once torch's profiler runs: a region that sees it may open a range.
            self.session, self._owner, self._busy = session, owner, False
            if role is not None and CURRENT_STEP.get(None) is not None and session.owner_task is None \
                    and frame.metrics is None:  # a timed region is never a bare range
                # Regions nested here, in this thread (outside asyncio), need no counter and no
                # checks.
                NESTED_FAST_PATH.frame, NESTED_FAST_PATH.thread = frame, session.owner_thread
        return owner

    def stop_session(self, session: TraceSession) -> None:
        """Stop ``session`` (always), then hand it to the background writer when its step
        records. Only torch's ``stop()`` runs here; the export runs on the writer thread. Never
        raises, except a KeyboardInterrupt (the trace is then still written or recorded)."""
        if self.forked:  # a block inherited by a forked child: the parent writes its trace
            return
        with self.lock:
            # Unpublished before torch stops: no new range is opened into a stopping trace, and
            # no other thread starts a profiler until this one is stopped.
            if self.session is session:
                self.session = self._owner = None
                NESTED_FAST_PATH.frame = NESTED_FAST_PATH.thread = None
            self._busy = self._stopping = True
        try:
            try:
                session.stop()
            finally:
                _store().add_costs(start_s=session.start_s, stop_s=session.stop_s)
                self._set_idle()  # the export runs beside the next profiler: see writing/writer.py
                if session.lost is not None:
                    self._record_lost(session)
                elif session.action is StepAction.RECORD:
                    # Also after a KeyboardInterrupt inside stop(): what was recorded is written,
                    # or its failure recorded, never dropped silently.
                    self._queue_write(session)
                with self.lock:  # queued first: a hook started now waits for this write
                    self._stopping = False
                    deferred, self._deferred_finishes = self._deferred_finishes, []
                # Hooks deferred while this trace recorded: their threads wait for its write.
                self._start_hooks(deferred)
        except Exception as exc:  # never let profiling replace the user's exception or result
            self._warn_once("stop", f"torchstep_prof: stopping or writing a trace failed: {exc!r}", TorchstepProfWarning)

    def _queue_write(self, session: TraceSession) -> None:
        hook_scope: Optional[HookScope] = session.hook_scope
        roles = session.file_roles

        def on_written(record: TraceRecord) -> None:  # on the writer thread, once the file is final
            if hook_scope is not None and record.path is not None:
                hook_scope.add_trace(record.path, roles)
            if session.left_open:
                session.report_left_open(record)

        self.writer.write(session, on_written)

    def drop_running_trace(self) -> None:
        """Let the trace recording now end without a file (``torchstep-prof run`` drops a step
        that no optimizer step ended: it is not a step's trace)."""
        session = self.session
        if session is not None:
            session.action = StepAction.WARMUP  # recorded, stopped, not written

    def _record_lost(self, session: TraceSession) -> None:
        warn(f"torchstep_prof: trace of step {session.step} not written: {session.lost}", ForeignProfilerWarning, stacklevel=4)
        if session.action is StepAction.RECORD:
            session.record_unwritten(session.lost)

    def _foreign_profiler_running(self) -> bool:
        """Someone else's profiler records or warms up somewhere in the process (the caller
        holds the busy state, so none of ours runs): a second Kineto session would crash theirs
        at its exit. Warned about once."""
        reason = foreign_profiler()
        if reason is None:
            return False
        self._warn_once(
            "foreign",
            f"torchstep_prof: {reason}; torchstep_prof starts no profiler of its own while it runs "
            "(a second Kineto session would crash it): regions run unprofiled meanwhile",
            ForeignProfilerWarning,
        )
        return True

    def _set_idle(self) -> None:
        with self.lock:
            self._busy = False

    def warm_up(self, contents: tuple[str, ...] = ()) -> None:
        """Pay torch.profiler's one-time start-up costs now, outside any step, instead of inside
        the first profiled one: ~1 s for the first start (torch imports torch._inductor), and
        the first recorded range, stop and export (lazy initialisation in Kineto)."""
        if self.warmed or self.forked:
            return
        with self.lock:
            if self.session is not None or self._busy:  # another thread is profiling: later
                return
            self._busy = True
        try:
            if not self._foreign_profiler_running():
                self._warm_up_now(contents)
        finally:
            self._set_idle()

    def _warm_up_now(self, contents: tuple[str, ...]) -> None:
        # The caller holds the engine's busy state: no other profiler starts or stops meanwhile.
        if self.warmed or foreign_profiler() is not None:
            return
        self.warmed = True
        t0 = time.perf_counter()
        from .recording.warm_up import warm_up_profiler

        warm_up_profiler(contents)
        from .summary.exit_table import import_exit_modules

        import_exit_modules()
        self.writer.start()  # made and started now, not when the first trace ends (~10 ms)
        _store().add_costs(warmup_s=time.perf_counter() - t0)

    # --- scopes and the finish hook ----------------------------------------------------------

    def prepare(self, frame: Frame) -> None:
        """A scope was entered: register the exit work, load the package's names (regions may
        profile from here on) and warm the profiler up if this rank may profile under it."""
        if frame.idle or self.forked:
            return
        self.ensure_atexit()
        from . import _load_every_name

        _load_every_name()
        if not self.warmed and not self.warm_up_deferred and frame.rank_selected():
            self.warm_up(frame.config.contents)

    def scope_exited(self, frame: Frame, parent: Frame) -> None:
        open_blocks.end_under(frame)  # steps begun under it and left open end with it
        try:
            if self._writer is not None and self._writer.has_pending:
                self._writer.flush()
        finally:  # a Ctrl-C while waiting for the writer still starts the scope's hook
            if frame.hook_scope is not None and frame.hook_scope is not parent.hook_scope:
                self.finish(frame.hook_scope, frame.config)
            if frame.schedule_scope is not parent.schedule_scope:
                self._report_missed(frame)

    def _report_missed(self, frame: Frame) -> None:
        """The schedule ``frame`` introduced is over: note its selected steps that never ran."""
        scope = frame.schedule_scope
        if scope is None or frame.idle or self.forked or not frame.rank_selected():
            return
        missed = scope.missed()
        if missed:
            _store().add_missed_steps(missed.ranges, missed.unlisted)

    def finish(self, scope: HookScope, where: Any = None) -> None:
        """Profiling under ``scope`` is finished (``where``: the config in force at that point):
        start its hook if this rank is selected, once every trace recording now is written."""
        with scope.lock:
            if scope.finished:
                return
            scope.finished = True
        if self.forked:
            return
        with _rearmed_on_interrupt([(scope, where)]):
            self.ensure_atexit()  # a process that only ran a hook prints its summary too
            self.summary_wanted = scope.config.summary
            with self.lock:
                if self.session is not None or self._stopping:
                    # A trace is recording (a step inside a profiled region, another thread's
                    # trace) or stopping: the hook starts once it is on disk (stop_session).
                    self._deferred_finishes.append((scope, where))
                    return
            self._start_hooks([(scope, where)])

    def _start_hooks(self, finished: list[tuple[HookScope, Any]]) -> None:
        if not finished:
            return
        from .hook.finishing import finish

        with _rearmed_on_interrupt(finished):
            for scope, where in finished:
                finish(scope, where, self.writer.flush)

    def ensure_atexit(self) -> None:
        """Register the at-exit work (pending files, the environment's hook, the summary) once."""
        if not self._atexit_registered:
            self._atexit_registered = True
            from .process_exit import at_exit

            atexit.register(functools.partial(at_exit, self))

    def _warn_once(self, key: str, message: str, category: type[Warning]) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, category, stacklevel=4)

@contextlib.contextmanager
def _rearmed_on_interrupt(finished: list[tuple[HookScope, Any]]) -> Iterator[None]:
    """Ctrl-C (caught by the training loop) anywhere before a hook's command started — while a
    ``wait=True`` hook waited for the writer, say — loses no hook: each scope whose command has
    not started is finished again when it exits, or at interpreter exit."""
    try:
        yield
    except KeyboardInterrupt:
        for scope, _ in finished:
            with scope.lock:
                if not scope.hook_started:
                    scope.finished = False
        raise


def _store() -> Any:
    # Imported where first used: the records' attrs classes cost ~6 ms of `import`.
    from .summary.records import STORE

    return STORE


ENGINE = Engine()
when_env_sets_a_hook(ENGINE.ensure_atexit)


def _metrics_started(config: Any) -> None:
    ENGINE.ensure_atexit()  # the exit summary shows the metrics, with or without a trace
    ENGINE.summary_wanted = config.summary


when_metrics_start(_metrics_started)


def _after_fork_in_child() -> None:
    from .process_exit import after_fork_in_child

    after_fork_in_child(ENGINE)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
