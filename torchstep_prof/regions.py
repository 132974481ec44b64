"""What training code marks: ``step(n)`` blocks, ``profile_region`` blocks, ``@profiled`` functions.

These are the hot path: users leave them around every stage of every step. When nothing can be
profiled (no schedule in force, or profiling disabled) a region reads one context variable and
one attribute, and returns. They are classes, not generator context managers (~4x cheaper).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar

from .engine import CURRENT_STEP, ENGINE
from .naming import sanitize_label
from .scopes import _STACK, _ROOT, current_frame

__all__ = ["profile_region", "profiled", "step"]

F = TypeVar("F", bound=Callable[..., Any])


class profile_region:
    """Mark a region of a training step as ``<role>/<stage>``.

    On a selected step and rank the outermost region starts the profiler and writes its own
    trace (discrete mode); regions inside a running trace appear in it as ranges.

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[1]), tsp.step(1):        # doctest: +SKIP
    ...     with tsp.profile_region("actor", "compute_log_prob"):
    ...         pass

    ``step`` overrides the enclosing ``step(n)`` block; without either, a per-process counter
    per (role, stage) numbers the entries made while a schedule is in force, from 1.
    A region object is entered once at a time; make a new one for each ``with``.
    """

    __slots__ = ("role", "stage", "step", "_active")

    def __init__(self, role: str, stage: str, *, step: Optional[int] = None) -> None:
        self.role = role
        self.stage = stage
        self.step = step
        self._active: Any = None

    def __enter__(self) -> profile_region:
        frame = _STACK.get(_ROOT)
        if frame.idle:
            return self
        if frame is _ROOT:
            frame = current_frame()
        self._active = ENGINE.enter_region(frame, self.role, self.stage, self.step)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        active = self._active
        if active is not None:
            self._active = None
            active.__exit__(exc_type, exc, tb)


class step:
    """Mark training step ``number`` (from 1); regions inside belong to it.

    In fused mode (``configure(discrete=False)``) a selected step's block owns one trace holding
    every region inside it. The block of the last step a finite schedule selects also runs the
    finish hook on exit.

    >>> import torchstep_prof as tsp
    >>> for n in range(1, 3):
    ...     with tsp.step(n):
    ...         pass
    """

    __slots__ = ("number", "_token", "_frame", "_owned")

    def __init__(self, number: int) -> None:
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise ValueError(f"step number must be an integer >= 1 (got {number!r})")
        self.number = number

    def __enter__(self) -> step:
        frame = current_frame()
        self._frame = frame
        self._owned = None
        self._token = CURRENT_STEP.set(self)
        if not frame.idle and not frame.config.discrete:
            self._owned = ENGINE.enter_step(frame, self.number)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self._owned is not None:
                self._owned.__exit__(exc_type, exc, tb)
        finally:
            self._owned = None
            CURRENT_STEP.reset(self._token)
            if not self._frame.idle:
                ENGINE.step_exited(self._frame, self.number)


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
    sanitize_label(role, "role")
    if stage is not None:
        sanitize_label(stage, "stage")

    def decorate(fn: F) -> F:
        label = stage if stage is not None else getattr(fn, "__name__", None)
        if not isinstance(label, str):
            raise TypeError(f"@profiled needs stage= for {fn!r}, which has no __name__")
        sanitize_label(label, "stage")
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"@profiled cannot wrap the generator {fn.__qualname__}: its body runs after the "
                "call returns. Put `with profile_region(...)` inside the loop that consumes it."
            )
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
                with profile_region(role, label):
                    return await fn(*args, **kwargs)

            return run_coroutine  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with profile_region(role, label):
                return fn(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate
