"""Selected steps that never ran, per schedule scope: the exit summary's "never ran" line.

A schedule scope is the frame that introduced a schedule: a scope whose effective schedule
differs (by value) from its parent's, or the root frame with a schedule from the environment.
Scopes inside it with the same schedule share its record, so an unrelated ``contents()`` scope
neither reports steps early nor hides another phase's missed steps. The steps seen are kept as
ranges: memory grows with the gaps between them, never with the schedule's size.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from typing import Optional, Tuple

import attrs

from ..config.model import ScheduleConfig
from ..summary.records import MAX_MISSED_RANGES
from .rules import NO_END, count_selected, last_selected_step, selected_ranges

__all__ = ["MissedSteps", "ScheduleScope"]


@attrs.frozen
class MissedSteps:
    """Selected steps that never ran: up to ``MAX_MISSED_RANGES`` ``(first, last)`` ranges, and
    how many more steps there were beyond them (``unlisted``)."""

    ranges: Tuple[Tuple[int, int], ...] = ()
    unlisted: int = 0

    def __bool__(self) -> bool:
        return bool(self.ranges or self.unlisted)


class ScheduleScope:
    """The steps run under one schedule scope, and which of its selected steps never ran."""

    __slots__ = ("schedule", "_seen", "_lock")

    def __init__(self, schedule: ScheduleConfig) -> None:
        self.schedule = schedule
        self._seen: list[list[int]] = []  # sorted, disjoint, non-adjacent [first, last] ranges
        self._lock = threading.Lock()

    @staticmethod
    def for_frame(schedule: Optional[ScheduleConfig], parent: Optional[ScheduleScope]) -> Optional[ScheduleScope]:
        """The schedule scope of a new frame: its parent's when the schedule is the same (an
        equal copy included: the environment's layer rebuilds it in every scope), else a new one."""
        if schedule is None:
            return None
        if parent is not None and (parent.schedule is schedule or parent.schedule == schedule):
            return parent
        return ScheduleScope(schedule)

    def saw(self, step: int) -> None:
        """``step`` ran (selected, on this rank) under this scope."""
        with self._lock:
            seen = self._seen
            if seen and seen[-1][0] <= step <= seen[-1][1] + 1:  # the usual case: the same or next step
                seen[-1][1] = max(seen[-1][1], step)
                return
            i = bisect.bisect(seen, [step, NO_END])  # the ranges before i start at or before step
            seen.insert(i, [step, step])
            for j in (i, i - 1):  # join the new range to the next one, then the previous one to it
                if 0 <= j < len(seen) - 1 and seen[j + 1][0] <= seen[j][1] + 1:
                    seen[j][1] = max(seen[j][1], seen.pop(j + 1)[1])

    def missed(self) -> MissedSteps:
        """The steps a finite schedule selected that this scope never saw (nothing for a
        schedule that cycles until the scope ends)."""
        last = last_selected_step(self.schedule)
        if last is None:
            return MissedSteps()
        with self._lock:  # the gaps between the steps seen, from step 0 to the last selected
            gaps = zip([0] + [b + 1 for _, b in self._seen], [a - 1 for a, _ in self._seen] + [last])
        listed: list[tuple[int, int]] = []
        total = 0
        for first, end in gaps:
            end = min(end, last)
            total += count_selected(self.schedule, first, end)
            listed += itertools.islice(selected_ranges(self.schedule, first, end), MAX_MISSED_RANGES - len(listed))
        return MissedSteps(tuple(listed), total - sum(b - a + 1 for a, b in listed))
