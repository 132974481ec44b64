"""The slow-step rule: when a step (or a region) breaks from its own baseline, and whether to trace it.

Pure and torch-free: the watch thread (watch.py) feeds it ``(step, seconds)`` samples off the
training thread. The baseline is the median of the last ``baseline_steps`` samples; the one in
force is the lowest such median kept over the last :data:`BASELINE_WINDOWS` windows of
``baseline_steps`` samples, so a ramp cannot raise its own baseline before it is caught (it
rises only once a new level has lasted that long), while a faster job lowers it at once. A
sample is slow when it is over ``factor`` x the baseline *and* over it by ``min_ms``; slow
samples never enter the baseline. After a decision (traced or not) the baseline is learned
afresh, so a rank that stays slow makes one decision, not one per step. docs/auto-trace.md.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Optional

import attrs

__all__ = ["BASELINE_WINDOWS", "Budget", "Detector", "Slowdown"]

BASELINE_WINDOWS = 8
"""How many windows of ``baseline_steps`` samples a baseline's lowest median is kept over."""


@attrs.frozen(kw_only=True)
class Slowdown:
    """One sample over its baseline: what a capture's metadata and the exit line say."""

    metric: str  # "step" or "<role>/<stage>"
    step: int
    value_ms: float
    baseline_ms: float
    factor: float  # the configured factor, as the trace's metadata names it

    @property
    def ratio(self) -> float:
        return self.value_ms / self.baseline_ms if self.baseline_ms > 0 else float("inf")

    def why(self) -> dict[str, object]:
        """The trace's metadata: why it was taken."""
        return {
            "metric": self.metric,
            "step": self.step,
            "value_ms": round(self.value_ms, 3),
            "baseline_ms": round(self.baseline_ms, 3),
            "factor": self.factor,
            "ratio": round(self.ratio, 3),
        }


class Detector:
    """The rule for one rank's stream of samples.

    >>> d = Detector(metric="step", factor=2.0, min_ms=5.0, baseline_steps=4)
    >>> [d.observe(n, 0.040) for n in range(4)]
    [None, None, None, None]
    >>> d.observe(4, 0.120).ratio
    3.0
    """

    def __init__(self, *, metric: str, factor: float, min_ms: float, baseline_steps: int) -> None:
        self.metric = metric
        self.factor = factor
        self.min_s = min_ms / 1000.0
        self.size = baseline_steps
        self.relearn()

    def relearn(self) -> None:
        """Forget the baseline: it is learned again from the next ``baseline_steps`` samples."""
        self._window: deque[float] = deque()
        self._sorted: list[float] = []
        self._since_mark = self.size - 1  # the first full window's median is kept at once
        self._medians: deque[float] = deque(maxlen=BASELINE_WINDOWS)

    def baseline(self) -> Optional[float]:
        """The baseline in seconds, once ``baseline_steps`` samples are in; else None."""
        if len(self._window) < self.size:
            return None
        current = self._median()
        return min(current, *self._medians) if self._medians else current

    def _median(self) -> float:
        s, n = self._sorted, len(self._sorted)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2

    def observe(self, step: int, seconds: float) -> Optional[Slowdown]:
        """Take one sample; a :class:`Slowdown` when it breaks from the baseline (not added to it)."""
        base = self.baseline()
        if base is not None and seconds > self.factor * base and seconds - base > self.min_s:
            return Slowdown(
                metric=self.metric, step=step, value_ms=seconds * 1000, baseline_ms=base * 1000, factor=self.factor
            )
        self._window.append(seconds)
        bisect.insort(self._sorted, seconds)
        if len(self._window) > self.size:
            old = self._window.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        if len(self._window) == self.size:
            self._since_mark += 1
            if self._since_mark >= self.size:  # one median kept per window of samples
                self._since_mark = 0
                self._medians.append(self._median())
        return None


HOUR_S = 3600.0


@attrs.frozen(kw_only=True)
class Budget:
    """What a capture may still cost: the job's captures in the last hour, its automatic traces'
    bytes, and this rank's cooldown since its last capture.

    >>> Budget(max_per_hour=2, max_bytes=100, cooldown_steps=10).refuse(
    ...     step=50, last_capture_step=45, captures_last_hour=0, bytes_written=0)
    'cooldown: 5 of 10 steps since the last capture'
    """

    max_per_hour: int
    max_bytes: int
    cooldown_steps: int

    def refuse(
        self, *, step: int, last_capture_step: Optional[int], captures_last_hour: int, bytes_written: int
    ) -> Optional[str]:
        """Why a capture at ``step`` is refused, or None when it may go ahead."""
        if last_capture_step is not None and step - last_capture_step < self.cooldown_steps:
            return f"cooldown: {step - last_capture_step} of {self.cooldown_steps} steps since the last capture"
        if captures_last_hour >= self.max_per_hour:
            return f"budget: {captures_last_hour} captures in the last hour (max_traces_per_hour {self.max_per_hour})"
        if bytes_written >= self.max_bytes:
            return f"budget: {bytes_written} bytes of automatic traces written (max_bytes {self.max_bytes})"
        return None
