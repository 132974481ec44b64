"""torchstep_prof: torch.profiler traces of chosen steps, ranks and regions of distributed training.

>>> import torchstep_prof as tsp
>>> with tsp.schedule(steps=[1, 3]), tsp.ranks(0):        # doctest: +SKIP
...     for n in range(1, 5):
...         with tsp.step(n):
...             with tsp.profile_region("actor", "compute_log_prob"):
...                 ...

The public names are loaded on first use (PEP 562), so ``torchstep-prof ls`` and friends never
pay for ``import torch``; training code, which imports torch anyway, sees no difference.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import TYPE_CHECKING, Any

# Kineto prints USDT lines on stderr for every profiler window unless this is set before the
# first profiler use in the process (setting it later has no effect). Users can still override.
_os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "CONTENT_NAMES": "config.model",
    "ConfigError": "errors",
    "FinishHookConfig": "config.model",
    "FinishHookWarning": "errors",
    "ForeignProfilerWarning": "errors",
    "HookRecord": "summary.records",
    "MetricsConfig": "config.model",
    "MetricsWarning": "errors",
    "OnDemandConfig": "config.model",
    "ProfilerConfig": "config.model",
    "ProfilerStartWarning": "errors",
    "ProfilingCosts": "summary.records",
    "ProfilingRecords": "summary.records",
    "ScheduleConfig": "config.model",
    "TorchstepProfError": "errors",
    "TorchstepProfWarning": "errors",
    "TraceName": "traces.names",
    "TraceRecord": "summary.records",
    "TraceWriteWarning": "errors",
    "apply_overrides": "config.overrides",
    "begin_step": "regions",
    "build_trace_name": "traces.names",
    "configure": "scopes",
    "contents": "scopes",
    "dump_config": "config.files",
    "effective_config": "scopes",
    "end_step": "regions",
    "flush": "background",
    "from_dict": "config.converter",
    "load_config": "config.files",
    "metrics": "scopes",
    "on_demand": "scopes",
    "on_finish": "scopes",
    "parse_trace_name": "traces.names",
    "print_summary": "summary.exit_table",
    "profile_region": "regions",
    "profiled": "regions",
    "ranks": "scopes",
    "records": "summary.records",
    "schedule": "scopes",
    "step": "regions",
    "to_dict": "config.converter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchstep_prof' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module_name}"), name)
    globals()[name] = value  # later lookups are plain module attributes: no cost on the hot path
    return value


def _load_every_name() -> None:
    """Load every public name now, then drop ``__getattr__``: Python 3.11 specializes an
    attribute load on a module (``tsp.profile_region``, on every region) only when the module has
    no ``__getattr__``; with one, each load takes the generic path (~0.1 us, a tenth of what a
    not-profiled region may cost). Called where regions may profile from then on (a scope with
    a schedule entered, or the environment's schedule at import); the commands that read
    traces never get there."""
    namespace = globals()
    load = namespace.get("__getattr__")  # taken once: another thread may drop it meanwhile
    if load is None:  # done already
        return
    for name in _EXPORTS:
        if name not in namespace:
            load(name)
    namespace.pop("__getattr__", None)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _warm_up_for_the_environment() -> None:
    # With profiling switched on by TORCHSTEP_PROF_CONFIG / _OVERRIDES there may be no scope
    # entered before step 1: do at import what entering a scope would (read the environment
    # into the root frame, register the exit work, load the names, pay torch.profiler's ~1 s
    # first start on a rank that may profile), not inside the first profiled step. Only in a
    # process that already imported torch (a training script; not the command line). A bad
    # environment is reported later, where SPEC.md says: at the first scope or region. When the
    # environment also sets a finish hook, its frame is read there too: that hook belongs to a
    # process that ran a scope or a region, not to every one that imports the package.
    import sys

    from .config.variables import ENV_CONFIG, ENV_OVERRIDES

    if "torch" not in sys.modules or not (_os.environ.get(ENV_CONFIG) or _os.environ.get(ENV_OVERRIDES)):
        return
    from .config.environment import read_environment
    from .config.model import ProfilerConfig
    from .engine import ENGINE
    from .errors import ConfigError
    from .selection.frames import current_frame
    from .selection.rules import rank_selected
    from .topology import current_topology

    try:
        layer = read_environment()
        config = layer.apply(ProfilerConfig())
    except ConfigError:
        return
    if not config.enable or config.schedule is None:
        return
    if not layer.sets_finish_hook:
        ENGINE.prepare(current_frame())  # outside every scope: the root frame
        return
    _load_every_name()
    if rank_selected(config.ranks, config.all_ranks, current_topology().rank):
        ENGINE.warm_up(config.contents)


_warm_up_for_the_environment()

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .config.model import (
        CONTENT_NAMES, FinishHookConfig, MetricsConfig, OnDemandConfig, ProfilerConfig, ScheduleConfig,
    )
    from .background import flush
    from .config.files import dump_config, load_config
    from .config.converter import from_dict, to_dict
    from .errors import (
        ConfigError,
        FinishHookWarning,
        ForeignProfilerWarning,
        MetricsWarning,
        ProfilerStartWarning,
        TorchstepProfError,
        TorchstepProfWarning,
        TraceWriteWarning,
    )
    from .traces.names import TraceName, build_trace_name, parse_trace_name
    from .config.overrides import apply_overrides
    from .summary.records import HookRecord, ProfilingCosts, ProfilingRecords, TraceRecord, records
    from .regions import begin_step, end_step, profile_region, profiled, step
    from .scopes import configure, contents, effective_config, metrics, on_demand, on_finish, ranks, schedule
    from .summary.exit_table import print_summary
