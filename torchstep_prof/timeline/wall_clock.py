"""The process's one wall clock for spans: ``perf_counter`` plus one offset, and the last anchors and Ray calls.

A foundation (no profiling state): the span log sets the offset when it starts
(:func:`use_base`), a written trace turns its anchors into wall time with :func:`to_wall`
(writing/trace_timeline.py), and :func:`torchstep_prof.clock_anchor` notes each barrier here
with spans on or off, so a trace carries the anchors of its window. The Ray integration
(``torchstep_prof.integrations.ray``) notes each side of a Ray call here alike (:func:`note_ray`),
so that traces carry the calls that align Ray actors' clocks.
"""

from __future__ import annotations

import collections
import itertools
import time

from .._fork import at_fork_in_child

# The last anchors passed (perf_counter times). Bounded: an anchor every step for 256 steps.
_RECENT_ANCHORS: collections.deque[tuple[str, int, float, float]] = collections.deque(maxlen=256)
# The last sides of Ray calls noted (number, task, what, perf_counter start and end): several a
# step for a few hundred steps. Numbered, so that each goes in one trace (:func:`recent_ray`).
_RECENT_RAY: collections.deque[tuple[int, str, str, float, float]] = collections.deque(maxlen=1024)
_RAY_NUMBERS = itertools.count(1)
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


def note_ray(what: str, task: str, start: float, end: float) -> None:
    """Keep one side of a Ray call (``perf_counter`` times) for the next trace written: task
    ``task`` ``submitted`` or ``returned`` here (an instant), or ``ran`` here from start to end."""
    _RECENT_RAY.append((next(_RAY_NUMBERS), task, what, start, end))


def recent_ray(after: int = 0) -> tuple[list[tuple[str, str, float, float]], int]:
    """The sides of Ray calls noted lately (at most 1024) past number ``after``: task, what,
    start and end (wall seconds), and the number of the last one (``after`` when none).

    >>> items, last = recent_ray(after=1 << 62)
    >>> items, last == 1 << 62
    ([], True)
    """
    kept = [item for item in list(_RECENT_RAY) if item[0] > after]
    items = [(task, what, to_wall(start), to_wall(end)) for _, task, what, start, end in kept]
    return items, max((item[0] for item in kept), default=after)


def _after_fork_in_child() -> None:
    _RECENT_ANCHORS.clear()  # the parent's barriers, not the child's
    _RECENT_RAY.clear()  # the parent's Ray calls


at_fork_in_child(_after_fork_in_child)
