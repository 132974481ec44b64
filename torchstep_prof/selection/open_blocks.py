"""Steps begun with ``begin_step`` and not yet ended, and ending them.

Kept per thread or task, and process-wide, so that the exit of the scope they were begun
under, or interpreter exit, ends those left open."""

from __future__ import annotations

import contextvars
import sys
import threading
from typing import Any, Optional, Protocol

from .._fork import at_fork_in_child

__all__ = ["BegunStep", "begun", "claim", "end_all", "end_under", "opened"]


class BegunStep(Protocol):
    """What ``begin_step`` registers: a step block entered, with the frame it was entered under."""

    frame: Any

    def _end(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


# The step this thread / task began and has not ended (a loop calls only ``begin_step``).
_BEGUN: contextvars.ContextVar[Optional[BegunStep]] = contextvars.ContextVar("torchstep_prof_begun_step", default=None)
# Every begun step of the process still open: a scope's exit may end one begun in another task.
_OPEN: set[BegunStep] = set()
_LOCK = threading.Lock()


def begun() -> Optional[BegunStep]:
    """The step this thread or task began and has not ended, if any."""
    return _BEGUN.get()


def opened(block: BegunStep) -> None:
    """``block`` was begun here; it stays open until ``claim``-ed."""
    with _LOCK:
        _OPEN.add(block)
    _BEGUN.set(block)


def claim(block: BegunStep) -> bool:
    """Take ``block`` out of the open ones; True for the one caller that must end it."""
    if _BEGUN.get() is block:
        _BEGUN.set(None)
    with _LOCK:
        if block not in _OPEN:
            return False
        _OPEN.discard(block)
        return True


def end_under(frame: Any) -> None:
    """End every begun step still open under ``frame`` (its scope is exiting, maybe because an
    exception leaves the loop: that exception is what the step's block sees)."""
    if not _OPEN:
        return
    with _LOCK:
        # An on-demand step's frame is made over the scope's (its ``base``): it ends here too.
        left = [block for block in _OPEN if block.frame is frame or getattr(block.frame, "base", None) is frame]
    for block in left:
        if claim(block):
            block._end(*sys.exc_info())


def end_all() -> None:
    """End every begun step still open (interpreter exit)."""
    with _LOCK:
        left = list(_OPEN)
    for block in left:
        if claim(block):
            block._end(None, None, None)


def _forget_after_fork() -> None:
    # A forked child never ends (stops, writes) a step its parent began: it is not the child's.
    global _LOCK
    _LOCK = threading.Lock()
    _OPEN.clear()


at_fork_in_child(_forget_after_fork)
