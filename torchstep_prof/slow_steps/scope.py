"""``tsp.auto_trace(...)``: the scope that turns slow-step tracing on (docs/auto-trace.md)."""

from __future__ import annotations

import contextlib

from ..config.model import AutoTraceConfig, ProfilerConfig
from ..errors import ConfigError

__all__ = ["auto_trace"]


def auto_trace(
    on: str = "step",
    *,
    factor: float = 2.0,
    min_ms: float = 10.0,
    baseline_steps: int = 50,
    next: int = 2,
    peers: int = 1,
    cooldown_steps: int = 200,
    max_traces_per_hour: int = 6,
    max_bytes: int = 1 << 30,
) -> contextlib.AbstractContextManager[ProfilerConfig]:
    """Trace slow steps by themselves while this scope lasts: a step (or the region
    ``"<role>/<stage>"``) over ``factor`` x its rolling median, and ``min_ms`` over it, makes this
    rank trace its next ``next`` steps and ask ``peers`` ranks that did not slow to trace them
    too. Inside ``tsp.metrics`` and ``tsp.on_demand`` scopes (it reads their timings and folder).

    >>> import torchstep_prof as tsp
    >>> with tsp.metrics(), tsp.on_demand("/shared/job7/on_demand"), tsp.auto_trace(factor=3):  # doctest: +SKIP
    ...     train()
    """
    from ..scopes import configure

    try:
        config = AutoTraceConfig(
            on=on,
            factor=factor,
            min_ms=min_ms,
            baseline_steps=baseline_steps,
            next=next,
            peers=peers,
            cooldown_steps=cooldown_steps,
            max_traces_per_hour=max_traces_per_hour,
            max_bytes=max_bytes,
        )
    except ConfigError as exc:  # auto_trace.factor, as the config file names it
        raise exc.under("auto_trace") from None
    return configure(auto_trace=config)
