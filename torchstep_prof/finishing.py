"""When profiling under an ``on_finish`` scope is finished: pick the ranks, wait for node-mates,
run the hook. The engine calls :func:`run_finish` exactly once per scope."""

from __future__ import annotations

import os
import time

from .record_store import STORE
from .scopes import HookScope
from .selection import rank_selected
from .topology import Topology, current_topology

__all__ = ["run_finish", "runs_hook"]


def runs_hook(scope: HookScope, topology: Topology) -> bool:
    """Whether this rank runs the scope's hook: the hook's own ranks if given, else the
    profiled ranks; with ``per_node``, local rank 0 of each node."""
    config = scope.config
    hook = config.finish_hook
    if hook is None or not config.enable:
        return False
    if hook.per_node:
        return topology.local_rank == 0
    if hook.all_ranks or hook.ranks is not None:
        return rank_selected(hook.ranks or (), hook.all_ranks, topology.rank)
    return rank_selected(config.ranks, config.all_ranks, topology.rank)


def run_finish(scope: HookScope) -> None:
    """Mark this rank finished (per-node hooks) and run the hook where this rank is selected."""
    config = scope.config
    hook = config.finish_hook
    if hook is None or not config.enable:
        return
    from . import _node_sync
    from .finish_hook import HookContext, run_hook

    topology = current_topology()
    if hook.per_node:
        _node_sync.mark_finished(scope.scope_id, topology.local_rank)
    if not runs_hook(scope, topology):
        return
    wait_s, missing = 0.0, ()
    if hook.per_node:
        t0 = time.perf_counter()
        missing = _node_sync.wait_for_node(scope.scope_id, topology.local_world_size, hook.node_wait_s)
        wait_s = time.perf_counter() - t0
        STORE.add_costs(hook_wait_s=wait_s)
    with scope.lock:
        traces, roles = tuple(scope.traces), tuple(scope.roles)
    context = HookContext(
        save_path=os.path.abspath(config.save_path),
        rank=topology.rank,
        world_size=topology.world_size,
        local_rank=topology.local_rank,
        pid=os.getpid(),
        roles=roles,
        traces=traces,
    )
    try:
        run_hook(hook, context, wait_s=wait_s, missing_ranks=missing)
    finally:
        if hook.per_node:
            _node_sync.cleanup(scope.scope_id)
