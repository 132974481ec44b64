"""The package's one fork handler, and how a child forked from a profiling process exits.

A forked child (a DataLoader worker) inherits its parent's state: locks another thread may have
held, threads that do not exist in it, a running profiler. Each module that keeps such state
registers, with :func:`at_fork_in_child`, a function that forgets it; this module's one
``os.register_at_fork`` handler runs them in the child, in the order they were registered.

Such a child also hangs, or aborts with ``std::system_error``, on a normal interpreter exit
(``sys.exit()``) if the parent ran torch's profiler: Kineto's ``ConfigLoader`` destructor runs
at ``exit()`` and waits for a thread that exists only in the parent. ``os._exit`` skips
destructors. So the child registers, through glibc's ``on_exit``, ``_exit`` itself as a
handler, which ends the process with ``_exit(status)``: it runs at ``exit()`` before the
destructors registered when torch loaded (handlers run in reverse order of registration), and
it receives the status ``sys.exit(3)`` gave. Where ``on_exit`` is missing (not glibc), nothing
is done. No torch import here: the command line may use this module.
"""

from __future__ import annotations

import os
from typing import Callable

__all__ = ["at_fork_in_child", "exit_without_destructors"]

_in_child: list[Callable[[], None]] = []
_registered = False


def at_fork_in_child(forget: Callable[[], None]) -> None:
    """Run ``forget()`` in every child forked from now on (after those registered before).

    >>> at_fork_in_child(_forget_cache)  # doctest: +SKIP
    """
    _in_child.append(forget)


def _after_fork_in_child() -> None:
    for forget in list(_in_child):
        forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def exit_without_destructors() -> None:
    """In a forked child: make its normal exit end in ``_exit(status)`` (once per process)."""
    global _registered
    if _registered:
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        on_exit, underscore_exit = libc.on_exit, libc._exit  # glibc only
    except (OSError, AttributeError):
        return
    # ``_exit`` itself is the handler: glibc calls it as ``handler(status, arg)``, and the extra
    # argument is ignored. No Python callback: the interpreter is finalized by then. Python's
    # own streams are flushed during finalization, before exit() runs the handlers.
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit(ctypes.cast(underscore_exit, ctypes.c_void_p), None)
    _registered = True
