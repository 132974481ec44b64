"""The profiling engine: this process's profiling bookkeeping around its one torch profiler.

Exactly one profiler runs per process, owned by the outermost profiled block (a region in
discrete mode, a ``step`` block in fused mode); starting and stopping it is
:mod:`torchstep_prof.recording.slot`. Everything entered while it records, in any thread or
asyncio task, becomes a range in that trace. The engine carries out what regions and steps
decided, hands stopped traces to the writer, runs finish hooks once their traces are written,
and does the process's exit and fork work (:mod:`torchstep_prof.process_exit`). Step state
(the step block in force, counters, occurrences) is :mod:`torchstep_prof.selection.steps`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ._fork import at_fork_in_child
from .errors import ForeignProfilerWarning, TorchstepProfWarning, warn, warn_once
from .recording.range_names import range_name
from .recording.nvtx import NvtxRange
from .recording.session import TraceSession, entered, new_range
from .recording.slot import FOREIGN, Exiting, ProfilerSlot
from .recording.stopped import Outcome, StoppedTrace
from .region_metrics.endpoint import serve as serve_metrics, when_started as when_metrics_start
from .selection import open_blocks, steps
from .selection.frames import (
    Frame,
    HookScope,
    opts_in,
    when_a_frame_opts_in,
    when_env_sets_a_hook,
    when_the_root_resolves,
)
from .selection.rules import StepAction, last_selected_step
from .selection.steps import StepBlock
from .topology import current_topology
from .triggers.running import use_engine as drive_on_demand_plans

if TYPE_CHECKING:
    from .summary.records import TraceRecord
    from .writing.writer import TraceWriter

__all__ = ["ENGINE", "Engine", "scope_opted_out"]

_WRITER_LOCK = threading.Lock()  # makes the one writer (never held while it writes)


class Engine:
    """The process's profiling engine (one: :data:`ENGINE`)."""

    def __init__(self) -> None:
        self.slot = ProfilerSlot(self.warn_once, self._warmed)
        self._writer: Optional[TraceWriter] = None  # made with the first trace: see writer
        self.warm_up_deferred = False  # torchstep-prof run warms up near its first selected step
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

    def start_region(self, frame: Frame, role: str, stage: str, step: int, action: StepAction) -> Optional[Exiting]:
        """Carry out what ``profile_region`` decided (``action`` for ``step`` under ``frame``):
        start a trace, or be a range in one another thread started meanwhile. Returns an object
        whose ``__exit__`` must be called when the region exits, or None."""
        if self.slot.forked:
            return None
        session = self.slot.session
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
            return NvtxRange(name, new_range(name)) if session.nvtx else new_range(name)
        return session.span(name, role)

    def enter_step(self, frame: Frame, number: int, action: StepAction) -> Optional[Exiting]:
        """A fused ``step`` block's entry: start the trace it owns (its step is selected)."""
        if self.slot.forked or self.slot.session is not None:
            return None
        return self._start(frame, None, None, number, action)

    def step_began_in_trace(self, number: int) -> None:
        """A step block begins while a trace records: remember it if the trace belongs to a
        region left open past its own step's end (its trace now holds this step's work)."""
        session = self.slot.session
        if session is not None and session.left_open and number != session.step:
            with self.slot.lock:
                if number not in session.later_steps:
                    session.later_steps.append(number)

    def step_ending(self, block: StepBlock) -> None:
        """A step block ends while a trace records: a region that owns it, entered in that
        block, is being left open across steps (a generator suspended inside it, say)."""
        session = self.slot.session
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

    # --- the profiler window -----------------------------------------------------------------

    def _start(
        self, frame: Frame, role: Optional[str], stage: Optional[str], step: int, action: StepAction
    ) -> Optional[Exiting]:
        session = TraceSession(
            config=frame.config,
            role=role,
            stage=stage,
            step=step,
            action=action,
            topology=current_topology(),
            hook_scope=frame.hook_scope,
        )
        started = self.slot.start(session, frame, self.stop_session, functools.partial(self._starting, frame))
        if started is FOREIGN:
            return self.slot.foreign_range(role, stage)
        if isinstance(started, TraceSession):  # another thread's trace is recording: a range in it
            return None if role is None else entered(self.range_in(started, role, stage or ""))
        return started  # its owner, or None (it failed to start, or a forked child)

    def _starting(self, frame: Frame) -> None:
        self.ensure_atexit()
        self.summary_wanted = frame.config.summary
        if self._writer is not None:
            # A CUDA trace still being exported would lose its CUDA events' times to this start.
            self._writer.wait_for_cuda_exports()

    def stop_session(self, session: TraceSession) -> None:
        """Stop ``session`` (always), then hand its record over (to the background writer when it
        is to be written). Only torch's ``stop()`` runs here; the export runs on the writer
        thread. Never raises, except a KeyboardInterrupt (the trace is then still written or
        recorded)."""
        try:
            try:
                # (In a forked child, a block it inherited: nothing; the parent writes its trace.)
                self.slot.stop(session, self._hand_over)
            finally:  # also after a Ctrl-C inside torch's stop
                # Hooks deferred while this trace recorded (it is queued first: their threads
                # wait for its write).
                self.start_deferred_hooks()
        except Exception as exc:  # never let profiling replace the user's exception or result
            self.warn_once("stop", f"torchstep_prof: stopping or writing a trace failed: {exc!r}", TorchstepProfWarning)

    def _hand_over(self, session: TraceSession) -> None:
        # The export runs beside the next profiler: see writing/writer.py.
        trace = session.stopped
        if trace is None:  # its stop failed before its record was made (warned by stop_session)
            return
        _store().add_costs(start_s=trace.start_s, stop_s=trace.stop_s)
        if trace.outcome is Outcome.LOST:
            warn(f"torchstep_prof: trace of step {trace.name.step} not written: {trace.reason}", ForeignProfilerWarning)
            if trace.kept:
                _store().add_trace(trace.unwritten_row())
        elif trace.outcome is Outcome.WRITE or trace.outcome is Outcome.FAILED:
            # Also after a KeyboardInterrupt inside stop(): what was recorded is written, or its
            # failure recorded, never dropped silently.
            self._queue_write(trace)

    def _queue_write(self, trace: StoppedTrace) -> None:
        def on_written(row: TraceRecord) -> None:  # on the writer thread, once the file is final
            scope = trace.hook_scope
            if scope is not None and row.path is not None:
                scope.add_trace(row.path, trace.roles)
                if row.memory_snapshot is not None:  # shipped with its trace
                    scope.add_trace(row.memory_snapshot, trace.roles)
            if trace.left_open:  # its owning region stayed open after its step (a suspended generator)
                later = f"; step(s) {', '.join(map(str, trace.later_steps))} ran inside it" if trace.later_steps else ""
                _store().add_attention(
                    f"left-open:{id(trace)}",
                    f"region {row.role}/{row.stage} of step {row.step} stayed open after its step "
                    f"ended (a suspended generator?){later}: what ran meanwhile landed in its trace {row.path}",
                )

        self.writer.write(trace, on_written)

    def drop_running_trace(self) -> None:
        """Let the trace recording now end without a file (``torchstep-prof run`` drops a step
        that no optimizer step ended: it is not a step's trace). It records and stops as usual,
        its outcome is DISCARD."""
        session = self.slot.session
        if session is not None:
            session.keep = False

    def _warmed(self, t0: float) -> None:
        # The slot's warm-up ran: import the exit work's modules, start the writer (~10 ms when
        # the first trace ends otherwise), and count the whole as the warm-up's cost.
        from .process_exit import import_exit_modules

        import_exit_modules()
        self.writer.start()
        _store().add_costs(warmup_s=time.perf_counter() - t0)

    # --- scopes and the finish hook ----------------------------------------------------------

    def frame_in_force(self, frame: Frame) -> None:
        """A frame comes into force (a scope is entering, or the root frame has read the
        environment): the process's one metrics endpoint and one span log start with the first
        frame that turns them on; a later frame that asks differently is warned about."""
        config = frame.config
        serve_metrics(config)  # returns at once with metrics off or the endpoint already decided
        spans = config.spans
        if spans is not None and spans.enable:
            from .timeline.span_log import start_span_log  # imported only by a process with spans on

            start_span_log(spans.dir, config.process_role)

    def prepare(self, frame: Frame) -> None:
        """A scope was entered: register the exit work, load the package's names (regions may
        profile from here on) and warm the profiler up if this rank may profile under it."""
        if frame.idle or self.slot.forked:
            return
        self.ensure_atexit()
        from . import _load_every_name

        _load_every_name()
        if not self.slot.warmed and not self.warm_up_deferred and frame.rank_selected():
            self.slot.warm_up(frame.config.contents)

    def scope_exited(self, frame: Frame, parent: Frame) -> None:
        open_blocks.end_under(frame)  # steps begun under it and left open end with it
        try:
            if self._writer is not None:
                self._writer.flush()
        finally:  # a Ctrl-C while waiting for the writer still starts the scope's hook
            if frame.hook_scope is not None and frame.hook_scope is not parent.hook_scope:
                self.finish(frame.hook_scope, frame.config)
            if frame.schedule_scope is not parent.schedule_scope:
                self.report_missed(frame)

    def report_missed(self, frame: Frame) -> None:
        """The schedule ``frame`` introduced is over: note its selected steps that never ran."""
        scope = frame.schedule_scope
        if scope is None or frame.idle or self.slot.forked or not frame.rank_selected():
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
        if self.slot.forked:
            return
        with _rearmed_on_interrupt([(scope, where)]):
            self.ensure_atexit()  # a process that only ran a hook prints its summary too
            self.summary_wanted = scope.config.summary
            with self.slot.lock:
                if self.slot.busy:
                    # A trace is recording (a step inside a profiled region, another thread's
                    # trace) or stopping: the hook starts once it is on disk (stop_session).
                    self._deferred_finishes.append((scope, where))
                    return
            self._start_hooks([(scope, where)])

    def start_deferred_hooks(self) -> None:
        """Start the hooks deferred while a trace recorded or stopped (it is queued now, or it
        never ended: interpreter exit)."""
        with self.slot.lock:
            deferred, self._deferred_finishes = self._deferred_finishes, []
        self._start_hooks(deferred)

    def _start_hooks(self, finished: list[tuple[HookScope, Any]]) -> None:
        if not finished:
            return
        from .hook.finishing import finish

        with _rearmed_on_interrupt(finished):
            for scope, where in finished:
                finish(scope, where, self.writer.flush)

    # --- the process ---------------------------------------------------------------------------

    def ensure_atexit(self) -> None:
        """Register the at-exit work (pending files, the environment's hook, the summary) once."""
        if not self._atexit_registered:
            self._atexit_registered = True
            from .process_exit import at_exit

            atexit.register(functools.partial(at_exit, self))

    def flush_pending_writes(self) -> None:
        """Wait for the traces queued so far (without counting the wait as a cost)."""
        if self._writer is not None:
            self._writer.flush(count=False)

    def after_fork_in_child(self) -> None:
        """A DataLoader worker inherits the parent's state, maybe a running profiler: it writes
        nothing, runs no hook and prints no summary."""
        if self.slot.after_fork_in_child():  # Kineto ran here: its exit would hang
            from ._fork import exit_without_destructors

            exit_without_destructors()
        self._deferred_finishes = []
        if self._writer is not None:
            self._writer.forget_after_fork()

    def warn_once(self, key: str, message: str, category: type[Warning]) -> None:
        """Warn with ``message`` the first time ``key`` comes up in this process."""
        warn_once(self._warned, key, message, category)


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
when_the_root_resolves(ENGINE.frame_in_force)
drive_on_demand_plans(ENGINE)


def _frame_opts_in(frame: Frame) -> None:
    """A frame with an ``on_demand``, ``auto_trace`` or ``stall`` section was made (a scope
    entered, or the environment read): start the on-demand poll thread, then the live status,
    which may ride on it. Their modules are imported here, at the first such frame: a job that
    never opts in never loads them (they cost most of ``import torchstep_prof``'s time)."""
    from .live import reporter
    from .triggers import watcher

    watcher.watch(frame)
    reporter.watch(frame)


def scope_opted_out(frame: Frame, parent: Frame) -> None:
    """The scope of ``frame`` exited: stop what it started (the poll thread, the live status)."""
    if not opts_in(frame.config):  # it started nothing (its modules may not even be loaded)
        return
    from .live import reporter
    from .triggers import watcher

    try:
        watcher.scope_left(frame, parent)
    finally:
        reporter.scope_left(frame, parent)


when_a_frame_opts_in(_frame_opts_in)


def _metrics_started(config: Any) -> None:
    ENGINE.ensure_atexit()  # the exit summary shows the metrics, with or without a trace
    ENGINE.summary_wanted = config.summary


when_metrics_start(_metrics_started)
at_fork_in_child(steps.forget_after_fork)
at_fork_in_child(ENGINE.after_fork_in_child)
