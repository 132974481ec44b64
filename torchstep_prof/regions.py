"""What training code marks: ``step(n)`` blocks, ``profile_region`` blocks, ``@profiled`` functions.

These are the hot path: users leave them around every stage of every step. When nothing can be
profiled (no schedule in force, or profiling disabled) a region reads one context variable and
one attribute, and returns. ``profile_region`` is where a region finds out what it does (a range
in a running trace, nothing, or a trace of its own that the engine starts): from the one rule,
``Frame.action``, or from a "no" that rule cached; a ``step`` block asks the rule once for the
regions inside it. Why the code looks as it does: docs/hot-path.md.
"""

from __future__ import annotations

import functools
from asyncio import _get_running_loop
from threading import get_ident as _get_ident
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, TypeVar

from . import engine as _engine
from .selection import frames as _frames
from .selection import open_blocks as _open_blocks
from .selection import steps as _steps
from .triggers import running as _on_demand
from .live import open_regions as _live_regions
from .live import running as _live
from ._wrapping import around_each_call
from .region_metrics import recorder as _recorder
from .recording.range_names import RANGE_NAMES as _RANGE_NAMES
from .recording.range_names import range_name
from .recording.slot import NESTED_FAST_PATH as _NESTED
from .recording.slot import Exiting
from .recording.session import new_range
from .topology import group_registry
from .selection.frames import _ROOT, Frame, current_frame
from .selection.rules import NONE as _NONE
from .selection.rules import StepAction

__all__ = ["Region", "begin_step", "end_step", "profile_region", "profiled", "step"]

if TYPE_CHECKING:  # the workers a step boundary reads (their modules load only when a scope opts in)
    from .live.reporter import Reporter
    from .one_per_process import OnePerProcess
    from .triggers.watcher import Watcher

F = TypeVar("F", bound=Callable[..., Any])


class Region(Protocol):
    """What :func:`profile_region` returns: a context manager for one ``with``.

    What ``as`` gets is unspecified (a region that profiles nothing is a shared no-op); a region
    never suppresses an exception from its block.
    """

    def __enter__(self) -> object: ...

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType], /
    ) -> Optional[bool]: ...


class _IdleRegion:
    """What ``profile_region`` returns when nothing can be profiled: a shared no-op.

    Its ``__exit__`` is a C callable (docs/hot-path.md, "C callables as __enter__ / __exit__").
    ``__enter__`` stays a method, since ``ExitStack.enter_context`` calls it with the region and
    ``as`` must get the region.
    """

    __slots__ = ()
    if TYPE_CHECKING:  # returns "", falsy: the exception propagates

        def __exit__(self, *exc_info: object) -> None: ...

    else:
        __exit__ = staticmethod("".format)

    def __enter__(self) -> _IdleRegion:
        return self


_IDLE_REGION = _IdleRegion()
# Bound by assignment, not by `from ... import`: see docs/hot-path.md, "Bind by assignment".
ENGINE = _engine.ENGINE
_SLOT = ENGINE.slot  # its .session: the trace recording now, if any
CURRENT_STEP = _steps.CURRENT_STEP  # the step block in force: CURRENT_STEP.get(None)
_STACK = _frames._STACK  # the innermost scope frame: _STACK.get(_ROOT)
_COUNTERS = _steps.COUNTERS  # role -> stage -> counter: read on every counted region
_GROUPS = group_registry()  # its _default_pg: the group a frame's rank_no holds for
# Its .running: the watcher, None unless a scope opted in to on-demand traces.
_ON_DEMAND: OnePerProcess[Watcher] = _on_demand.ON_DEMAND
_Timed = _recorder.TimedRegion  # metrics on: a region timed, not profiled
_TimedInner = _recorder.TimedInner  # metrics on: a range or a trace, timed
_perf = _recorder._perf
_record_step = _recorder.record_step
_count = _steps.count  # the next number of (role, stage)'s counter
_new_range: Callable[[str], Region] = new_range  # a torch range, not yet entered
_LIVE: OnePerProcess[Reporter] = _live.LIVE  # its .running: the reporter, None unless a scope opted in to live status
_OpenIdle = _live_regions.OpenIdle  # live status on: a not-profiled region, shown while open
_OpenRegion = _live_regions.OpenRegion  # live status on: any other region, shown while open


