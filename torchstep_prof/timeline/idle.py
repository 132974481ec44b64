"""Idle time per step, live: how long each step's thread sat between its regions, by the region that followed.

With spans and metrics both on, the span log's thread hands every batch here. For each step
block it finds the block's thread's top-level regions inside it, and the gaps between them; the
gap before a region counts as idle before that region's (role, stage), the gap after the last
one as idle before the step's end (:data:`STEP_END`). Each step observes, once per phase, the
seconds idle before it into ``torchstep_prof_idle_seconds`` (``region_metrics/recorder.py``),
so a dashboard shows the bubble (say, the trainer idle before ``actor/update`` while rollout
runs) without any trace. Regions of other threads are not this thread's work: not counted.
"""

from __future__ import annotations

from typing import Any

from ..region_metrics import recorder as _recorder

__all__ = ["STEP_END", "IdleTracker"]

STEP_END = ("step", "end")
"""The (role, stage) the idle time after a step's last region is counted under."""
_MAX_PENDING = 20_000  # a thread's regions waiting for their step's end (one step's worth, usually)


class IdleTracker:
    """Each thread's regions, kept until the step block around them ends (the span log's thread only)."""

    def __init__(self) -> None:
        self.pending: dict[Any, list[tuple[float, float, Any, Any]]] = {}

    def add(self, thread: Any, flat: list[Any]) -> None:
        """One thread's batch (role, stage, start, end, ...): steps are measured as they end."""
        pending = self.pending.setdefault(thread, [])
        for i in range(0, len(flat), 4):
            role, stage, start, end = flat[i : i + 4]
            if role is None:
                self._step(pending, start, end)
                pending[:] = [s for s in pending if s[1] > end]
            elif role is not _recorder.ANCHOR:
                pending.append((start, end, role, stage))
        if len(pending) > _MAX_PENDING:  # regions outside any step block: never measured
            del pending[: len(pending) - _MAX_PENDING]
        if not pending and not getattr(thread, "is_alive", lambda: True)():
            del self.pending[thread]

    @staticmethod
    def _step(pending: list[tuple[float, float, Any, Any]], start: float, end: float) -> None:
        idle: dict[tuple[Any, Any], float] = {}
        cursor = start
        inside = sorted((s for s in pending if s[0] >= start and s[1] <= end), key=lambda s: (s[0], s[1]))
        for s0, s1, role, stage in inside:
            if s1 <= cursor:
                continue  # nested in (or overlapped by) a region already counted
            key = (role, stage)
            try:
                hash(key)
            except TypeError:  # an unhashable label: counted under its text
                key = (str(role), str(stage))
            idle[key] = idle.get(key, 0.0) + max(s0 - cursor, 0.0)
            cursor = s1
        idle[STEP_END] = max(end - cursor, 0.0)
        for (role, stage), seconds in idle.items():
            _recorder.record_idle(role, stage, seconds)
