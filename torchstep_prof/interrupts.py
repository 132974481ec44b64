"""The Ctrl-C guard: no KeyboardInterrupt may leave torch's profiler running with nothing to stop it.

Python raises KeyboardInterrupt at whatever bytecode the main thread runs when it handles the
signal. Landing between two lines of a region's exit (before it reached torch's ``stop()``),
or between torch's start and the block storing what stops it, it would leave torch's profiler
running for good: every later step would then join that dead trace. So, only while Python's
own Ctrl-C handler is in force:

- across a start or stop of torch's profiler (:class:`HeldCtrlC`), a Ctrl-C is noted and
  raised when the transition is over. That takes milliseconds, or a second or two to stop a
  very big trace, which is then written instead of lost;
- while a trace the main thread started records, a Ctrl-C that finds the main thread in
  torchstep_prof's own code (the first lines of a region's exit, say) is held until that trace
  stops: the end of the profiled block or step (later only for a region left open across
  steps, a suspended generator's). One that finds it in the training code is raised at once,
  as always: the block's exit then stops the trace.

Only the main thread gets signals; a user's own SIGINT handler is left alone, and so are the
waits a Ctrl-C must be able to end (:func:`interruptible`).
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.getsignal and signal.signal run Python code (enum
import _thread  # conversions) where a Ctrl-C could land unguarded
import os
import signal
import threading
from types import CodeType, FrameType, TracebackType
from typing import Callable, Optional, TypeVar

from ._fork import at_fork_in_child

__all__ = ["HeldCtrlC", "interruptible", "main_trace_began", "main_trace_ended"]

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

    __slots__ = ("main_ident", "holds", "traces", "noted")

    def __init__(self) -> None:
        self.main_ident = threading.main_thread().ident
        self.holds = 0
        self.traces = 0
        self.noted = False  # a Ctrl-C held (in a hold, or in our code while a trace records), not raised yet


_GUARD = _Guard()


def _in_interruptible(frame: Optional[FrameType]) -> bool:
    # The frame or a caller close above it (a wait's own sleep is C; `Event.is_set` is not).
    for _ in range(3):
        if frame is None:
            return False
        if frame.f_code in _INTERRUPTIBLE:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: Optional[FrameType]) -> None:
    guard = _GUARD
    code = frame.f_code if frame is not None else None
    if not (guard.holds or guard.traces) or _in_interruptible(frame):
        signal.default_int_handler(signum, frame)
    if guard.holds or (code is not None and code.co_filename.startswith(_PACKAGE_DIR)):
        guard.noted = True  # raised at the end of the hold, or of the trace
        return
    signal.default_int_handler(signum, frame)


def _engage() -> None:
    # Whether ours is in force is read from the handler itself, never kept in a flag: a Ctrl-C
    # may land between setting one and swapping the handler.
    if _signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        try:
            _signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:  # not the main interpreter (only it may set handlers): nothing to guard
            pass


def _release() -> None:
    """On the main thread, once nothing is held: give Python's handler back unless a trace of
    the main thread still records, else raise a noted Ctrl-C (one noted while a trace records
    is raised when it stops: raising now could leave it running with nothing to stop it)."""
    guard = _GUARD
    if guard.holds or guard.traces:
        return
    # Taken first: swapping the handler back raises any Ctrl-C still pending, and the noted one
    # must not outlive that raise (a later hold would raise it again).
    noted, guard.noted = guard.noted, False
    if _signal.getsignal(signal.SIGINT) is _on_sigint:  # unless someone installed theirs meanwhile
        _signal.signal(signal.SIGINT, signal.default_int_handler)
    if noted:
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

    >>> with HeldCtrlC() as held:   # doctest: +SKIP
    ...     prof.stop()                # a Ctrl-C now waits for this line to return
    """

    __slots__ = ("_counted",)

    def __init__(self) -> None:
        self._counted = False

    def __enter__(self) -> HeldCtrlC:
        if _thread.get_ident() == _GUARD.main_ident:
            _engage()  # first: a Ctrl-C raised in here leaves no hold counted
            _GUARD.holds += 1  # from here on, a Ctrl-C is noted
            self._counted = True
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


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) records nothing of ours: Python's handler back.
    global _GUARD
    _GUARD = _Guard()
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)


at_fork_in_child(_forget_in_child)
