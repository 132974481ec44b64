"""Selected steps that never ran, per schedule scope, kept as ranges.

The steps a scope saw are kept as ranges; at its end, the selected ones it did not see are
reported, as ranges.

A schedule scope is the frame that introduced a schedule: a scope whose effective schedule
differs (by value) from its parent's, or the root frame with a schedule from the environment.
Scopes inside it with the same schedule share its record, so an unrelated ``contents()`` scope
neither reports steps early nor hides another phase's missed steps. Memory grows with the number
of gaps between the steps seen, never with the schedule's size.
"""

from __future__ import annotations

import bisect
import threading
from typing import Iterator, Optional, Tuple

import attrs

from ..config.model import ScheduleConfig
from ..summary.records import MAX_MISSED_RANGES
from .rules import count_selected, last_selected_step, selected_ranges

__all__ = ["MissedSteps", "ScheduleScope", "StepRanges"]


class StepRanges:
    """A set of step numbers as sorted, disjoint ``[first, last]`` ranges (cheap for a loop that
    counts up: adding the next step widens the last range)."""

    __slots__ = ("_firsts", "_lasts")

    def __init__(self) -> None:
        self._firsts: list[int] = []
        self._lasts: list[int] = []

    def add(self, step: int) -> None:
        firsts, lasts = self._firsts, self._lasts
        if lasts and firsts[-1] <= step <= lasts[-1] + 1:  # the usual case: the same or next step
            lasts[-1] = max(lasts[-1], step)
            return
        i = bisect.bisect_right(firsts, step)  # ranges[i-1] starts at or before step
        if i and step <= lasts[i - 1] + 1:
            if step <= lasts[i - 1]:
                return
            lasts[i - 1] = step
            if i < len(firsts) and firsts[i] == step + 1:  # it closed a gap: merge
                lasts[i - 1] = lasts.pop(i)
                firsts.pop(i)
            return
        if i < len(firsts) and firsts[i] == step + 1:
            firsts[i] = step
            return
        firsts.insert(i, step)
        lasts.insert(i, step)

    def __contains__(self, step: int) -> bool:
        i = bisect.bisect_right(self._firsts, step)
        return bool(i) and step <= self._lasts[i - 1]

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._firsts, self._lasts))

    def gaps(self, first: int, last: int) -> Iterator[tuple[int, int]]:
        """The ranges of ``first..last`` holding no step of this set."""
        start = first
        for a, b in zip(self._firsts, self._lasts):
            if b < start:
                continue
            if a > last:
                break
            if a > start:
                yield start, a - 1
            start = b + 1
        if start <= last:
            yield start, last


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
        self._seen = StepRanges()
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
            self._seen.add(step)

    def missed(self) -> MissedSteps:
        """The steps a finite schedule selected that this scope never saw (nothing for a
        schedule that cycles until the scope ends)."""
        last = last_selected_step(self.schedule)
        if last is None:
            return MissedSteps()
        with self._lock:
            gaps = list(self._seen.gaps(0, last))
        listed: list[tuple[int, int]] = []
        unlisted = 0
        for gap_first, gap_last in gaps:
            if len(listed) < MAX_MISSED_RANGES:
                for first, end in selected_ranges(self.schedule, gap_first, gap_last):
                    if len(listed) == MAX_MISSED_RANGES:
                        unlisted += count_selected(self.schedule, first, gap_last)
                        break
                    listed.append((first, end))
            else:
                unlisted += count_selected(self.schedule, gap_first, gap_last)
        return MissedSteps(tuple(listed), unlisted)