class _Region:
    """A region ``profile_region`` decided to profile: its ``with`` starts the trace."""

    __slots__ = ("frame", "role", "stage", "step", "action", "_active")

    def __init__(self, frame: Frame, role: str, stage: str, step: int, action: StepAction) -> None:
        self.frame = frame
        self.role = role
        self.stage = stage
        self.step = step
        self.action = action
        self._active: Optional[Exiting] = None

    def __enter__(self) -> _Region:
        if self._active is not None:
            raise RuntimeError(f"profile_region({self.role!r}, {self.stage!r}) is already entered; make a new one")
        self._active = ENGINE.start_region(self.frame, self.role, self.stage, self.step, self.action)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        active = self._active
        if active is not None:
            self._active = None
            active.__exit__(exc_type, exc, tb)


def profile_region(role: str, stage: str, step: Optional[int] = None) -> Region:
    """Mark a region of a training step as ``<role>/<stage>``; use it in a ``with``.

    On a selected step and rank the outermost region starts the profiler and writes its own
    trace (discrete mode); regions inside a running trace appear in it as ranges.

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[1]), tsp.step(1):        # doctest: +SKIP
    ...     with tsp.profile_region("actor", "compute_log_prob"):
    ...         pass

    ``step`` overrides the enclosing ``step(n)`` block; without either, a per-process counter
    per (role, stage) numbers the entries made while a schedule is in force, from 1.

    What the region does is decided as it is made, which in ``with profile_region(...)`` is as
    it is entered; the object is meant for that one ``with``. With no schedule in force (or
    profiling disabled) this returns a shared no-op at once: the cost of leaving regions in
    production code. Under ``tsp.metrics`` every region is also timed (profiled or not).

    Whether a step is profiled on this rank is decided by one rule, ``Frame.action``
    (selection/frames.py). This function returns without asking it only a "no" the rule
    cached: the enclosing step block's answer for its step, the frame's run of steps its
    schedule does not profile, or its rank not selected under the current process group. That
    makes a region that profiles nothing cost one context-variable read and a few attributes;
    the price is that every yes, and the first step past each cached run, pays a call to the
    rule (docs/hot-path.md, "Decide once, cache the no").
    """
    frame = _STACK.get(_ROOT)
    if frame is _NESTED.frame and _NESTED.thread == _get_ident() and _get_running_loop() is None:
        # The common case inside a trace: a region nested in a discrete trace, in the owner's
        # thread, under its scopes and step (nothing to count). Not in an asyncio task (an event
        # loop started inside the owner's region): tasks interleave, so their regions are spans,
        # never ranges on the owner's range stack. (No trace: one comparison, None.)
        try:
            return _new_range(_RANGE_NAMES[role][stage])
        except KeyError:
            pass
    if _SLOT.session is None:
        if not frame.screened:
            if frame.quiet:  # no schedule in force, or profiling disabled
                return _IDLE_REGION
            # A schedule in force, no trace recording, metrics off: the region's step (``step=``,
            # else the step block's, else the counter's), then a cached "no" or the rule.
            if step is None:
                current = CURRENT_STEP.get(None)
                if current is None:
                    try:
                        step = next(_COUNTERS[role][stage])
                    except KeyError:  # labels are checked when the counter is made
                        step = _step_of(frame, role, stage, None)
                elif current.skip_frame is frame:
                    return _IDLE_REGION  # the step block's cached no: not this step, or not this rank
                else:
                    step = _step_of(frame, role, stage, None)
            elif frame.label_checks > 0:
                step = _step_of(frame, role, stage, step)
            first, end = frame.cached_no
            if first <= step < end or frame.rank_no is _GROUPS._default_pg:
                return _IDLE_REGION  # a no the rule cached: the schedule's for this run, or this rank's
            return _decided(frame, role, stage, step)
        if frame.timed_only:
            # Metrics or spans on, no schedule, no live status: what _screened would make,
            # without its call (an unresolved root frame is never timed_only).
            return _Timed((role, stage, _perf()))
        if step is None and not frame.live:
            current = CURRENT_STEP.get(None)
            if current is not None and current.skip_frame is frame:
                return _Timed((role, stage, _perf()))  # timed (screened, not live): the step block's cached no
    return _screened(frame, role, stage, step)


