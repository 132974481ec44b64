"""Which absolute steps a request names: past the highest step any rank could reach before it reads it.

The rule (docs/on-demand.md): for each rank, its last written step plus
its step rate times the time until it has surely read the request (the age of its status file,
plus two of its polls: one until the next poll, one to spare), rounded up; the first step is
the first multiple of ``align`` above the highest of those, then ``next`` steps. A rank whose
rate is not known yet is taken to be as fast as the fastest known one. No torch here.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from .status import RankStatus

__all__ = ["choose_steps"]


def choose_steps(
    statuses: Sequence[RankStatus], now: float, next_steps: int, align: int
) -> tuple[tuple[int, ...], dict[str, Any]]:
    """The ``next_steps`` (>= 1) steps every rank can still profile, from their status files,
    and the numbers the rule used (written into the request).

    >>> s = [RankStatus(path="a", rank=0, step=15, time=100.0, rate=20.0, poll_s=0.1),
    ...      RankStatus(path="b", rank=1, step=14, time=100.0, rate=20.0, poll_s=0.1)]
    >>> choose_steps(s, now=100.0, next_steps=2, align=10)
    ((20, 21), {'highest_reachable_step': 19, 'fastest_steps_per_s': 20.0})
    """
    known = [s.rate for s in statuses if s.rate is not None and s.rate > 0]
    fastest = max(known, default=0.0)
    highest = 0
    for status in statuses:
        step = status.step if status.step is not None else 0
        rate = status.rate if status.rate is not None else fastest
        window = max(0.0, now - status.time) + 2 * status.poll_s
        highest = max(highest, step + math.ceil(rate * window))
    first = (highest // align + 1) * align  # strictly past the highest reachable step
    rule = {"highest_reachable_step": highest, "fastest_steps_per_s": round(fastest, 3)}
    return tuple(range(first, first + next_steps)), rule
