"""Which steps and ranks are profiled: pure functions of the config, testable without torch."""

from __future__ import annotations

import enum
import functools
import itertools
from typing import Optional, Sequence

from .config import ScheduleConfig

__all__ = ["StepAction", "last_selected_step", "rank_selected", "selected_steps", "step_action"]


class StepAction(enum.IntEnum):
    """What the profiler does for one step: nothing, warm up (trace and discard), or record."""

    NONE = 0
    WARMUP = 1
    RECORD = 2


@functools.lru_cache(maxsize=64)
def _explicit(steps: tuple[int, ...]) -> frozenset[int]:
    return frozenset(steps)


def step_action(schedule: Optional[ScheduleConfig], step: int) -> StepAction:
    """The action for 1-based ``step`` under ``schedule`` (torch.profiler's cycle semantics).

    >>> s = ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    >>> [n for n in range(1, 13) if step_action(s, n) is StepAction.RECORD]
    [4, 5, 8, 9]
    """
    if schedule is None:
        return StepAction.NONE
    if schedule.steps is not None:
        return StepAction.RECORD if step in _explicit(schedule.steps) else StepAction.NONE
    index = step - 1 - schedule.skip_first
    if index < 0:
        return StepAction.NONE
    cycle = schedule.wait + schedule.warmup + schedule.active
    if schedule.repeat and index >= cycle * schedule.repeat:
        return StepAction.NONE
    position = index % cycle
    if position < schedule.wait:
        return StepAction.NONE
    if position < schedule.wait + schedule.warmup:
        return StepAction.WARMUP
    return StepAction.RECORD


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


def selected_steps(schedule: Optional[ScheduleConfig], upto: int) -> list[int]:
    """The steps in ``1..upto`` that ``schedule`` records, in order.

    >>> selected_steps(ScheduleConfig(wait=1, active=2, repeat=0), 9)
    [2, 3, 5, 6, 8, 9]
    """
    if schedule is None:
        return []
    if schedule.steps is not None:
        return sorted(n for n in schedule.steps if n <= upto)
    cycle = schedule.wait + schedule.warmup + schedule.active
    first_active = schedule.skip_first + schedule.wait + schedule.warmup + 1
    found: list[int] = []
    for cycle_index in itertools.count():
        if schedule.repeat and cycle_index >= schedule.repeat:
            break
        start = first_active + cycle_index * cycle
        if start > upto:
            break
        found.extend(range(start, min(start + schedule.active, upto + 1)))
    return found


def rank_selected(ranks: Sequence[int], all_ranks: bool, rank: int) -> bool:
    """Whether ``rank`` is chosen (``all_ranks`` wins; a rank that does not exist selects nothing)."""
    return all_ranks or rank in ranks
