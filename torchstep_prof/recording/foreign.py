"""Someone else's torch profiler, recording or warming up anywhere in the process.

torch 2.13 has no process-wide query for Kineto's state: ``torch.autograd._profiler_enabled()``
(and ``torch._C._autograd._profiler_type()``) read the calling thread's state only, and all of
them read False while a scheduled ``torch.profiler.profile`` is in its warm-up (Kineto prepared,
not enabled). ``torch._C._autograd._is_kineto_stopped()`` reads False in every phase. What torch
does keep process-wide, in Python, without our wrapping anything:

- ``torch.autograd.profiler._is_profiler_enabled``: True from any profiler's start to its stop,
  whatever the thread (torch's own fast flag);
- ``torch.autograd.profiler.KinetoStepTracker._step_dict``: holds ``"ProfilerStep"`` from the
  construction of a ``torch.profiler.profile`` to its ``__exit__`` (ours un-register at once).

Another profiler is counted as running in any phase between its start and its stop: an
entered scheduled ``torch.profiler.profile`` in its wait phase (it holds its open
``ProfilerStep#<n>`` range; nothing of Kineto yet, but its next ``step()`` prepares Kineto under
ours), or a ``torch.autograd.profiler.profile`` prepared and not yet stopped (a warm-up; with
``acc_events=True`` torch prepares the same one again after a stop, which is not told apart).
Finding one means walking the garbage collector's objects (~15-130 ms), so that walk runs only
while a ``torch.profiler.profile`` is registered with the step tracker, and not again while
nothing it could find has changed: the tracker, and the number of references to the profile
and range classes, less those held by profiles of ours (each instance refers to its class).

Every profile of ours (:func:`new_own_profile`, and the torch.autograd profile inside it once
started: :func:`mark_own`) is in one weak set, whatever became of it: finished, released,
interrupted. None of them counts as someone else's, even while a reference cycle keeps it alive.

A Ctrl-C can land at any bytecode of torch's own ``start()`` / ``stop()``: :func:`settle_own_profile`
then finishes the job, so that none of ours stays on and torch's flag does not read as someone
else's profiler for the rest of the run.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from typing import Any, Optional

import torch
from torch.autograd import profiler as _autograd_profiler

__all__ = [
    "disturbed_since",
    "foreign_profiler",
    "kineto_recording",
    "mark_own",
    "new_own_profile",
    "profiles_state",
    "settle_own_profile",
]

_STEP_KEY = "ProfilerStep"  # torch.profiler.profiler.PROFILER_STEP_NAME
_lock = threading.Lock()
_RECORDING = "another torch profiler is recording in this process"
_WARMING_UP = "another torch profiler is in its warm-up in this process"
_clean_at: Optional[tuple[Any, ...]] = None  # profiles_state() when a walk found none of theirs
# Every profile of ours, outer (torch.profiler.profile) and inner (torch.autograd.profiler.profile).
_own: "weakref.WeakSet[Any]" = weakref.WeakSet()


def kineto_recording() -> bool:
    """Whether any torch profiler records now, in any thread (ours included)."""
    return bool(getattr(_autograd_profiler, "_is_profiler_enabled", False))


def foreign_profiler() -> Optional[str]:
    """Why a profiler of someone else counts as running, or None; call it while none of ours runs.

    >>> foreign_profiler() is None
    True
    """
    global _clean_at
    if kineto_recording():
        return _RECORDING
    if _STEP_KEY not in (_step_dict() or {}):
        return None
    state = profiles_state()
    with _lock:
        if state == _clean_at:
            return None
    reason = _other_profile_entered()
    if reason is None:
        with _lock:
            _clean_at = state
    return reason


def disturbed_since(state: tuple[Any, ...]) -> Optional[tuple[str, bool]]:
    """Why Kineto may no longer be ours, and whether theirs records now; None if it is ours.
    Call it while one of ours records, with the :func:`profiles_state` of its start. Someone
    else's profiler prepared (a scheduled profile's ``step()`` into its warm-up) or started
    meanwhile took over Kineto's session: exporting ours then crashes (rc 139 in
    ``export_chrome_trace``), and stopping ours while theirs records ends theirs (its export
    crashes)."""
    if profiles_state() == state:
        return None
    reason = _other_profile_entered(prepared_only=True)
    return None if reason is None else (reason, reason == _RECORDING)


def _step_dict() -> Any:
    """torch's step tracker's registrations (None in a torch without one)."""
    return getattr(getattr(_autograd_profiler, "KinetoStepTracker", None), "_step_dict", None)


def _classes() -> tuple[type, type]:
    return torch.profiler.profile, _autograd_profiler.profile


def _with_subclasses(cls: type) -> list[type]:
    found, todo = [], [cls]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return found


def profiles_state() -> tuple[Any, ...]:
    """What changes when a profile of someone else's is made, freed, entered or prepared."""
    tracker = getattr(_autograd_profiler, "KinetoStepTracker", None)
    steps = getattr(tracker, "_step_dict", None) or {}
    outer, inner = _classes()
    own = list(_own)
    mine = sum(1 for obj in own if isinstance(obj, outer)), sum(1 for obj in own if isinstance(obj, inner))
    return (
        steps.get(_STEP_KEY),
        getattr(tracker, "_current_step", None),
        sum(sys.getrefcount(kind) for kind in _with_subclasses(outer)) - mine[0],
        sum(sys.getrefcount(kind) for kind in _with_subclasses(inner)) - mine[1],
        # An entered scheduled profile holds its ``ProfilerStep#<n>`` range object.
        sys.getrefcount(_autograd_profiler.record_function),
    )