def _screened(frame: Frame, role: str, stage: str, step: Optional[int]) -> Region:
    """What a region is while a trace records, under the root frame until it is resolved, or
    timed (metrics on): a range in the trace, nothing, or a trace of its own (the rule's yes)."""
    inner: Region
    session = _SLOT.session
    if session is not None:  # any thread or task: while a trace records, a region is a range in it
        if frame.disabled:
            inner = _IDLE_REGION
        else:
            if step is None and not frame.idle and CURRENT_STEP.get(None) is None:
                _count(role, stage)  # counters count every entry under a schedule (only)
            inner = ENGINE.range_in(session, role, stage)
    else:
        if frame is _ROOT:  # the first region outside every scope: read the environment once
            frame = current_frame()
        if frame.idle:
            inner = _IDLE_REGION
        else:
            current = CURRENT_STEP.get(None) if step is None else None
            if current is not None and current.skip_frame is frame:
                inner = _IDLE_REGION  # the step block's cached no
            else:
                inner = _decided(frame, role, stage, _step_of(frame, role, stage, step))
    return timed_and_shown(frame, role, stage, inner)


def timed_and_shown(frame: Frame, role: str, stage: str, inner: Region = _IDLE_REGION) -> Region:
    """``inner`` (a range, a trace of its own, or nothing) as ``frame`` wants every region:
    timed when spans or metrics are on, shown while open when live status is on. The zero-code
    runner's ``--region`` forwards outside a recorded step are ``timed_and_shown(frame, role, stage)``."""
    if frame.metrics is not None:
        inner = _Timed((role, stage, _perf())) if inner is _IDLE_REGION else _TimedInner(role, stage, inner)
    if frame.live:  # live status (a stall section or an on-demand folder): shown while open
        return _OpenIdle((role, stage, 0.0)) if inner is _IDLE_REGION else _OpenRegion(role, stage, inner)
    return inner


def _step_of(frame: Frame, role: str, stage: str, step: Optional[int]) -> int:
    """A region's step: ``step``, else the step block's, else the next of its counter. Its
    labels are checked the first times, whether or not the step is profiled."""
    if step is None:
        current = CURRENT_STEP.get(None)
        _check_labels(role, stage)
        return _count(role, stage) if current is None else current.number
    if frame.label_checks > 0:  # step=: the first regions under a frame check their labels
        frame.label_checks -= 1
        _check_labels(role, stage)
    return step


def _decided(frame: Frame, role: str, stage: str, step: int) -> Region:
    """The rule's answer for ``step`` (``Frame.action``, which also keeps the cached no)."""
    action = frame.decide(step)
    return _IDLE_REGION if action is _NONE else _Region(frame, role, stage, step, action)


def _check_labels(role: str, stage: str) -> None:
    """Labels are checked the first time they are seen, whether or not the step is profiled
    (recording/labels.py: warnings, never an error, as with metrics alone)."""
    try:
        _RANGE_NAMES[role][stage]
    except KeyError:
        range_name(role, stage)


