"""When profiling under an ``on_finish`` scope is finished: run its hook, on a thread of its own.

It picks the ranks, waits for node-mates and runs the hook, in the background unless the scope
asked to wait. The engine calls :func:`finish` exactly once per scope, after every trace recording around that
point has stopped. The hook thread first waits for the trace writer (every trace of the process
is on disk before the command starts), then, for ``per_node`` hooks, marks this rank finished and
waits for its node-mates, then runs the command. Training goes on meanwhile: a slow upload can
never hold up a collective. At interpreter exit :func:`wait_at_exit` waits for hooks still running,
with a status line, and Ctrl-C there kills their process groups.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional

import attrs

from .. import background
from ..config.model import ProfilerConfig
from ..summary.records import STORE
from ..selection.frames import HookScope
from ..selection.rules import rank_selected
from ..topology import Topology, current_topology

if TYPE_CHECKING:
    from .process import HookInterrupt

__all__ = ["finish", "runs_hook", "wait_at_exit"]

_STATUS_EVERY_S = 10.0  # a plain progress line this often when stderr is not a terminal


@attrs.define
class _HookRun:
    """A hook running in the background, for the exit wait's status line.

    ``done`` rather than ``Thread.is_alive``: a ``join`` interrupted by Ctrl-C can leave the
    thread looking finished while it still runs (CPython's join lock is released mid-way)."""

    label: str
    done: threading.Event = attrs.field(factory=threading.Event)
    started: float = attrs.field(factory=time.monotonic)


_RUNS: list[_HookRun] = []
_RUNS_LOCK = threading.Lock()


def runs_hook(scope: HookScope, topology: Topology, where: Optional[ProfilerConfig] = None) -> bool:
    """Whether this rank runs the scope's hook: the hook's own ranks if given; with ``per_node``,
    local rank 0 of each node; else the ranks profiled where profiling finished (``where``, the
    configuration in force there, whatever the order the scopes were written in), and any rank
    that profiled a step under the scope."""
    config = scope.config
    hook = config.finish_hook
    if hook is None or not config.enable:
        return False
    if scope.served_requests and not scope.traces:
        return False  # each on-demand request ran it with its own traces: none is left to hand over
    if hook.per_node:
        return topology.local_rank == 0
    if hook.all_ranks or hook.ranks is not None:
        return rank_selected(hook.ranks or (), hook.all_ranks, topology.rank)
    if scope.profiled:
        return True
    profiled = where if where is not None else config
    return rank_selected(profiled.ranks, profiled.all_ranks, topology.rank)


def finish(scope: HookScope, where: Optional[ProfilerConfig], flush_traces: Callable[..., object]) -> None:
    """Profiling under ``scope`` is finished: run its hook where this rank is selected, on a
    thread of its own, and return at once; for ``wait=True``, once the command has ended.

    A Ctrl-C while waiting (``wait=True``) stops the hook and reaches the caller: a command not
    started yet never starts (its scope can finish again), a running one is killed and recorded."""
    from .process import HookInterrupt, display

    config = scope.config
    hook = config.finish_hook
    if hook is None or not config.enable:
        return
    run = _HookRun(f"finish hook on rank {current_topology().rank} ({display(hook.cmd, limit=60)})")
    interrupt = HookInterrupt()

    def on_its_thread() -> None:
        try:
            _run(scope, where, flush_traces, interrupt)
        finally:
            run.done.set()
            unregister()

    with _RUNS_LOCK:
        _RUNS[:] = [other for other in _RUNS if not other.done.is_set()]
        _RUNS.append(run)
    # tsp.flush() waits for it
    unregister = background.add(background.HOOKS, functools.partial(background.wait_for_event, run.done))
    threading.Thread(target=on_its_thread, name="torchstep_prof-finish-hook", daemon=True).start()
    if hook.wait:
        try:
            background.wait_for_event(run.done)
        except KeyboardInterrupt:
            interrupt.interrupt()
            background.wait_for_event(run.done, timeout=5.0)  # let it record how the command ended
            raise


def _run(
    scope: HookScope,
    where: Optional[ProfilerConfig],
    flush_traces: Callable[..., object],
    interrupt: "HookInterrupt",
) -> None:
    from . import node_sync as _node_sync
    from .command import HookContext, run_hook

    config = scope.config
    hook = config.finish_hook
    assert hook is not None  # checked by finish()
    # Every trace of the process is on disk (and listed) before the command; only when training
    # waits for the hook is this wait time the training thread waited for the writer.
    flush_traces(count=hook.wait)
    topology = current_topology()
    if hook.per_node:
        _node_sync.mark_finished(scope.scope_id, topology.local_rank)
    if not runs_hook(scope, topology, where):
        return
    wait_s = 0.0
    missing: tuple[int, ...] = ()  # the local ranks that did not finish in time
    if hook.per_node:
        t0 = time.perf_counter()
        missing = _node_sync.wait_for_node(scope.scope_id, topology.local_world_size, hook.node_wait_s)
        wait_s = time.perf_counter() - t0
        STORE.add_costs(hook_wait_s=wait_s)
    handed = interrupt.unless_interrupted(scope.start_hook)
    if handed is None:  # Ctrl-C before the command started: the scope finishes again later
        return
    traces, roles = handed
    context = HookContext(
        save_path=os.path.abspath(config.save_path),
        rank=topology.rank,
        world_size=topology.world_size,
        local_rank=topology.local_rank,
        pid=os.getpid(),
        roles=roles,
        traces=tuple(os.path.abspath(path) for path in traces),
    )
    try:
        run_hook(hook, context, wait_s=wait_s, missing_ranks=missing, interrupt=interrupt)
    finally:
        if hook.per_node:
            _node_sync.cleanup(scope.scope_id)


def _running() -> list[_HookRun]:
    with _RUNS_LOCK:
        _RUNS[:] = [run for run in _RUNS if not run.done.is_set()]
        return list(_RUNS)


def wait_at_exit() -> None:
    """At interpreter exit: wait for hooks still running (each bounded by its own ``timeout_s``),
    showing which, on which rank, for how long; Ctrl-C kills their process groups."""
    if not _running():
        return
    try:
        if _stderr_is_terminal():
            _wait_with_live_status()
        else:
            _wait_with_plain_lines()
    except KeyboardInterrupt:
        from .process import kill_running_hooks

        killed = kill_running_hooks()
        _print(f"torchstep_prof: interrupted; killed {killed} finish hook process group(s)")
        background.wait_for((background.HOOKS,), timeout=5.0)  # let the hook threads record how their commands ended


def _status_text() -> str:
    from ..rendering import safe_text  # a command may hold a newline or an escape sequence

    now = time.monotonic()
    return "; ".join(f"waiting for {safe_text(run.label)}: {now - run.started:.0f} s" for run in _running())


def _wait_with_live_status() -> None:
    from rich.console import Console

    console = Console(file=sys.stderr)
    with console.status(f"torchstep_prof: {_status_text()} (Ctrl-C kills it)") as status:
        while not background.wait_for((background.HOOKS,), timeout=0.2):
            status.update(f"torchstep_prof: {_status_text()} (Ctrl-C kills it)")


def _wait_with_plain_lines() -> None:
    _print(f"torchstep_prof: {_status_text()} (Ctrl-C kills it)")
    while not background.wait_for((background.HOOKS,), timeout=_STATUS_EVERY_S):
        _print(f"torchstep_prof: {_status_text()}")


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _print(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
