"""The ``[memory]`` events of one trace: peak and net growth per device, and the allocating ops.

With ``tsp.contents("memory")`` torch writes one instant event named ``[memory]`` per allocation
and free (``args``: ``Bytes``, negative for a free; ``Device Type``, 0 for CPU and 1 for CUDA;
``Device Id``), on the thread that allocated. Reading a trace sums them in time order: the net
growth is what the region left allocated, the peak the most it held above its start. Each
allocation is charged to the innermost operator around it on its thread.
"""

from __future__ import annotations

from typing import Any, Iterable, Tuple

import attrs

from .events import MAX_TIME_US, is_operator

__all__ = ["MEMORY_EVENT", "MEMORY_TOP_OPS", "MemoryUse", "OpBytes", "read_memory", "top_allocators"]

MEMORY_EVENT = "[memory]"

MEMORY_TOP_OPS = 5
"""Allocating operators kept per trace and device, most bytes first."""

OUTSIDE = "(outside operators)"
"""Where an allocation made outside any operator is charged (a tensor made by Python code)."""


@attrs.frozen(kw_only=True)
class OpBytes:
    """An operator's allocations in one trace: bytes allocated (frees not counted) and calls."""

    name: str
    bytes: int
    count: int = 0


@attrs.frozen(kw_only=True)
class MemoryUse:
    """One device's memory over a trace: the peak above the start and the net growth, in bytes."""

    device: str
    peak_bytes: int
    net_bytes: int
    top_ops: Tuple[OpBytes, ...] = ()


def read_memory(events: Iterable[Any]) -> Tuple[MemoryUse, ...]:
    """Each device's :class:`MemoryUse` in ``events`` (none when the trace has no memory events).

    >>> read_memory([{"ph": "i", "name": "[memory]", "ts": 1.0, "pid": 1, "tid": 1,
    ...               "args": {"Bytes": 64, "Device Type": 0, "Device Id": -1}}])[0].net_bytes
    64
    """
    threads: dict[Any, list[tuple[float, int, Any, Any]]] = {}
    memory = False
    for event in events:
        if not isinstance(event, dict):
            continue
        name, raw_ts = event.get("name"), event.get("ts")
        if not isinstance(raw_ts, (int, float)) or not -MAX_TIME_US <= raw_ts <= MAX_TIME_US:
            continue
        ts = float(raw_ts)
        track = repr((event.get("pid"), event.get("tid")))
        if name == MEMORY_EVENT:
            args = event.get("args")
            if not isinstance(args, dict):
                continue
            size = args.get("Bytes")
            if type(size) is int:
                kind, index = args.get("Device Type"), args.get("Device Id")
                device = "cpu" if kind == 0 else f"cuda:{index}" if kind == 1 else f"device{kind}:{index}"
                threads.setdefault(track, []).append((ts, 1, size, device))
                memory = True
        elif event.get("ph") == "X" and type(name) is str and is_operator(name, event.get("cat", "")):
            dur = event.get("dur")
            if isinstance(dur, (int, float)) and 0 <= dur <= MAX_TIME_US:
                threads.setdefault(track, []).append((ts, 0, ts + float(dur), name))
    if not memory:
        return ()
    changes: list[tuple[float, str, int]] = []
    charged: dict[str, dict[str, list[int]]] = {}
    for rows in threads.values():
        # Operators before an allocation at the same time, the longer (outer) first.
        rows.sort(key=lambda row: (row[0], row[1], -row[2] if row[1] == 0 else 0))
        stack: list[tuple[float, str]] = []
        for ts, kind, value, what in rows:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if kind == 0:
                stack.append((value, what))
                continue
            changes.append((ts, what, value))
            if value > 0:
                op = stack[0][1] if stack else OUTSIDE
                totals = charged.setdefault(what, {}).setdefault(op, [0, 0])
                totals[0] += value
                totals[1] += 1
    changes.sort(key=lambda change: change[0])
    level: dict[str, int] = {}
    peak: dict[str, int] = {}
    for _, device, size in changes:
        level[device] = level.get(device, 0) + size
        peak[device] = max(peak.get(device, 0), level[device])
    return tuple(
        MemoryUse(
            device=device,
            peak_bytes=peak[device],
            net_bytes=level[device],
            top_ops=top_allocators(charged.get(device, {})),
        )
        for device in sorted(level)
    )


def top_allocators(totals: dict[str, list[int]], per: int = 1) -> Tuple[OpBytes, ...]:
    """The :data:`MEMORY_TOP_OPS` operators of ``totals`` (name: [bytes, calls]) that allocated
    most, bytes first then name; their bytes and calls divided by ``per``."""
    ranked = sorted(totals.items(), key=lambda item: (-item[1][0], item[0]))[:MEMORY_TOP_OPS]
    return tuple(OpBytes(name=name, bytes=b // per, count=round(n / per)) for name, (b, n) in ranked)