def _other_profile_entered(*, prepared_only: bool = False) -> Optional[str]:
    outer, inner = _classes()
    for prof in list(_own):  # the torch.autograd profile inside a profile of ours is ours too
        mark_own(prof)
    kinds = _with_subclasses(outer) + _with_subclasses(inner)
    waiting = False
    # Instances of a Python class refer to it: the collector finds them without a registry.
    for obj in gc.get_referrers(*kinds):
        if isinstance(obj, inner):
            # Prepared (or started) and not stopped: torch sets the end time at its stop. Not
            # "no results": whoever is done with a profile may drop them (our writer does).
            if getattr(obj, "entered", False) and getattr(obj, "profiling_end_time_ns", 1) == 0 and obj not in _own:
                return _RECORDING if getattr(obj, "profiling_start_time_ns", 0) else _WARMING_UP
        elif isinstance(obj, outer) and not prepared_only:
            # Entered, not stopped: a scheduled profile holds its open ProfilerStep range.
            if getattr(obj, "step_rec_fn", None) is not None and obj not in _own:
                waiting = True
    if waiting:
        return "another torch profiler is entered in this process (its schedule's wait phase)"
    return None


def mark_own(prof: Any) -> None:
    """``prof`` (a profile of :func:`new_own_profile`) and what torch made inside it are ours."""
    _own.add(prof)
    inner = getattr(prof, "profiler", None)
    if inner is not None:
        _own.add(inner)


def new_own_profile(**kwargs: Any) -> Any:
    """A ``torch.profiler.profile`` of ours that does not count as someone else's.

    Its constructor registers ``"ProfilerStep"`` with the step tracker until an ``__exit__``
    that a start/stop profiler never calls: undo that, unless another profile registered first.
    """
    steps = _step_dict()
    registered_before = steps is not None and _STEP_KEY in steps
    prof = torch.profiler.profile(**kwargs)
    if steps is not None and not registered_before:
        steps.pop(_STEP_KEY, None)
    _own.add(prof)
    return prof


def settle_own_profile(prof: Any, *, stopping: bool) -> bool:
    """Leave no profiler of ours on after its ``start()`` or ``stop()`` raised (a Ctrl-C lands at
    any bytecode of torch's Python code). Call it in the thread that started ``prof``. Returns
    whether torch's results of a stop survived (a start's are dropped).

    Where the interrupt landed decides: before torch disabled Kineto (stop again), between
    ``_disable_profiler()`` returning and its result being stored (results lost, Kineto off),
    or after (results kept); in each case torch's process-wide ``_is_profiler_enabled`` may
    still read True, which :func:`foreign_profiler` would take for someone else's profiler.
    """
    inner = getattr(prof, "profiler", None)
    if inner is None:  # torch had not even prepared: nothing runs
        return False
    for attempt in range(3):  # a second Ctrl-C, or a step of torch's stop failing: try again
        try:
            if torch.autograd._profiler_enabled():  # this thread's view: Kineto still records
                if attempt == 0:
                    prof.stop()
                else:
                    prof.stop_trace()  # only the part that disables Kineto
            elif not stopping and getattr(inner, "entered", False) and inner.kineto_results is None:
                # Prepared, never enabled (interrupted between the two): torch's own way out of
                # a warm-up is to start and stop at once.
                prof.start_trace()
                prof.stop_trace()
            break
        except (KeyboardInterrupt, Exception):  # the caller re-raises the first interrupt
            continue
    if _autograd_profiler._is_profiler_enabled and not torch.autograd._profiler_enabled():
        _autograd_profiler._run_on_profiler_stop()  # torch's own reset of its flag, left unrun
    mark_own(prof)  # already ours: its inner, left entered without results, is no warm-up
    return stopping and inner.kineto_results is not None
