"""What the slow-step watch decided in this process: counts per outcome, and its traces.

Read by the metrics' collector at scrape time and by the watch's status (no torch, no threads
of its own): the decisions counter, the newest automatic trace and the bytes of them all.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from . import why as _why

__all__ = ["DECISIONS", "newest_auto_trace", "own_auto_bytes"]


class _Decisions:
    """What every watch of this process decided, for the metrics (a count per outcome) and the
    info series (the newest automatic trace's why)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every decision, as a new process has none."""
        self.counts: Counter[str] = Counter()  # decisions by outcome
        self.lines = 0
        self.steps: set[int] = set()  # steps this rank traced automatically (its own or a peer's)


DECISIONS = _Decisions()


def own_auto_bytes() -> int:
    """The bytes of the automatic traces this process wrote (its status reports them)."""
    from ..summary.records import STORE

    steps = DECISIONS.steps
    if not steps:
        return 0
    return sum(t.size_bytes for t in STORE.snapshot().traces if t.ok and t.step in steps)


def newest_auto_trace() -> Optional[tuple[str, dict[str, Any]]]:
    """The newest automatic trace this process wrote and why it was taken, or None."""
    from ..summary.records import STORE

    steps = DECISIONS.steps
    if not steps:
        return None
    for trace in reversed(STORE.snapshot().traces):
        if trace.ok and trace.path is not None and trace.step in steps:
            return trace.path, _why.why_of(trace.step)
    return None
