"""The process's one wall clock for spans: ``perf_counter`` plus one offset, and the last anchors passed.

A foundation (no profiling state): the span log sets the offset when it starts
(:func:`use_base`), a written trace turns its anchors into wall time with :func:`to_wall`
(writing/trace_timeline.py), and :func:`torchstep_prof.clock_anchor` notes each barrier here
with spans on or off, so a trace carries the anchors of its window.
"""

from __future__ import annotations

import collections
import time

from .._fork import at_fork_in_child

# The last anchors passed (perf_counter times). Bounded: an anchor every step for 256 steps.
_RECENT_ANCHORS: collections.deque[tuple[str, int, float, float]] = collections.deque(maxlen=256)
_BASE: list[float] = []  # wall minus perf_counter: the span log's, else taken at first use


def wall_minus_perf() -> float:
    """``time.time() - perf_counter()`` from the tightest of a few bracketed readings."""
    best = (float("inf"), 0.0)
    for _ in range(5):
        before = time.perf_counter()
        wall = time.time()
        after = time.perf_counter()
        best = min(best, (after - before, wall - (before + after) / 2))
    return best[1]


def use_base(base: float) -> None:
    """Make ``base`` (the span log's offset) the one :func:`to_wall` adds from now on."""
    _BASE[:] = [base]


def to_wall(perf: float) -> float:
    """A ``time.perf_counter()`` reading as seconds since the epoch: one offset per process
    (the span log's while it runs), so times keep the monotonic clock's order.

    >>> import time
    >>> abs(to_wall(time.perf_counter()) - time.time()) < 1.0
    True
    """
    if not _BASE:
        _BASE.append(wall_minus_perf())
    return perf + _BASE[0]


def note_anchor(name: str, seq: int, start: float, end: float) -> None:
    """Keep a clock anchor passed (``perf_counter`` entry and exit) for the next trace written."""
    _RECENT_ANCHORS.append((name, seq, start, end))


def recent_anchors() -> list[tuple[str, int, float, float]]:
    """The clock anchors passed lately (at most 256): name, seq, entered and left (wall seconds)."""
    return [(name, seq, to_wall(start), to_wall(end)) for name, seq, start, end in list(_RECENT_ANCHORS)]


def _after_fork_in_child() -> None:
    _RECENT_ANCHORS.clear()  # the parent's barriers, not the child's


at_fork_in_child(_after_fork_in_child)
