"""The process's one torch profiler slot: the only code that starts or stops torch's profiler.

Exactly one profiler of ours runs per process. The slot is a small state machine guarded by
one lock, its moves written as tables in :mod:`.slot_states`: ``IDLE`` (free), ``STARTING`` (a
thread starts a trace or warms the profiler up), ``RECORDING`` (a trace records:
:attr:`ProfilerSlot.session`), ``STOPPING`` (a thread stops one and hands it to the writer),
``FORKED`` (a forked child: inert for good). Kineto crashes
when one thread starts a profiler while another stops one, so a start waits while the slot
is ``STARTING`` or ``STOPPING``. It also owns the one-time warm-up, the check for someone
else's profiler, and where the nested fast path of regions applies.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Any, Callable, Optional, Protocol, Union

import torch

from .. import background
from ..errors import ForeignProfilerWarning, ProfilerStartWarning, warn
from ..selection.steps import CURRENT_STEP, next_occurrence
from .foreign import foreign_profiler
from ..interrupts import HeldCtrlC, main_trace_began, main_trace_ended
from .range_names import range_name
from .session import TraceSession, entered, new_range
from .slot_states import ON_START, SlotEvent, SlotState, next_state

__all__ = [
    "FOREIGN", "NESTED_FAST_PATH", "Exiting", "Foreign", "NestedFastPath", "OwnedTrace", "ProfilerSlot", "SlotState",
    "StartResult",
]  # fmt: skip

# docs/hot-path.md, "Enum members as module names"
_IDLE, _STARTING, _RECORDING, _STOPPING, _FORKED = SlotState
_TAKE, _PUBLISH, _RELEASE, _STOP, _FORGET, _FORK = SlotEvent


class NestedFastPath:
    """Where a region may skip every check and be a bare torch range: under ``frame`` (the
    owner's scopes, inside its step block) in ``thread`` (the owner's), while a discrete trace
    records. Set by the slot when it publishes such a trace, cleared before it stops."""

    __slots__ = ("frame", "thread")

    def __init__(self) -> None:
        self.frame: Any = None
        self.thread: Optional[int] = None

    def clear(self) -> None:
        self.frame = self.thread = None


NESTED_FAST_PATH = NestedFastPath()


class Foreign(enum.Enum):
    FOREIGN = "foreign"


FOREIGN = Foreign.FOREIGN
"""What :meth:`ProfilerSlot.start` returns when someone else's profiler runs (none of ours)."""

WarnOnce = Callable[[str, str, "type[Warning]"], None]


class Exiting(Protocol):
    """What a block that started something gets back: its ``__exit__`` ends it."""

    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> object: ...


class OwnedTrace:
    """Returned to the block that owns a trace; its ``__exit__`` stops it, once (interpreter
    exit may have done it before a suspended generator's block exits)."""

    __slots__ = ("_stop", "_slot", "session", "done")

    def __init__(self, slot: ProfilerSlot, session: TraceSession, stop: Callable[[TraceSession], None]) -> None:
        self._stop = stop
        self._slot = slot  # its lock: a fork replaces it
        self.session = session
        self.done = False

    def claim(self) -> bool:
        """Whether this call is the one that ends the trace (not done before)."""
        with self._slot.lock:
            if self.done:
                return False
            self.done = True
            return True

    def __exit__(self, *exc_info: Any) -> None:
        with HeldCtrlC():  # a Ctrl-C from here on takes effect once the trace is stopped
            if self.claim():
                self._stop(self.session)


StartResult = Union[OwnedTrace, TraceSession, Foreign, None]
"""What :meth:`ProfilerSlot.start` returns: the started trace's :class:`OwnedTrace`; the
:class:`TraceSession` another thread started meanwhile; :data:`FOREIGN` while someone else's
profiler runs; None when torch failed to start, or in a forked child."""


