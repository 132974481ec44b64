"""Plain records of what profiling did in this process: traces written, hooks run, time spent.

The engine and the finish hook append here; the summary and ``records()`` read a snapshot.
Records are process-wide (one profiler per process), so the store is guarded by a lock.
"""

from __future__ import annotations

import threading
from typing import Iterable, Optional, Tuple, Union

import attrs

__all__ = ["HookRecord", "ProfilingCosts", "ProfilingRecords", "TraceRecord", "records"]

MAX_MISSED_RANGES = 20  # missed steps listed as ranges; more are counted (the summary is one line)


@attrs.frozen(kw_only=True)
class TraceRecord:
    """One trace this process wrote, or failed to write (then ``path`` is None and ``error`` says why).

    ``role`` and ``stage`` are the labels as they appear in the file name.
    """

    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    discrete: bool
    path: Optional[str]
    occurrence: int = 1  # the k-th outermost entry of (role, stage) in its step (docs/scopes-and-regions.md)
    size_bytes: int = 0
    wall_s: float = 0.0
    start_s: float = 0.0
    stop_s: float = 0.0
    export_s: float = 0.0
    error: Optional[str] = None
    # With contents("cuda"): the time kernels ran inside the region (traces/reading/gpu_time.py).
    gpu_ms: Optional[float] = None
    # With contents("memory_snapshot"): the allocator snapshot written next to the trace.
    memory_snapshot: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None


HOOK_OK = "ok"
HOOK_FAILED = "failed"
HOOK_TIMEOUT = "timeout"
HOOK_NOT_STARTED = "not-started"


@attrs.frozen(kw_only=True)
class HookRecord:
    """One run of a finish hook on this rank.

    ``outcome`` is ``ok``, ``failed`` (non-zero exit), ``timeout`` or ``not-started``;
    ``missing_ranks`` lists the local ranks a per-node uploader did not hear from in time.
    """

    cmd: Union[str, Tuple[str, ...]]
    rank: int
    outcome: str
    exit_code: Optional[int]
    duration_s: float
    wait_s: float = 0.0
    message: Optional[str] = None
    missing_ranks: Tuple[int, ...] = ()
    relocated: Tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.outcome == HOOK_OK


@attrs.frozen(kw_only=True)
class ProfilingCosts:
    """Seconds profiling itself cost this process, outside the user's code."""

    warmup_s: float = 0.0  # torch.profiler's one-time first-start cost, paid outside any step
    start_s: float = 0.0
    stop_s: float = 0.0
    export_s: float = 0.0  # on the background writer thread, off the training thread
    hook_wait_s: float = 0.0  # per-node uploaders waiting for their node-mates
    writer_wait_s: float = 0.0  # the training thread waiting for the writer (back-pressure, scope exit)

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.start_s + self.stop_s + self.export_s + self.hook_wait_s


@attrs.frozen(kw_only=True)
class ProfilingRecords:
    """A snapshot of everything recorded so far in this process."""

    traces: Tuple[TraceRecord, ...] = ()
    hooks: Tuple[HookRecord, ...] = ()
    costs: ProfilingCosts = ProfilingCosts()
    # Steps a finite schedule selected that never ran, as sorted ``(first, last)`` ranges
    # (``((3, 999999),)``: steps 3 to 999999); at most 20 ranges, the steps beyond them counted
    # in ``missed_steps_unlisted`` (a cycle that repeats a million times misses a million ranges).
    missed_steps: Tuple[Tuple[int, int], ...] = ()
    missed_steps_unlisted: int = 0
    # What needs the user's attention, one line each (a region left open across steps, a step
    # entered again after its hook ran, ...): printed under the summary table.
    attention: Tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.traces or self.hooks or self.attention)


class _RecordStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._empty()

    def _empty(self) -> None:
        self._traces: list[TraceRecord] = []
        self._hooks: list[HookRecord] = []
        self._costs: dict[str, float] = {}
        self._missed: list[tuple[int, int]] = []
        self._missed_unlisted = 0
        self._attention: dict[str, str] = {}  # key -> line; one line per key, first wins

    def add_trace(self, record: TraceRecord) -> None:
        with self._lock:
            self._traces.append(record)

    def add_hook(self, record: HookRecord) -> None:
        with self._lock:
            self._hooks.append(record)

    def add_costs(self, **seconds: float) -> None:
        """Add seconds to the ``ProfilingCosts`` fields named (on every trace: kept cheap)."""
        with self._lock:
            costs = self._costs
            for field, value in seconds.items():
                costs[field] = costs.get(field, 0.0) + value

    def add_missed_steps(self, ranges: Iterable[tuple[int, int]], unlisted: int = 0) -> None:
        """Add selected steps that never ran: ``(first, last)`` ranges, and a count of more."""
        with self._lock:
            merged: list[tuple[int, int]] = []
            for first, last in sorted([*self._missed, *ranges]):
                if merged and first <= merged[-1][1] + 1:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], last))
                else:
                    merged.append((first, last))
            for first, last in merged[MAX_MISSED_RANGES:]:
                unlisted += last - first + 1
            self._missed = merged[:MAX_MISSED_RANGES]
            self._missed_unlisted += unlisted

    def add_attention(self, key: str, line: str) -> None:
        """Note something the summary must point out; ``key`` keeps a repeated cause to one line."""
        with self._lock:
            self._attention.setdefault(key, line)

    def snapshot(self) -> ProfilingRecords:
        with self._lock:
            return ProfilingRecords(
                traces=tuple(self._traces),
                hooks=tuple(self._hooks),
                costs=ProfilingCosts(**self._costs),
                missed_steps=tuple(self._missed),
                missed_steps_unlisted=self._missed_unlisted,
                attention=tuple(self._attention.values()),
            )

    def clear(self) -> None:
        with self._lock:
            self._empty()


STORE = _RecordStore()


def records() -> ProfilingRecords:
    """Everything profiling did in this process so far: traces, hook runs, costs. Waits for
    the traces still being written first, so every trace ended so far is in it.

    >>> import torchstep_prof as tsp
    >>> [t.path for t in tsp.records().traces]  # doctest: +SKIP
    ['outputs/profile/actor_update_step1_rank0-of-1_pid7_20260814122731089.json']
    """
    from .. import background

    background.wait_for((background.WRITES,))
    return STORE.snapshot()
