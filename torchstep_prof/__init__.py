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

# The TYPE_CHECKING imports at the end re-export (__all__ is built from _EXPORTS, which ruff cannot see).
# ruff: noqa: F401
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS = {
    "AutoTraceConfig": "config.model",
    "CONTENT_NAMES": "config.model",
    "ConfigError": "errors",
    "FinishHookConfig": "config.model",
    "FinishHookWarning": "errors",
    "ForeignProfilerWarning": "errors",
    "HookRecord": "summary.records",
    "LabelWarning": "errors",
    "MetricsConfig": "config.model",
    "MetricsWarning": "errors",
    "OnDemandConfig": "config.model",
    "ProfilerConfig": "config.model",
    "ProfilerStartWarning": "errors",
    "ProfilingCosts": "summary.records",
    "ProfilingRecords": "summary.records",
    "ScheduleConfig": "config.model",
    "StallConfig": "config.model",
    "SpansConfig": "config.model",
    "TorchstepProfError": "errors",
    "TorchstepProfWarning": "errors",
    "TraceName": "naming",
    "TraceRecord": "summary.records",
    "TraceWriteWarning": "errors",
    "apply_overrides": "config.overrides",
    "auto_trace": "scopes",
    "begin_step": "regions",
    "build_trace_name": "naming",
    "clock_anchor": "timeline.span_log",
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
    "parse_trace_name": "naming",
    "print_summary": "summary.exit_table",
    "profile_region": "regions",
    "profiled": "regions",
    "ranks": "scopes",
    "records": "summary.records",
    "schedule": "scopes",
    "stall": "scopes",
    "spans": "scopes",
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
    """Load every public name now, then drop ``__getattr__`` (why: docs/hot-path.md, "The
    package drops its __getattr__"). Called where regions may profile from then on (a scope
    with a schedule entered, or the environment's schedule at import); the commands that read
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


# The package's import-time work (Kineto's log level, profiling the environment switches on) is
# startup.py's; it runs here, once every name above is defined (it may load them all).
from .startup import at_import as _at_import  # noqa: E402

_at_import()
del _at_import

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly (re-exported: __all__)
    from .config.model import (
        CONTENT_NAMES,
        AutoTraceConfig,
        FinishHookConfig,
        MetricsConfig,
        OnDemandConfig,
        ProfilerConfig,
        ScheduleConfig,
        StallConfig,
        SpansConfig,
    )
    from .background import flush
    from .config.files import dump_config, load_config
    from .config.converter import from_dict, to_dict
    from .errors import (
        ConfigError,
        FinishHookWarning,
        ForeignProfilerWarning,
        LabelWarning,
        MetricsWarning,
        ProfilerStartWarning,
        TorchstepProfError,
        TorchstepProfWarning,
        TraceWriteWarning,
    )
    from .naming import TraceName, build_trace_name, parse_trace_name
    from .config.overrides import apply_overrides
    from .summary.records import HookRecord, ProfilingCosts, ProfilingRecords, TraceRecord, records
    from .regions import begin_step, end_step, profile_region, profiled, step
    from .scopes import (
        auto_trace,
        configure,
        contents,
        effective_config,
        metrics,
        on_demand,
        on_finish,
        ranks,
        schedule,
        spans,
        stall,
    )
    from .summary.exit_table import print_summary
    from .timeline.span_log import clock_anchor