class step:
    """Mark training step ``number`` (an integer >= 0); regions inside belong to it.

    In fused mode (``configure(discrete=False)``) a selected step's block owns one trace holding
    every region inside it. The block of the last step a finite schedule selects also runs the
    finish hook on exit. A cycle schedule counts from step 1; step 0 is profiled only when an
    explicit list names it. Without a ``with`` block, see :func:`begin_step`.

    >>> import torchstep_prof as tsp
    >>> for n in range(0, 3):
    ...     with tsp.step(n):
    ...         pass
    """

    __slots__ = ("number", "frame", "action", "skip_frame", "_token", "_owned", "_frame_token", "_t0")

    def __init__(self, number: int) -> None:
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise ValueError(f"step number must be an integer >= 0 (got {number!r})")
        self.number = number

    def __enter__(self) -> step:
        self._begin()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._end(exc_type, exc, tb)

    def _begin(self) -> None:
        """Where every step begins (``with step(n)``, :func:`begin_step`): the one place per-step
        work starts; its end is :meth:`_end`, whose engine part is ``Engine.step_exited``."""
        frame = current_frame()
        self._frame_token = None
        if _LIVE.running is not None:  # live status: the status thread reads the step
            _LIVE.running.at_step(self.number)
        watcher = _ON_DEMAND.running
        if watcher is not None:  # on-demand traces: a requested step profiles under its own frame
            planned = watcher.at_step(frame, self.number)
            if planned is not frame:
                frame = planned
                self._frame_token = _STACK.set(frame)  # regions inside decide under it
        self.frame = frame
        self._owned = None
        # The rule, asked once per step (fused mode starts the step's trace on its answer).
        self.action = _NONE if frame.idle else frame.decide(self.number)
        # Its no, cached for the regions inside: they return at once, except in the first steps a
        # schedule sees: those take the full path once, so a label's warnings come early.
        self.skip_frame = frame if self.action is _NONE and frame.labels_seen_enough() else None
        if _SLOT.session is not None:
            ENGINE.step_began_in_trace(self.number)
        self._token = CURRENT_STEP.set(self)
        try:
            if self.action is not _NONE and not frame.config.discrete:
                self._owned = ENGINE.enter_step(frame, self.number, self.action)
        except BaseException:  # KeyboardInterrupt while the profiler starts: nothing stays set
            CURRENT_STEP.reset(self._token)
            self._pop_frame()
            raise
        self._t0 = _perf() if frame.metrics is not None else None  # metrics: the step is timed

    def _pop_frame(self) -> None:
        # The frame an on-demand step pushed, if it is still innermost (a scope's exit may
        # have reset the stack before it ends this step: then there is nothing to undo).
        token, self._frame_token = self._frame_token, None
        if token is not None and _STACK.get(None) is self.frame:
            try:
                _STACK.reset(token)
            except ValueError:  # ended from another context
                pass

    def _end(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Where every step ends: the block's exit; also end_step's, the next begin_step's, a
        scope's exit's and interpreter exit's for a begun step."""
        if self._t0 is not None:
            _record_step(_perf() - self._t0, self.number, self._t0)
        try:
            try:
                if _SLOT.session is not None:
                    ENGINE.step_ending(self)
            finally:  # also when a Ctrl-C lands in step_ending: the step's trace always stops
                if self._owned is not None:
                    self._owned.__exit__(exc_type, exc, tb)
        finally:
            self._owned = None
            try:
                CURRENT_STEP.reset(self._token)
            except ValueError:  # ended from another context (its scope's exit, interpreter exit)
                pass
            if self._frame_token is not None:
                self._pop_frame()
            if not self.frame.idle:
                ENGINE.step_exited(self.frame, self.number)


def begin_step(number: int) -> None:
    """Begin training step ``number``, as ``with step(number):`` would, without a ``with``
    block: for loops and framework callbacks. Equivalent to the block in every respect.

    A step begun here ends at :func:`end_step`, at the next ``begin_step`` (so a loop may call
    only ``begin_step``), when the scope that was innermost here exits (an exception leaving
    the loop included), or at interpreter exit. Each thread and asyncio task has its own.

    >>> import torchstep_prof as tsp
    >>> iter_num = 0
    >>> while iter_num < 3:
    ...     tsp.begin_step(iter_num)
    ...     iter_num += 1
    >>> tsp.end_step()
    """
    block = step(number)  # a bad number raises here, leaving the open step as it was
    previous = _open_blocks.begun()
    if previous is not None and _open_blocks.claim(previous):
        previous._end(None, None, None)
    block._begin()
    _open_blocks.opened(block)


def end_step() -> None:
    """End the step this thread or task began with :func:`begin_step`; nothing if none is open.

    >>> import torchstep_prof as tsp
    >>> tsp.begin_step(1); tsp.end_step(); tsp.end_step()
    """
    block = _open_blocks.begun()
    if block is not None and _open_blocks.claim(block):
        block._end(None, None, None)


def profiled(role: str, stage: Optional[str] = None) -> Callable[[F], F]:
    """Decorate a function, method or coroutine function: each call is a ``profile_region``
    (around the awaited body for a coroutine). ``stage`` defaults to the function's name.

    >>> import torchstep_prof as tsp
    >>> class Critic:
    ...     @tsp.profiled(role="critic")
    ...     def update(self, batch):
    ...         return len(batch)
    >>> Critic().update([1, 2])
    2
    """

    def decorate(fn: F) -> F:
        if isinstance(fn, (classmethod, staticmethod)):  # @profiled above @classmethod
            return type(fn)(decorate(fn.__func__))
        label = stage if stage is not None else getattr(fn, "__name__", None)
        if not isinstance(label, str):
            raise TypeError(f"@profiled needs stage= for {fn!r}, which has no __name__")
        return around_each_call(  # type: ignore[no-any-return]
            fn,
            functools.partial(profile_region, role, label),  # no Python frame: docs/hot-path.md
            "@profiled",
            "Put `with profile_region(...)` inside the loop that consumes it.",
            idle=_IDLE_REGION,
        )

    return decorate
