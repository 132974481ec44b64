"""GPU time of a region: how long at least one CUDA kernel ran inside the region's time span.

A trace recorded with ``contents("cuda")`` holds the GPU's kernels (``cat: "kernel"``, on the
trace's clock, which Kineto aligns with the CPU's). A region's GPU time is the union of those
kernels' intervals clipped to its span (its ``ProfilerStep#<n>`` range): kernels on several
streams at once count once, so it never exceeds the wall time, and a kernel still running when
the region's CPU side ended counts up to that end only. Copies and memsets are not kernels and
are left out. A trace without kernels has no GPU time (None), which tables show as blank.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from .events import time_us, region_time

__all__ = ["gpu_busy_ms", "trace_gpu_ms"]


def gpu_busy_ms(events: Iterable[Any], start_us: float, end_us: float) -> Optional[float]:
    """Milliseconds in ``[start_us, end_us]`` during which at least one kernel ran; None when
    ``events`` hold no kernel at all.

    >>> kernels = [{"ph": "X", "cat": "kernel", "ts": t, "dur": d} for t, d in ((0, 10), (5, 10), (30, 5))]
    >>> gpu_busy_ms(kernels, 0, 100), gpu_busy_ms(kernels, 12, 32), gpu_busy_ms([], 0, 1)
    (0.02, 0.005, None)
    """
    intervals = []
    found = False
    for event in events:
        if not isinstance(event, dict) or event.get("cat") != "kernel" or event.get("ph") != "X":
            continue
        # A kernel of negative start is left out, like one of no time.
        ts, dur = time_us(event.get("ts"), duration=True), time_us(event.get("dur"), duration=True)
        if ts is None or dur is None:
            continue
        found = True
        begin, end = max(ts, start_us), min(ts + dur, end_us)
        if end > begin:
            intervals.append((begin, end))
    if not found:
        return None
    busy = 0.0
    reach = -math.inf
    for begin, end in sorted(intervals):
        if end <= reach:
            continue
        busy += end - max(begin, reach)
        reach = end
    return busy / 1000.0


def trace_gpu_ms(trace: dict[str, Any], step: int) -> Optional[float]:
    """The GPU time of the region a loaded trace records (``step``: its step, whose
    ``ProfilerStep#<step>`` range is the span); None without kernels."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return None
    wall_ms, start_us = region_time(events, step)
    if start_us is None:
        return None
    return gpu_busy_ms(events, start_us, start_us + wall_ms * 1000.0)
