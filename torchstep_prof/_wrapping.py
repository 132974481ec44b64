"""Running each call of a function or coroutine function inside a context manager.

What ``@profiled`` and the scopes used as decorators share."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, ContextManager


def around_each_call(
    fn: Any, manager: Callable[[], ContextManager[Any]], what: str, instead: str, idle: Any = None
) -> Any:
    """``fn`` wrapped so that each call (the awaited body, for a coroutine function) runs inside
    a fresh ``manager()``; a call whose manager is ``idle`` (a shared no-op) is just the call,
    which is what keeps a not-profiled ``@profiled`` call cheap. Generator functions are refused:
    their body runs after the call returns. ``what`` names the decorator and ``instead`` says
    what to do, in that error.
    """
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{what} cannot wrap the generator {fn.__qualname__}: its body runs after the call returns. {instead}"
        )
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
            with manager():
                return await fn(*args, **kwargs)

        return run_coroutine

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        context = manager()
        if context is idle:
            return fn(*args, **kwargs)
        with context:
            return fn(*args, **kwargs)

    return run
