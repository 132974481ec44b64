"""Ray calls as clock anchors for the job-wide timeline.

A remote task runs after its caller submitted it and ends before the caller's ``ray.get``
returns, so each call bounds the two processes' clock offset.

Ray actors often share no torch.distributed group, so ``tsp.clock_anchor`` cannot align them;
a call between two of them can. Note the caller's side with :func:`submit` and :func:`get`, and
the task's with :func:`anchored` on the remote function or actor method; each process logs its
side in its span log (``tsp.spans``), keyed by Ray's task id, and notes it for the next trace it
writes (:func:`~torchstep_prof.timeline.wall_clock.note_ray`, spans on or off: a job traced
without a span log aligns its actors too); ``torchstep-prof timeline`` pairs them
(docs/timeline.md, "One clock").

>>> import ray                                                    # doctest: +SKIP
>>> from torchstep_prof.integrations import ray as tsp_ray         # doctest: +SKIP
>>> @ray.remote                                                   # doctest: +SKIP
... class Rollout:
...     @tsp_ray.anchored
...     def generate(self, n): ...
>>> ref = tsp_ray.submit(rollout.generate, 7)   # doctest: +SKIP
>>> tokens = tsp_ray.get(ref)                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Optional, TypeVar

import ray

from .._wrapping import around_each_call
from ..region_metrics import recorder as _recorder
from ..timeline.wall_clock import note_ray

__all__ = ["anchored", "get", "submit"]

F = TypeVar("F", bound=Callable[..., Any])

_perf = _recorder._perf


def submit(method: Any, *args: Any, **kwargs: Any) -> Any:
    """``method.remote(*args, **kwargs)`` (an actor method or a remote function), noting the
    time just before it for each task it returns a reference of.

    >>> ref = submit(actor.update, batch)          # doctest: +SKIP
    """
    before = _perf()
    refs = method.remote(*args, **kwargs)
    for ref in _refs(refs):
        task = ref.task_id().hex()
        _note("submitted", task, before, before)
        _remember(ref.binary(), task)
    return refs


def get(refs: Any, *, timeout: Optional[float] = None) -> Any:
    """``ray.get(refs, timeout=timeout)``, noting the time it returned for each reference
    :func:`submit` made here (its task had ended by then). A timeout or an error notes nothing.

    Only references ``submit`` made count: any other (one ``ray.put`` made inside a task, say)
    may be ready before the task that made it ends.

    >>> values = get([ref_a, ref_b])                # doctest: +SKIP
    """
    values = ray.get(refs, timeout=timeout)
    after = _perf()
    if _SUBMITTED:
        for ref in _refs(refs):
            task = _SUBMITTED.pop(ref.binary(), None)
            if task is not None:
                _note("returned", task, after, after)
    return values


def anchored(fn: F) -> F:
    """Note when each call of ``fn`` (a Ray actor method or remote function, under
    ``@ray.remote``) starts and ends, with Ray's id of the task it runs in.

    >>> @ray.remote                                 # doctest: +SKIP
    ... class Reference:
    ...     @anchored
    ...     def compute_log_prob(self, batch): ...
    """
    return around_each_call(  # type: ignore[no-any-return]
        fn,
        _task_run,
        "torchstep_prof.integrations.ray.anchored",
        "Anchor a function that returns a value.",
        idle=_NOTHING,
    )


@contextlib.contextmanager
def _ran(task: str) -> Iterator[None]:
    """One run of an anchored task: its start, noted at its end (a raise included)."""
    start = _perf()
    try:
        yield
    finally:
        _note("ran", task, start, _perf())


_NOTHING = contextlib.nullcontext()  # shared: it holds nothing


def _note(what: str, task: str, start: float, end: float) -> None:
    """One side of a call: into the span log when it is on, and for the next trace either way."""
    _recorder.record_ray(what, task, start, end)
    note_ray(what, task, start, end)


def _task_run() -> Any:
    try:
        task = ray.get_runtime_context().get_task_id()
    except Exception:  # not in a task (called directly, in the driver): nothing to pair
        task = None
    return _NOTHING if not isinstance(task, str) else _ran(task)


MAX_PENDING = 1 << 16
"""References :func:`submit` remembers until :func:`get` returns them (the oldest are forgotten
first: a reference never got costs no memory past this)."""
_SUBMITTED: dict[bytes, str] = {}  # a submitted reference's object id -> its task's id


def _remember(object_id: bytes, task: str) -> None:
    _SUBMITTED[object_id] = task
    if len(_SUBMITTED) > MAX_PENDING:
        try:
            del _SUBMITTED[next(iter(_SUBMITTED))]
        except (KeyError, RuntimeError, StopIteration):  # another thread got there first
            pass


def _refs(refs: Any) -> list[Any]:
    """The object references in ``refs`` (one, or a list of them; anything else has none)."""
    if isinstance(refs, ray.ObjectRef):
        return [refs]
    if isinstance(refs, (list, tuple)):
        return [ref for ref in refs if isinstance(ref, ray.ObjectRef)]
    return []
