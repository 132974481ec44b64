"""The collective events of one trace, in order: what the wait analysis matches across ranks.

On CPU: the ``gloo:*`` annotations of the gloo threads (``pt_gloo_runloop``, where a rank waits
for its peers; torch 2.13 writes ``gloo:all_reduce`` as a ``user_annotation`` there) and the
``c10d::*`` operators of the calling thread (``c10d::allreduce_``, which only enqueues the work).
On GPU: the NCCL kernels and torch's ``record_param_comms`` ranges.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Optional, Tuple

import attrs

from .events import time_us

__all__ = ["WAIT_KINDS", "CollectiveCall", "read_collectives"]

WAIT_KINDS = ("nccl", "gloo", "comms", "c10d")
"""Kinds of collective events, in the order a group's waits are taken from: the first kind every
rank has. NCCL kernels and gloo annotations last as long as the rank waits for its peers;
``record_param_comms`` and ``c10d::*`` operators only enqueue the work (for gloo and NCCL both),
so they measure waits only where nothing better is recorded."""


@attrs.frozen(kw_only=True)
class CollectiveCall:
    """One collective event of a trace: its kind (:data:`WAIT_KINDS`), name and duration."""

    kind: str = attrs.field(converter=sys.intern)
    # Interned: a folder's traces repeat the same few names thousands of times.
    name: str = attrs.field(converter=sys.intern)
    dur_ms: float


def read_collectives(events: Iterable[Any]) -> Tuple[CollectiveCall, ...]:
    """The collective events of a trace's ``events``, in order of start (within each kind).

    >>> read_collectives([{"ph": "X", "name": "gloo:all_reduce", "cat": "user_annotation",
    ...                    "ts": 5.0, "dur": 2000.0}])
    (CollectiveCall(kind='gloo', name='gloo:all_reduce', dur_ms=2.0),)
    """
    found: list[tuple[float, str, str, float]] = []
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        name = event.get("name")
        if type(name) is not str:
            continue
        kind = _kind(name, event.get("cat"))
        if kind is None:
            continue
        ts, dur = time_us(event.get("ts")), time_us(event.get("dur"), duration=True)
        if ts is None or dur is None:
            continue
        if kind == "comms":  # torch names the collective in the range's arguments
            args = event.get("args")
            collective = args.get("Collective name") if isinstance(args, dict) else None
            name = f"record_param_comms:{collective}" if isinstance(collective, str) else name
        found.append((ts, kind, name, dur))
    found.sort(key=lambda row: row[0])
    return tuple(CollectiveCall(kind=k, name=n, dur_ms=d / 1000.0) for _, k, n, d in found)


def _kind(name: str, cat: Any) -> Optional[str]:
    if name.startswith("gloo:") and cat == "user_annotation":
        return "gloo"
    if cat == "kernel" and name.lower().startswith("nccl"):
        return "nccl"
    if name == "record_param_comms":
        return "comms"
    if name.startswith("c10d::") and cat == "cpu_op":
        return "c10d"
    return None