class ProfilerSlot:
    """The state of torch's one profiler in this process; its moves are the table in
    :mod:`.slot_states`."""

    def __init__(self, warn_once: WarnOnce, on_warmed: Callable[[float], None]) -> None:
        self.lock = threading.Lock()
        self.state = _IDLE
        self.session: Optional[TraceSession] = None  # the trace recording now, if any
        self.owner: Optional[OwnedTrace] = None  # what stops it (interpreter exit may have to)
        self.warmed = False
        self._warn_once = warn_once
        self._on_warmed = on_warmed  # the engine's part of the warm-up (writer, exit modules)

    @property
    def forked(self) -> bool:
        return self.state is _FORKED

    # --- starting ------------------------------------------------------------------------------

    def start(
        self, session: TraceSession, frame: Any, stop: Callable[[TraceSession], None], starting: Callable[[], None]
    ) -> StartResult:
        """Start ``session`` for the block that owns it under ``frame`` (see :data:`StartResult`;
        a failure to start is warned and recorded). ``starting`` runs once this thread holds the
        slot, just before torch starts."""
        # A Ctrl-C from here on takes effect once torch's profiler runs and is published (or
        # failed to start): never between the two, where nothing would be left to stop it.
        with HeldCtrlC() as held:
            role, stage, step = session.owner_role, session.owner_stage, session.step
            while True:
                with self.lock:
                    move = ON_START[self.state]
                    if move == "take":
                        self._move(_TAKE)
                        session.occurrence = next_occurrence(role, stage, step)
                        break
                    if move == "join":
                        return self.session
                # Another thread starting, stopping or warming up a profiler: wait for it (a few ms,
                # ~1 s for a warm-up) rather than lose this selected step's trace. Polled outside the
                # lock, not Condition.wait: a Ctrl-C may land anywhere (see background.wait_for_event).
                held.deliver_now()  # nothing is taken yet: a Ctrl-C ends the wait
                time.sleep(background.POLL_S)
            if self._foreign_profiler_running():  # none of ours runs (the slot is ours): theirs
                self._locked_move(_RELEASE)
                return FOREIGN
            starting()
            try:
                if not self.warmed:
                    self._warm_up_now(session.config.contents)
                held.deliver_now()  # a Ctrl-C so far (in the warm-up, say): torch is not started for it
                session.start()
            except BaseException as exc:
                self._locked_move(_RELEASE)
                if not isinstance(exc, Exception):  # KeyboardInterrupt: nothing left half-started
                    raise
                label = f"{role}/{stage}" if role is not None else "fused trace"
                warn(
                    f"torchstep_prof: the profiler failed to start for {label} step {step} ({exc!r}); "
                    "the block runs unprofiled",
                    ProfilerStartWarning,
                )
                session.record_unwritten(f"profiler failed to start: {exc!r}")
                return None
            owner = OwnedTrace(self, session, stop)
            current = CURRENT_STEP.get(None)
            if role is not None:
                session.step_block = current
            with self.lock:
                # Published only once torch's profiler runs: a region that sees it may open a range.
                self.session, self.owner = session, owner
                session.holds_ctrl_c = main_trace_began()
                self._move(_PUBLISH)
                if (
                    role is not None
                    and current is not None
                    and session.owner_task is None
                    and frame.metrics is None
                    and not frame.live
                    and not session.nvtx
                ):
                    # Regions nested here, in this thread (outside asyncio), need no counter and no
                    # checks (a timed region is never a bare range, nor one with an NVTX range, nor
                    # one the live status lists).
                    NESTED_FAST_PATH.frame, NESTED_FAST_PATH.thread = frame, session.owner_thread
            if held.noted:
                # A Ctrl-C came while torch started: the block will not run, and its caller does
                # not get the trace to stop. Stop it here (as if the Ctrl-C landed at the block's
                # first line), then the hold's end raises it.
                owner.__exit__(None, None, None)
            return owner

    @staticmethod
    def foreign_range(role: Optional[str], stage: Optional[str]) -> Optional[Exiting]:
        """A region's range while someone else's profiler records, if theirs records in this
        very thread (a range in their trace is harmless there); None otherwise."""
        if role is not None and torch.autograd._profiler_enabled():
            return entered(new_range(range_name(role, stage or "")))  # type: ignore[no-any-return]
        return None

    # --- stopping ------------------------------------------------------------------------------

    def stop(self, session: TraceSession, hand_over: Callable[[TraceSession], None]) -> None:
        """Stop ``session`` (always), then ``hand_over`` it (to the writer, or its loss to the
        summary) before the slot is free again; nothing in a forked child (the parent writes
        it). A KeyboardInterrupt inside torch's stop still hands it over, then raises."""
        with self.lock:
            if self.state is _FORKED:  # a block inherited by a forked child
                return
            # Unpublished before torch stops: no new range is opened into a stopping trace, and
            # no other thread starts a profiler until this one is stopped and handed over.
            if self.session is session:
                self.session = self.owner = None
                NESTED_FAST_PATH.clear()
            self._move(_STOP)
        try:
            session.stop()
        finally:
            main_trace_ended(session.holds_ctrl_c)
            try:
                hand_over(session)
            finally:
                self._locked_move(_RELEASE)

    @property
    def busy(self) -> bool:
        """A trace records or is being stopped and handed to the writer (under :attr:`lock`)."""
        return self.state is _RECORDING or self.state is _STOPPING

    # --- the warm-up ---------------------------------------------------------------------------

    def warm_up(self, contents: tuple[str, ...] = ()) -> None:
        """Pay torch.profiler's one-time start-up costs now, outside any step, instead of inside
        the first profiled one: ~1 s for the first start (torch imports torch._inductor), and
        the first recorded range, stop and export (lazy initialisation in Kineto)."""
        if self.warmed:
            return
        with self.lock:
            if ON_START[self.state] != "take":  # another thread is profiling (or a forked child): later
                return
            self._move(_TAKE)
        try:
            if not self._foreign_profiler_running():
                self._warm_up_now(contents)
        finally:
            self._locked_move(_RELEASE)

    def _warm_up_now(self, contents: tuple[str, ...]) -> None:
        # The caller holds the slot (STARTING): no other profiler starts or stops meanwhile.
        if self.warmed or foreign_profiler() is not None:
            return
        self.warmed = True
        t0 = time.perf_counter()
        from .warm_up import warm_up_profiler

        warm_up_profiler(contents)
        self._on_warmed(t0)

    def _foreign_profiler_running(self) -> bool:
        """Someone else's profiler records or warms up somewhere in the process (the caller
        holds the slot, so none of ours runs): a second Kineto session would crash theirs at
        its exit. Warned about once."""
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

    def _move(self, event: SlotEvent) -> None:
        """The one place the state changes (the caller holds :attr:`lock`)."""
        self.state = next_state(self.state, event)

    def _locked_move(self, event: SlotEvent) -> None:
        with self.lock:
            self._move(event)

    def forget_session(self) -> None:
        """Forget the trace recording now without stopping it (a test dropping a leaked one)."""
        with self.lock:
            self.session = self.owner = None
            NESTED_FAST_PATH.clear()
            self._move(_FORGET)

    # --- a forked child ------------------------------------------------------------------------

    def after_fork_in_child(self) -> bool:
        """In a forked child: inert for good (it writes nothing). Returns whether Kineto ran
        in the parent (the child must then exit without destructors: see ``_fork.py``)."""
        kineto_ran = self.warmed or self.session is not None
        self.lock = threading.Lock()  # the parent's may have been held by another thread
        self._move(_FORK)
        self.session = self.owner = None
        NESTED_FAST_PATH.clear()
        return kineto_ran
