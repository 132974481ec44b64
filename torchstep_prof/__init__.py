"""torchstep_prof: torch.profiler traces of chosen steps, ranks and regions of distributed training.

>>> import torchstep_prof as tsp
>>> with tsp.schedule(steps=[1, 3]), tsp.ranks(0):        # doctest: +SKIP
...     for n in range(1, 5):
...         with tsp.step(n):
...             with tsp.profile_region("actor", "compute_log_prob"):
...                 ...
"""

from __future__ import annotations

import os as _os

# Kineto prints USDT lines on stderr for every profiler window unless this is set before the
# first profiler use in the process (setting it later has no effect). Users can still override.
_os.environ.setdefault("KINETO_LOG_LEVEL", "6")

from .config import CONTENT_NAMES, FinishHookConfig, ProfilerConfig, ScheduleConfig  # noqa: E402
from .errors import ConfigError, TorchstepProfError  # noqa: E402
from .naming import TraceName, build_trace_name, parse_trace_name  # noqa: E402
from .records import HookRecord, ProfilingCosts, ProfilingRecords, TraceRecord, records  # noqa: E402
from .regions import profile_region, profiled, step  # noqa: E402
from .scopes import configure, contents, effective_config, on_finish, ranks, schedule  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CONTENT_NAMES",
    "ConfigError",
    "FinishHookConfig",
    "HookRecord",
    "ProfilerConfig",
    "ProfilingCosts",
    "ProfilingRecords",
    "ScheduleConfig",
    "TorchstepProfError",
    "TraceName",
    "TraceRecord",
    "build_trace_name",
    "configure",
    "contents",
    "effective_config",
    "on_finish",
    "parse_trace_name",
    "profile_region",
    "profiled",
    "ranks",
    "records",
    "schedule",
    "step",
]
