"""Which steps and ranks are profiled: pure functions of the config, testable without torch.

Step numbers start at 0. An explicit list may hold any of them; torch.profiler's cycle counts
from step 1 (step 1 is its first step), so a step 0 is selected only by an explicit list. Every
function here costs the same whatever the schedule's size (``active=30_000_000``,
``repeat=0``): the cycle is arithmetic, never a list of its steps.
"""

from __future__ import annotations

import bisect
import enum
import functools
import itertools
import operator
from typing import Container, Iterator, Optional, Sequence, Union

from ..config.model import ScheduleConfig

__all__ = [
    "CyclePlan",
    "ExplicitPlan",
    "NO_END",
    "NONE",
    "RECORD",
    "SchedulePlan",
    "StepAction",
    "WARMUP",
    "count_selected",
    "explicit_steps",
    "last_selected_step",
    "rank_selected",
    "selected_ranges",
    "sorted_steps",
    "step_action",
]


class StepAction(enum.IntEnum):
    """What the profiler does for one step: nothing, warm up (trace and discard), or record."""

    NONE = 0
    WARMUP = 1
    RECORD = 2


# The members as module names, read on every region: docs/hot-path.md, "Enum members as module names".
NONE, WARMUP, RECORD = StepAction.NONE, StepAction.WARMUP, StepAction.RECORD


_SET_LIMIT = 4096  # explicit lists up to this long are a set; longer ones a sorted tuple


class _SortedSteps:
    """A long explicit list as a sorted tuple: membership by bisection, without a set of
    millions of entries (a 1M-step set alone would cost ~32 MB)."""

    __slots__ = ("steps",)

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.steps = steps

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int):
            return False
        steps = self.steps
        i = bisect.bisect_left(steps, step)
        return i < len(steps) and steps[i] == step


@functools.lru_cache(maxsize=16)
def sorted_steps(steps: tuple[int, ...]) -> tuple[int, ...]:
    """An explicit list in order (the list itself when it already is: no copy)."""
    if all(map(operator.lt, steps, itertools.islice(steps, 1, None))):  # C loops: no copy
        return steps
    return tuple(sorted(steps))


@functools.lru_cache(maxsize=16)
def explicit_steps(steps: tuple[int, ...]) -> Container[int]:
    """What ``step in ...`` reads for an explicit list: a set, or for a long list the sorted
    steps searched by bisection (memory stays that of the list itself)."""
    if len(steps) <= _SET_LIMIT:
        return frozenset(steps)
    return _SortedSteps(sorted_steps(steps))


def step_action(schedule: Optional[ScheduleConfig], step: int) -> StepAction:
    """The action for ``step`` under ``schedule`` (torch.profiler's cycle, counted from step 1).

    >>> s = ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    >>> [n for n in range(0, 13) if step_action(s, n) is StepAction.RECORD]
    [4, 5, 8, 9]
    >>> step_action(ScheduleConfig(steps=(0, 3)), 0)
    <StepAction.RECORD: 2>
    """
    if schedule is None:
        return NONE
    if schedule.steps is not None:
        return RECORD if step in explicit_steps(schedule.steps) else NONE
    return CyclePlan(schedule).run_of(step)[2]


class ExplicitPlan:
    """An explicit list of steps, for deciding a step with one membership test (and, for a step
    not listed, a bisection that finds the gap around it).

    >>> plan = ExplicitPlan((2, 3, 9))
    >>> plan.run_of(3), plan.run_of(5), plan.run_of(10)
    ((3, 4, <StepAction.RECORD: 2>), (4, 9, <StepAction.NONE: 0>), (10, 4611686018427387904, <StepAction.NONE: 0>))
    """

    __slots__ = ("members", "ordered")

    def __init__(self, steps: tuple[int, ...]) -> None:
        self.members = explicit_steps(steps)
        self.ordered = sorted_steps(steps)

    def run_of(self, step: int) -> tuple[int, int, StepAction]:
        """``(first, end, action)``: ``step`` alone when listed, else the gap of unlisted steps
        ``first <= n < end`` around it."""
        if step in self.members:
            return step, step + 1, RECORD
        ordered = self.ordered
        i = bisect.bisect_left(ordered, step)
        return (ordered[i - 1] + 1 if i else 0), (ordered[i] if i < len(ordered) else NO_END), NONE


