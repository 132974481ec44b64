"""The one metrics HTTP endpoint of a process: started the first time a config turns metrics on.

The port is the configured base port plus the local rank (``LOCAL_RANK`` under torchrun), so
the processes of one node never ask for the same port. Anything that goes wrong here (the
``[metrics]`` extra missing, a port in use) is one warning; training goes on, still timed. What
a network peer can do to the server is bounded in ``server.py``.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from ..config.model import MetricsConfig, ProfilerConfig
from ..errors import MetricsWarning, warn, warn_once

__all__ = ["endpoint", "forget", "serve", "when_started"]

_LOCK = threading.Lock()
_ON_START: list[Callable[[ProfilerConfig], None]] = []
_started: Optional[MetricsConfig] = None  # the config the endpoint was started for
_address: Optional[tuple[str, int]] = None
_server: Any = None


def endpoint() -> Optional[tuple[str, int]]:
    """The (address, port) this process serves ``/metrics`` on, or None (not started, or failed).

    >>> import torchstep_prof.region_metrics as m
    >>> m.endpoint() is None or isinstance(m.endpoint()[1], int)
    True
    """
    return _address


def forget() -> None:
    """Stop serving and forget every time recorded: the next config with metrics on starts
    afresh (tests; a process never needs it)."""
    global _started, _address, _server
    with _LOCK:
        server, _server, _started, _address = _server, None, None, None
        _warned.clear()
        from .recorder import forget as forget_times

        forget_times()
    if server is not None:
        server.shutdown()
        server.server_close()


def when_started(callback: Callable[[ProfilerConfig], None]) -> None:
    """Call ``callback(config)`` when metrics start in this process (once)."""
    _ON_START.append(callback)


def serve(config: ProfilerConfig) -> None:
    """Metrics are on under ``config``: set the buckets and start the endpoint, once per process."""
    global _started, _address, _server
    metrics = config.metrics
    if metrics is None or not metrics.enable:
        return
    if _started is not None:  # already decided; the usual path (each scope entry)
        if (metrics.port, metrics.addr, metrics.buckets) != (_started.port, _started.addr, _started.buckets):
            warn_once(
                _warned,
                "differs",
                f"torchstep_prof: metrics are already served as configured first "
                f"(port {_started.port}, addr {_started.addr}, its buckets); "
                f"this process has one endpoint: ignoring {metrics!r}",
                MetricsWarning,
            )
        return
    with _LOCK:
        if _started is not None:
            return
        from .recorder import set_bounds

        set_bounds(metrics.buckets)
        for callback in _ON_START:  # the engine's at-exit work: the summary's metrics lines
            callback(config)
        _started = metrics
        _address, _server = _start_server(metrics)


def _start_server(metrics: MetricsConfig) -> tuple[Optional[tuple[str, int]], Any]:
    from ..topology import current_topology

    port = metrics.port + current_topology().local_rank if metrics.port else 0
    if port > 65535:
        warn(
            f"torchstep_prof: metrics port {metrics.port} + local rank is {port}, above 65535: "
            "no metrics endpoint (choose a lower metrics.port)",
            MetricsWarning,
        )
        return None, None
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        warn(
            "torchstep_prof: metrics are on but prometheus_client is not installed "
            "(pip install 'torchstep_prof[metrics]'): regions are timed, nothing is served",
            MetricsWarning,
        )
        return None, None
    from .collector import RegionCollector
    from .server import start_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector())
    try:
        server = start_server(metrics.addr, port, registry)
    except Exception as exc:  # OSError: port in use, address not here; never into training
        warn(
            f"torchstep_prof: cannot serve metrics on {metrics.addr}:{port} ({exc}); training goes on "
            "without a metrics endpoint (set metrics.port to a free port; each process uses port + LOCAL_RANK)",
            MetricsWarning,
        )
        return None, None
    return (metrics.addr, server.server_address[1]), server


_warned: set[str] = set()
