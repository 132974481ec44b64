"""torch.profiler's one-time start-up in a process, paid once, outside any step.

The first ``start()`` in a process costs 1-4 s, nearly all of it torch importing
``torch._inductor`` (``bench/bench_warm_up.py``), and Kineto initialises its first range, stop
and export lazily (~10 ms): one throw-away window pays all of it.
"""

from __future__ import annotations

import os
import tempfile

import torch

from .foreign import new_own_profile, settle_own_profile
from .session import new_range, profiler_kwargs

__all__ = ["warm_up_profiler"]


def warm_up_profiler(contents: tuple[str, ...]) -> None:
    """Run one throw-away profiler window with ``contents``; a failure is left for the real
    start to report. Call it while no other profiler of ours starts or stops."""
    try:
        with tempfile.TemporaryDirectory(prefix="torchstep_prof-warmup-") as scratch:
            warm = new_own_profile(**profiler_kwargs(contents))
            try:
                warm.start()
            except BaseException:  # a Ctrl-C inside torch's start: none of it may stay on
                settle_own_profile(warm, stopping=False)
                raise
            try:
                with torch.profiler.record_function("ProfilerStep#0"), new_range("torchstep_prof/warm-up"):
                    torch.zeros(2).add_(1)
            finally:
                try:
                    warm.stop()
                except BaseException:  # or its stop: the next start must find Kineto off
                    settle_own_profile(warm, stopping=True)
                    raise
            warm.export_chrome_trace(os.path.join(scratch, "warm-up.json"))
    except Exception:  # the real start will report it
        pass