class CyclePlan:
    """torch.profiler's cycle as a few integers, for deciding a step with arithmetic alone.

    >>> plan = CyclePlan(ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2))
    >>> [plan.run_of(n)[2].name[0] for n in range(1, 11)]
    ['N', 'N', 'W', 'R', 'R', 'N', 'W', 'R', 'R', 'N']
    >>> plan.run_of(4)
    (4, 6, <StepAction.RECORD: 2>)
    """

    __slots__ = ("first", "span", "cycle", "wait", "warm_end")

    def __init__(self, schedule: ScheduleConfig) -> None:
        self.first = schedule.skip_first + 1  # the cycle's first step
        self.cycle = schedule.wait + schedule.warmup + schedule.active
        self.span = self.cycle * schedule.repeat  # steps covered from ``first``; 0: no end
        self.wait = schedule.wait
        self.warm_end = schedule.wait + schedule.warmup

    def run_of(self, step: int) -> tuple[int, int, StepAction]:
        """``(first, end, action)``: the run of consecutive steps ``first <= n < end`` around
        ``step`` that share its action. A frame keeps it, so the steps of one run are decided by
        one chained comparison (cheaper than ``in range(...)``, which also tests divisibility)."""
        first, span = self.first, self.span
        end = first + span if span else NO_END
        if step < first:
            return 0, first, NONE
        if step >= end:
            return end, NO_END, NONE
        if self.warm_end == 0:  # back-to-back active steps: one run, however many cycles
            return first, end, RECORD
        start = step - (step - first) % self.cycle
        if step < start + self.wait:
            return start, start + self.wait, NONE
        if step < start + self.warm_end:
            return start + self.wait, start + self.warm_end, WARMUP
        return start + self.warm_end, start + self.cycle, RECORD


NO_END = 2**62
"""Past any step a loop reaches: the end of a run of steps that never ends."""

SchedulePlan = Union[ExplicitPlan, CyclePlan]
"""A schedule as a frame decides it: ``run_of(step)`` gives the run of steps sharing its action."""


def last_selected_step(schedule: Optional[ScheduleConfig]) -> Optional[int]:
    """The last step a finite schedule records, or None when it never ends (or records nothing).

    >>> last_selected_step(ScheduleConfig(steps=(2, 10)))
    10
    >>> last_selected_step(ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2))
    9
    """
    if schedule is None:
        return None
    if schedule.steps is not None:
        return max(schedule.steps)
    if schedule.repeat == 0:
        return None
    cycle = schedule.wait + schedule.warmup + schedule.active
    return schedule.skip_first + cycle * schedule.repeat


def _recorded_upto(schedule: ScheduleConfig, last: int) -> int:
    """How many steps in ``0..last`` the schedule records."""
    if last < 0:
        return 0
    if schedule.steps is not None:
        return bisect.bisect_right(sorted_steps(schedule.steps), last)
    index = last - schedule.skip_first  # steps 1..last after the skipped ones
    if index <= 0:
        return 0
    cycle = schedule.wait + schedule.warmup + schedule.active
    if schedule.repeat:
        index = min(index, cycle * schedule.repeat)
    cycles, rest = divmod(index, cycle)
    return cycles * schedule.active + max(0, rest - schedule.wait - schedule.warmup)


def count_selected(schedule: Optional[ScheduleConfig], first: int, last: int) -> int:
    """How many steps in ``first..last`` ``schedule`` records, in constant time for a cycle.

    >>> count_selected(ScheduleConfig(active=30_000_000), 0, 10**9)
    30000000
    >>> count_selected(ScheduleConfig(wait=1, active=2, repeat=0), 1, 9)
    6
    """
    if schedule is None or last < first:
        return 0
    return _recorded_upto(schedule, last) - _recorded_upto(schedule, first - 1)


def selected_ranges(schedule: Optional[ScheduleConfig], first: int, last: int) -> Iterator[tuple[int, int]]:
    """The steps in ``first..last`` that ``schedule`` records, as ``(first, last)`` ranges in
    order, made lazily (stop when you have enough: a cycle gives one range per cycle).

    >>> list(selected_ranges(ScheduleConfig(wait=1, active=2, repeat=0), 1, 9))
    [(2, 3), (5, 6), (8, 9)]
    >>> list(selected_ranges(ScheduleConfig(active=1_000_000), 3, 10**9))
    [(3, 1000000)]
    >>> list(selected_ranges(ScheduleConfig(steps=(0, 1, 2, 5)), 0, 9))
    [(0, 2), (5, 5)]
    """
    if schedule is None or last < first:
        return
    if schedule.steps is None:  # the cycle's runs of recorded steps, clipped to first..last
        plan = CyclePlan(schedule)
        while first <= last:
            _, end, action = plan.run_of(first)
            if action is RECORD:
                yield first, min(end - 1, last)
            first = end
        return
    ordered = sorted_steps(schedule.steps)
    at, stop = bisect.bisect_left(ordered, first), bisect.bisect_right(ordered, last)
    while at < stop:  # a run of consecutive listed steps: ordered[at..end]
        end = at
        while end + 1 < stop and ordered[end + 1] == ordered[end] + 1:
            end += 1
        yield ordered[at], ordered[end]
        at = end + 1


def rank_selected(ranks: Sequence[int], all_ranks: bool, rank: int) -> bool:
    """Whether ``rank`` is chosen (``all_ranks`` wins; a rank that does not exist selects nothing)."""
    return all_ranks or rank in ranks
