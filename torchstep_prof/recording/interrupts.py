"""The Ctrl-C guard: no KeyboardInterrupt may leave torch's profiler running with nothing to stop it.

Python raises KeyboardInterrupt at whatever bytecode the main thread runs when it handles the
signal. Landing between two lines of a region's exit (before it reached torch's ``stop()``),
or between torch's start and the block storing what stops it, it would leave torch's profiler
running for good: every later step would then join that dead trace. So, only while Python's
own Ctrl-C handler is in force:

- across a start or stop of torch's profiler (:func:`hold_ctrl_c`), a Ctrl-C is noted and
  raised when the transition is over. That takes milliseconds, or a second or two to stop a
  very big trace, which is then written instead of lost;
- while a trace the main thread started records, a Ctrl-C that finds the main thread in
  torchstep_prof's own code (the first lines of a region's exit, say) is held until that trace
  stops: at the latest, the end of the profiled block or step. One that finds it in the
  training code is raised at once, as always: the block's exit then stops the trace.

Only the main thread gets signals; a user's own SIGINT handler is left alone, and so are the
waits a Ctrl-C must be able to end (:func:`interruptible`).
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from types import CodeType, FrameType, TracebackType
from typing import Callable, Optional, TypeVar

from .._fork import at_fork_in_child

__all__ = ["HeldCtrlC", "hold_ctrl_c", "interruptible", "main_trace_began", "main_trace_ended"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

_INTERRUPTIBLE: set[CodeType] = set()  # see interruptible()

F = TypeVar("F", bound=Callable[..., object])


def interruptible(function: F) -> F:
    """Mark a function of ours as a wait a Ctrl-C must end at once, held or not: it polls, and
    nothing is half-done while it sleeps (the trace being waited for is queued already).

    >>> @interruptible          # doctest: +SKIP
    ... def wait_for_event(event, timeout=None): ...
    """
    _INTERRUPTIBLE.add(function.__code__)
    return function


class _Guard:
    """Process state of the guard: holds open and traces recording on the main thread."""

    __slots__ = ("main_ident", "holds", "traces", "installed", "noted")

    def __init__(self) -> None:
        self.main_ident = threading.main_thread().ident
        self.holds = 0
        self.traces = 0
        self.installed = False
        self.noted = False  # a Ctrl-C came during a hold and is not raised yet


_GUARD = _Guard()


def _on_sigint(signum: int, frame: Optional[FrameType]) -> None:
    guard = _GUARD
    code = frame.f_code if frame is not None else None
    if code in _INTERRUPTIBLE or not (guard.holds or guard.traces):
        signal.default_int_handler(signum, frame)
    if guard.holds or (code is not None and code.co_filename.startswith(_PACKAGE_DIR)):
        guard.noted = True  # raised at the end of the hold, or of the trace
        return
    signal.default_int_handler(signum, frame)


def _engage() -> None:
    guard = _GUARD
    if not guard.installed and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:  # not the main interpreter (only it may set handlers): nothing to guard
            return
        guard.installed = True


def _release() -> None:
    """On the main thread: give Python's handler back once nothing is held or recording, and
    raise a noted Ctrl-C once nothing is held."""
    guard = _GUARD
    if guard.holds:
        return
    if guard.installed and not guard.traces:
        guard.installed = False
        if signal.getsignal(signal.SIGINT) is _on_sigint:  # unless someone installed theirs meanwhile
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if guard.noted:
        guard.noted = False
        raise KeyboardInterrupt


def main_trace_began() -> bool:
    """A trace started (in a hold); when on the main thread, a Ctrl-C that lands in our code
    is held until :func:`main_trace_ended`. Returns whether it was counted."""
    if _thread.get_ident() != _GUARD.main_ident:
        return False
    _GUARD.traces += 1
    _engage()
    return True


def main_trace_ended(counted: bool) -> None:
    """The trace that :func:`main_trace_began` counted is stopped, in any thread."""
    guard = _GUARD
    if not counted or not guard.traces:
        return
    guard.traces -= 1
    if not guard.traces and not guard.holds and guard.noted:  # (a stop's hold raises it itself)
        guard.noted = False
        _thread.interrupt_main(signal.SIGINT)  # the main thread raises it at its next bytecode


class HeldCtrlC:
    """A hold (a context manager): on the main thread, a Ctrl-C inside it is raised as it ends.

    >>> with hold_ctrl_c() as held:   # doctest: +SKIP
    ...     prof.stop()                # a Ctrl-C now waits for this line to return
    """

    __slots__ = ("_counted",)

    def __init__(self) -> None:
        self._counted = False

    def __enter__(self) -> HeldCtrlC:
        if _thread.get_ident() == _GUARD.main_ident:
            _GUARD.holds += 1
            self._counted = True
            _engage()
        return self

    @property
    def noted(self) -> bool:
        """Whether a Ctrl-C came during the hold and is not raised yet."""
        return self._counted and _GUARD.noted

    def deliver_now(self) -> None:
        """Raise a noted Ctrl-C at once: for a point where nothing is taken yet (waiting for
        another thread's profiler, say)."""
        if self.noted:
            _GUARD.noted = False
            raise KeyboardInterrupt

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        if self._counted:
            self._counted = False
            _GUARD.holds -= 1
            _release()


def hold_ctrl_c() -> HeldCtrlC:
    """Hold a Ctrl-C on the main thread until the ``with`` block ends, then raise it."""
    return HeldCtrlC()


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) records nothing of ours: Python's handler back.
    global _GUARD
    installed = _GUARD.installed
    _GUARD = _Guard()
    if installed and signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)


at_fork_in_child(_forget_in_child)
