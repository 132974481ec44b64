"""A child forked from a process that ran torch's profiler: it exits with its own status.

Such a child hangs, or aborts with ``std::system_error``, on a normal interpreter exit
(``sys.exit()``): Kineto's ``ConfigLoader`` destructor runs at ``exit()`` and waits for a
thread that exists only in the parent. ``os._exit`` skips destructors. So the child registers,
through glibc's ``on_exit``, ``_exit`` itself as a handler, which ends the process with
``_exit(status)``: it runs at ``exit()`` before the destructors registered when torch loaded
(handlers run in reverse order of registration), and it receives the status ``sys.exit(3)``
gave. Where ``on_exit`` is missing (not glibc), nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["exit_without_destructors"]

_registered = False


def exit_without_destructors() -> None:
    """In a forked child: make its normal exit end in ``_exit(status)`` (once per process)."""
    global _registered
    if _registered:
        return
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
