"""The Prometheus collector: the recorder's per-thread cells turned into metric families at scrape time.

Nothing is pushed to ``prometheus_client`` while training runs; each scrape reads the cells
(:func:`torchstep_prof.region_metrics.recorder.snapshot`) and the summary records (traces written,
hook runs). Imported only when metrics are on: it imports ``prometheus_client``.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections import Counter
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

from .recorder import BOUNDS, STEP_KEY, WATCHED, idle_snapshot, snapshot
from ..topology import current_topology

__all__ = ["PREFIX", "RegionCollector"]

PREFIX = "torchstep_prof"
_PLACE = ("rank", "world_size", "node")


class RegionCollector:
    """Yields ``torchstep_prof_region_seconds`` (role, stage, rank, world_size, node),
    ``torchstep_prof_step_seconds``, ``torchstep_prof_idle_seconds`` (spans on too),
    ``torchstep_prof_traces_written_total``,
    ``torchstep_prof_hook_runs_total`` (by outcome), ``torchstep_prof_last_step_timestamp_seconds``
    and, with ``auto_trace``, ``torchstep_prof_auto_trace_decisions_total`` (by outcome) and
    ``torchstep_prof_auto_trace_info`` (the newest automatic trace's file and why)."""

    def collect(self) -> Iterator[Any]:
        # Read at each scrape: the rank is torch.distributed's once its process group exists.
        topology = current_topology()
        place = [str(topology.rank), str(topology.world_size), socket.gethostname()]
        regions = HistogramMetricFamily(
            f"{PREFIX}_region_seconds",
            "Wall time of torchstep_prof regions (role/stage), profiled or not",
            labels=["role", "stage", *_PLACE],
        )
        steps = HistogramMetricFamily(
            f"{PREFIX}_step_seconds", "Wall time of torchstep_prof step blocks", labels=list(_PLACE)
        )
        # Keys are text (the recorder's series), at most MAX_PAIRS of them plus other and steps.
        for (role, stage), stats in sorted(snapshot().items(), key=lambda kv: (kv[0][0] or "", kv[0][1] or "")):
            buckets = _cumulative(stats.counts)
            if role is STEP_KEY:
                steps.add_metric(place, buckets, sum_value=stats.sum_s)
            else:
                regions.add_metric([str(role), str(stage), *place], buckets, sum_value=stats.sum_s)
        yield regions
        yield steps
        if WATCHED.last_step_at is not None:  # (the snapshot above folded: it is current)
            last = GaugeMetricFamily(
                f"{PREFIX}_last_step_timestamp_seconds",
                "Unix time a step block of this process was last seen ending (to the second)",
                labels=list(_PLACE),
            )
            last.add_metric(place, WATCHED.last_step_at)
            yield last
        idle = HistogramMetricFamily(  # with spans on too (docs/timeline.md): each step's gaps
            f"{PREFIX}_idle_seconds",
            "Idle time of a step's thread before each region (role/stage; step/end: after the last)",
            labels=["role", "stage", *_PLACE],
        )
        for (role, stage), stats in sorted(idle_snapshot().items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            idle.add_metric([str(role), str(stage), *place], _cumulative(stats.counts), sum_value=stats.sum_s)
        yield idle
        yield from self._records(place)
        yield from _auto_trace(place)

    def _records(self, place: list[str]) -> Iterator[Any]:
        from ..summary.records import STORE

        data = STORE.snapshot()  # never waits for a write: a scrape must not block
        traces = CounterMetricFamily(f"{PREFIX}_traces_written", "Trace files this process wrote", labels=list(_PLACE))
        traces.add_metric(place, sum(1 for t in data.traces if t.ok))
        hooks = CounterMetricFamily(
            f"{PREFIX}_hook_runs", "Finish hook runs of this process, by outcome", labels=["outcome", *_PLACE]
        )
        for outcome, count in sorted(Counter(hook.outcome for hook in data.hooks).items()):
            hooks.add_metric([outcome, *place], count)
        yield traces
        yield hooks


def _cumulative(counts: tuple[int, ...]) -> list[tuple[str, float]]:
    """Prometheus' ``le`` buckets: cumulative counts, the last one ``+Inf``."""
    upper = [repr(float(bound)) for bound in BOUNDS] + ["+Inf"]
    return list(zip(upper, itertools.accumulate(counts)))


def _auto_trace(place: list[str]) -> Iterator[Any]:
    """The slow-step watch's decisions, and its newest trace (docs/auto-trace.md)."""
    from ..slow_steps.decisions import DECISIONS, newest_auto_trace

    counts = DECISIONS.counts
    if not counts:
        return
    made = CounterMetricFamily(
        f"{PREFIX}_auto_trace_decisions",
        "auto_trace decisions: traced, skipped (budget, cooldown, busy), peer, peer-missed (asked too late)",
        labels=["outcome", *_PLACE],
    )
    for outcome, count in sorted(counts.items()):
        made.add_metric([outcome, *place], count)
    yield made
    newest = newest_auto_trace()
    if newest is None:
        return
    path, why = newest
    info = InfoMetricFamily(
        f"{PREFIX}_auto_trace", "The newest trace auto_trace took on this process, and why", labels=list(_PLACE)
    )
    info.add_metric(
        place,
        {
            "file": os.path.basename(path),
            "step": str(why.get("step", "")),
            "metric": str(why.get("metric", "")),
            "ratio": str(why.get("ratio", "")),
            "slow_rank": str(why.get("rank", "")),
        },
    )
    yield info
