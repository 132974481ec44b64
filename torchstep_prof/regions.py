"""What training code marks: ``step(n)`` blocks, ``profile_region`` blocks, ``@profiled`` functions.

These are the hot path: users leave them around every stage of every step. When nothing can be
profiled (no schedule in force, or profiling disabled) a region reads one context variable and
one attribute, and returns. ``profile_region`` is the one place that decides what a region does
(a range in a running trace, nothing, or a trace of its own that the engine starts); a ``step``
block decides once for the regions inside it. Why the code looks as it does: docs/hot-path.md.
"""

from __future__ import annotations

import functools
from asyncio import _get_running_loop
from threading import get_ident as _get_ident
from typing import Any, Callable, Optional, TypeVar

from . import engine as _engine
from .selection import frames as _frames
from .selection import open_blocks as _open_blocks
from .selection import steps as _steps
from .triggers import watcher as _watcher
from ._wrapping import around_each_call
from .region_metrics import recorder as _recorder
from .recording.range_names import RANGE_NAMES as _RANGE_NAMES
from .recording.range_names import range_name
from .recording.slot import NESTED_FAST_PATH as _NESTED
from .recording.session import new_range
from .topology import group_registry
from .selection.frames import _ROOT, Frame, current_frame
from .selection.rules import NONE as _NONE
from .selection.rules import RECORD as _RECORD
from .selection.rules import StepAction

__all__ = ["begin_step", "end_step", "profile_region", "profiled", "step"]

F = TypeVar("F", bound=Callable[..., Any])


class _IdleRegion:
    """What ``profile_region`` returns when nothing can be profiled: a shared no-op.

    Its ``__exit__`` is a C callable (docs/hot-path.md, "C callables as __enter__ / __exit__").
    ``__enter__`` stays a method, since ``ExitStack.enter_context`` calls it with the region and
    ``as`` must get the region.
    """

    __slots__ = ()
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
_GROUPS = group_registry()  # its _default_pg: the group a frame's rank decision holds for
_ON_DEMAND = _watcher.ON_DEMAND  # its .watcher: None unless a scope opted in to on-demand traces
_Timed = _recorder.TimedRegion  # metrics on: a region timed, not profiled
_TimedInner = _recorder.TimedInner  # metrics on: a range or a trace, timed
_perf = _recorder._perf
_record_step = _recorder.record_step
_count = _steps.count  # the next number of (role, stage)'s counter


class _Region:
    """A region ``profile_region`` decided to profile: its ``with`` starts the trace."""

    __slots__ = ("frame", "role", "stage", "step", "action", "_active")

    def __init__(self, frame: Frame, role: str, stage: str, step: int, action: StepAction) -> None:
        self.frame = frame
        self.role = role
        self.stage = stage
        self.step = step
        self.action = action
        self._active: Any = None

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


