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

A profiler in warm-up is a ``torch.autograd.profiler.profile`` entered (prepared) and not yet
stopped; finding one means walking the garbage collector's objects (~30-130 ms), so that walk
runs only while a ``torch.profiler.profile`` is registered, and not again until that profiler
steps (the tracker's count changes).

A Ctrl-C can land at any bytecode of torch's own ``start()`` / ``stop()``: :func:`settle_own_profile`
then finishes the job, so that none of ours stays on and torch's flag does not read as someone
else's profiler for the rest of the run.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from typing import Any, Optional

import torch
from torch.autograd import profiler as _autograd_profiler

__all__ = ["foreign_profiler", "kineto_recording", "new_own_profile", "settle_own_profile"]

_STEP_KEY = "ProfilerStep"  # torch.profiler.profiler.PROFILER_STEP_NAME
_lock = threading.Lock()
_clean_at: Optional[tuple[Any, ...]] = None  # the tracker's state when a walk found no warm-up
# Our own torch.autograd profiles left entered without results by an interrupted stop: not warm-ups.
_settled: "weakref.WeakSet[Any]" = weakref.WeakSet()


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
        return "another torch profiler is recording in this process"
    tracker = getattr(_autograd_profiler, "KinetoStepTracker", None)
    steps = getattr(tracker, "_step_dict", None)
    if not steps or _STEP_KEY not in steps:
        return None
    state = (steps.get(_STEP_KEY), getattr(tracker, "_current_step", None))
    with _lock:
        if state == _clean_at:
            return None
    if _prepared_profiler_exists():
        return "another torch profiler is in its warm-up in this process"
    with _lock:
        _clean_at = state
    return None


def _prepared_profiler_exists() -> bool:
    cls = _autograd_profiler.profile
    # Instances of a Python class refer to it: the collector finds them without a registry.
    for obj in gc.get_referrers(cls):
        if isinstance(obj, cls) and getattr(obj, "entered", False) and getattr(obj, "kineto_results", 1) is None:
            if obj not in _settled:
                return True
    return False


def new_own_profile(**kwargs: Any) -> Any:
    """A ``torch.profiler.profile`` of ours that does not count as someone else's.

    Its constructor registers ``"ProfilerStep"`` with the step tracker until an ``__exit__``
    that a start/stop profiler never calls: undo that, unless another profile registered first.
    """
    import torch

    tracker = getattr(_autograd_profiler, "KinetoStepTracker", None)
    steps = getattr(tracker, "_step_dict", None)
    registered_before = steps is not None and _STEP_KEY in steps
    prof = torch.profiler.profile(**kwargs)
    if steps is not None and not registered_before:
        steps.pop(_STEP_KEY, None)
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
    survived = stopping and inner.kineto_results is not None
    if not survived:
        _settled.add(inner)
    return survived
