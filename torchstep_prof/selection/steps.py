"""Step state: the step block in force, the per-(role, stage) counters, and trace occurrences.

A region's step is ``step=``, else the enclosing ``step(n)`` block's (:data:`CURRENT_STEP`),
else the next number of its (role, stage) counter (:func:`count`). The k-th trace of a
(role, stage) in one step of the process is its occurrence (docs/scopes-and-regions.md, "Occurrences").
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from typing import TYPE_CHECKING, Iterator, Optional, Protocol

if TYPE_CHECKING:
    from .frames import Frame
    from .rules import StepAction

__all__ = ["COUNTERS", "CURRENT_STEP", "StepBlock", "count", "forget_occurrences", "next_occurrence"]


class StepBlock(Protocol):
    """A ``step(n)`` block as the regions inside it read it (``regions.step``)."""

    number: int
    frame: Frame  # the frame it decided under
    action: StepAction  # the rule's answer for its step on this rank
    skip_frame: Optional[Frame]  # its cached no: regions under this frame return at once


# The innermost ``step(n)`` block of this thread / task.
CURRENT_STEP: contextvars.ContextVar[StepBlock] = contextvars.ContextVar("torchstep_prof_step")

# role -> stage -> counter (docs/hot-path.md, "Two lookups of interned strings")
COUNTERS: dict[str, dict[str, Iterator[int]]] = {}

# (role, stage, step) -> traces started so far; (None, None, step) for fused ones
_OCCURRENCES: dict[tuple[Optional[str], Optional[str], int], int] = {}
_LOCK = threading.Lock()


def count(role: str, stage: str) -> int:
    """The next number of the per-process counter of (role, stage), from 1.

    >>> count("doc", "example"), count("doc", "example")
    (1, 2)
    """
    stages = COUNTERS.get(role)
    if stages is None:
        stages = COUNTERS.setdefault(role, {})
        # (setdefault: another thread may have made it meanwhile)
    counter = stages.get(stage)
    if counter is None:  # regions call next() on it (docs/hot-path.md)
        counter = stages.setdefault(stage, itertools.count(1))
    return next(counter)


def next_occurrence(role: Optional[str], stage: Optional[str], step: int) -> int:
    """Count one more trace of (role, stage) in ``step`` (None, None for a fused trace);
    returns its occurrence, from 1."""
    key = (role, stage, step)
    with _LOCK:
        occurrence = _OCCURRENCES[key] = _OCCURRENCES.get(key, 0) + 1
    return occurrence


def forget_occurrences() -> None:
    """Count occurrences afresh, as a new process would (tests running many jobs in one)."""
    with _LOCK:
        _OCCURRENCES.clear()


def forget_after_fork() -> None:
    """A forked child: its lock is new (the parent's may have been held by another thread)."""
    global _LOCK
    _LOCK = threading.Lock()