def profile_region(role: str, stage: str, *, step: Optional[int] = None) -> Any:
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
    """
    # The hot path: each branch does the least it can. Not profiling: one context-variable read
    # and a few attributes. Inside a running trace: the range object itself, entered by the
    # caller's `with` (torch's C methods, no Python frame of ours around it).
    frame = _STACK.get(_ROOT)
    if frame is _NESTED.frame and _NESTED.thread == _get_ident() and _get_running_loop() is None:
        # The common case inside a trace, in as few steps as possible: a region nested in a
        # discrete trace, in the owner's thread, under its scopes and step (nothing to count).
        # Not in an asyncio task (an event loop started inside the owner's region): tasks
        # interleave, so their regions are spans, never ranges on the owner's range stack.
        # (No trace: _NESTED.frame is None, and this costs one comparison.)
        try:
            return new_range(_RANGE_NAMES[role][stage])
        except KeyError:
            pass
    session = _SLOT.session
    if session is not None:
        if frame.metrics is not None:  # (never the nested fast path's frame: the engine sees to it)
            inner = _in_trace(frame, session, role, stage, step)
            return _Timed(role, stage) if inner is _IDLE_REGION else _TimedInner(role, stage, inner)
        # Any thread or task: while a trace records, a region is a range in it.
        if frame.disabled:
            return _IDLE_REGION
        if step is None and not frame.idle and CURRENT_STEP.get(None) is None:
            _count(role, stage)  # counters count every entry under a schedule (only)
        return ENGINE.range_in(session, role, stage)
    if frame.quiet:  # nothing to profile, metrics off
        return _IDLE_REGION
    if frame.screened:  # the root frame, or metrics on (as cheap a test as `frame is _ROOT`)
        if frame is _ROOT:  # first region outside every scope: read the environment once
            frame = current_frame()
            if frame.quiet:
                return _IDLE_REGION
        if frame.metrics is not None:
            if frame.idle:
                return _Timed(role, stage)
            inner = _decided(frame, role, stage, step)
            return _Timed(role, stage) if inner is _IDLE_REGION else _TimedInner(role, stage, inner)
    # No trace records and a schedule is in force: here, and only here, a region's fate is
    # decided. Its step: ``step=``, else the enclosing step block's, else the counter's; then
    # the frame's decision for that step and this rank (Frame.action). The commonest outcome,
    # an explicit list without this step, is one set lookup, inline.
    if step is None:
        current = CURRENT_STEP.get(None)
        if current is not None:
            if current.skip_frame is frame:
                return _IDLE_REGION  # the step block decided: not this step, or not this rank
            _check_labels(role, stage)
            step = current.number
            if current.frame is frame:  # the block decided for its own frame
                action = current.action
                if action is _NONE:
                    return _IDLE_REGION
                frame.selected(step)
                return _Region(frame, role, stage, step, action)
            # a scope entered inside the block decides anew, below
        else:
            try:
                step = next(_COUNTERS[role][stage])
            except KeyError:  # labels are checked when the counter is made
                _check_labels(role, stage)
                step = _count(role, stage)
    elif frame.label_checks > 0:  # step=: the first regions under a frame check their labels
        frame.label_checks -= 1
        _check_labels(role, stage)
    # Frame.action(step), inline (docs/hot-path.md, "Decisions inlined and cached"): the schedule's
    # explicit set or cycle, then the rank decision the frame keeps with the process group it
    # was made under. tests/test_selection.py checks the two agree.
    explicit = frame.explicit_steps
    if explicit is not None:
        if step not in explicit:
            return _IDLE_REGION
        action = _RECORD
    else:
        first, end, action = frame.cycle_run
        if not first <= step < end:
            first, end, action = frame.cycle_run = frame.cycle.run_of(step)  # type: ignore[union-attr]
        if action is _NONE:
            return _IDLE_REGION
    if frame.rank_group is not _GROUPS._default_pg:
        frame.rank_selected()
    if not frame.rank_ok:
        return _IDLE_REGION
    frame.selected(step)
    return _Region(frame, role, stage, step, action)


def _in_trace(frame: Frame, session: Any, role: str, stage: str, step: Optional[int]) -> Any:
    """What a region is while a trace records (``profile_region``'s rule, for a timed one)."""
    if frame.disabled:
        return _IDLE_REGION
    if step is None and not frame.idle and CURRENT_STEP.get(None) is None:
        _count(role, stage)
    return ENGINE.range_in(session, role, stage)


def _decided(frame: Frame, role: str, stage: str, step: Optional[int]) -> Any:
    """What a region is under a schedule, with no trace recording: ``profile_region``'s rules
    without its inlining, for a timed region (the same decisions: tests/test_metrics.py)."""
    if step is None:
        current = CURRENT_STEP.get(None)
        if current is not None:
            if current.skip_frame is frame:
                return _IDLE_REGION
            _check_labels(role, stage)
            step = current.number
            if current.frame is frame:
                if current.action is _NONE:
                    return _IDLE_REGION
                frame.selected(step)
                return _Region(frame, role, stage, step, current.action)
        else:
            _check_labels(role, stage)
            step = _count(role, stage)
    elif frame.label_checks > 0:
        frame.label_checks -= 1
        _check_labels(role, stage)
    action = frame.action(step)
    if action is _NONE:
        return _IDLE_REGION
    frame.selected(step)
    return _Region(frame, role, stage, step, action)


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
        frame = current_frame()
        self._frame_token = None
        watcher = _ON_DEMAND.watcher
        if watcher is not None:  # on-demand traces: a requested step profiles under its own frame
            planned = watcher.at_step(frame, self.number)
            if planned is not frame:
                frame = planned
                self._frame_token = _STACK.set(frame)  # regions inside decide under it
        self.frame = frame
        self._owned = None
        # Decided once per step: regions inside read it instead of re-deciding.
        self.action = _NONE if frame.idle else frame.decide(self.number)
        # Regions of a skipped step return at once, except in the first steps a schedule sees:
        # those take the full path once, so a label's warnings come early, not on a profiled step.
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
        # The block's exit; also end_step's, a scope's exit's and interpreter exit's for a begun step.
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
            return type(fn)(decorate(fn.__func__))  # type: ignore[return-value]
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
