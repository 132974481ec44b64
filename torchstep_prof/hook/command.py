"""The finish hook: run the user's command once profiling is finished on a rank.

The command (a string through ``/bin/sh -c``, a list without a shell) sees the traces through
``TORCHSTEP_PROF_*`` environment variables, never through text formatted into the command. Its
output is streamed to the console with a ``[rank r]`` prefix; a failure, a timeout (the whole
process group is killed) or a command that cannot start is a ``FinishHookWarning`` and a
``HookRecord``, never an exception: training goes on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Iterable, Mapping, Optional, Sequence, Tuple

import attrs

from ..config.model import FinishHookConfig
from ..naming import sanitize_label
from ..summary.records import STORE, HookRecord
from ..writing.temp_files import remove
from .process import HookInterrupt, display, run_command, warn_hook
from .relocate import relocate_traces

__all__ = [
    "ENV_LOCAL_RANK",
    "ENV_PID",
    "ENV_RANK",
    "ENV_ROLES",
    "ENV_SAVE_PATH",
    "ENV_TRACES",
    "ENV_TRACES_FILE",
    "ENV_WORLD_SIZE",
    "HookContext",
    "hook_environment",
    "run_hook",
]

ENV_SAVE_PATH = "TORCHSTEP_PROF_SAVE_PATH"
ENV_RANK = "TORCHSTEP_PROF_RANK"
ENV_WORLD_SIZE = "TORCHSTEP_PROF_WORLD_SIZE"
ENV_LOCAL_RANK = "TORCHSTEP_PROF_LOCAL_RANK"
ENV_PID = "TORCHSTEP_PROF_PID"
ENV_ROLES = "TORCHSTEP_PROF_ROLES"
ENV_TRACES = "TORCHSTEP_PROF_TRACES"
ENV_TRACES_FILE = "TORCHSTEP_PROF_TRACES_FILE"

# TORCHSTEP_PROF_TRACES only while it stays this short: thousands of paths in one variable make
# exec fail ("Argument list too long"); TORCHSTEP_PROF_TRACES_FILE always lists them all.
_MAX_TRACES_VARIABLE = 32 * 1024

_log = logging.getLogger("torchstep_prof.hook.command")


def _roles(value: Iterable[str]) -> Tuple[str, ...]:
    # Sanitizing is idempotent: labels already cleaned by the engine pass unchanged, and the hook
    # can never see a role spelled differently from the file names.
    return tuple(dict.fromkeys(sanitize_label(role) for role in value))


@attrs.frozen(kw_only=True)
class HookContext:
    """What the finish hook is told about the rank it runs on.

    ``roles`` are the labels as they appear in file names (sanitized here too, duplicates
    dropped); ``traces`` are the files this process wrote under the ``on_finish`` scope.

    >>> HookContext(save_path="out", rank=1, world_size=4, local_rank=1, pid=7,
    ...             roles=("actor", "compute_log_prob")).roles
    ('actor', 'compute-log-prob')
    """

    save_path: str
    rank: int
    world_size: int
    local_rank: int
    pid: int = attrs.field(factory=os.getpid)
    roles: Tuple[str, ...] = attrs.field(default=(), converter=_roles)
    traces: Tuple[str, ...] = ()


def hook_environment(
    context: HookContext, base_environ: Optional[Mapping[str, str]] = None, traces_file: Optional[str] = None
) -> dict[str, str]:
    """The hook's environment: ``base_environ`` (default ``os.environ``) plus ``TORCHSTEP_PROF_*``.

    ``TORCHSTEP_PROF_TRACES`` joins the traces with ``os.pathsep`` only while that stays under
    32 KiB and no path holds ``os.pathsep``; ``TORCHSTEP_PROF_TRACES_FILE`` (``traces_file``, one
    path a line) always lists them.

    >>> env = hook_environment(HookContext(save_path="out", rank=0, world_size=2, local_rank=0,
    ...                                    pid=7, roles=("actor", "critic")), base_environ={})
    >>> env["TORCHSTEP_PROF_ROLES"], env["TORCHSTEP_PROF_WORLD_SIZE"]
    ('actor,critic', '2')
    """
    env = dict(os.environ if base_environ is None else base_environ)
    env.update(
        {
            ENV_SAVE_PATH: context.save_path,
            ENV_RANK: str(context.rank),
            ENV_WORLD_SIZE: str(context.world_size),
            ENV_LOCAL_RANK: str(context.local_rank),
            ENV_PID: str(context.pid),
            ENV_ROLES: ",".join(context.roles),
        }
    )
    joined = os.pathsep.join(context.traces)
    if len(joined) < _MAX_TRACES_VARIABLE and not any(os.pathsep in path for path in context.traces):
        env[ENV_TRACES] = joined
    else:
        env.pop(ENV_TRACES, None)
    if traces_file is not None:
        env[ENV_TRACES_FILE] = traces_file
    return env


def _write_traces_file(context: HookContext) -> Optional[str]:
    """The file behind ``TORCHSTEP_PROF_TRACES_FILE``: one absolute path a line, outside
    ``save_path`` (an upload of the folder does not ship it)."""
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix=f"torchstep_prof-traces-rank{context.rank}-pid{context.pid}-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.writelines(f"{os.path.abspath(trace)}\n" for trace in context.traces)
        return path
    except OSError as exc:
        warn_hook(f"finish hook on rank {context.rank}: cannot write the list of traces: {exc}")
        return None


def run_hook(
    hook: FinishHookConfig,
    context: HookContext,
    *,
    wait_s: float = 0.0,
    missing_ranks: Sequence[int] = (),
    interrupt: Optional[HookInterrupt] = None,
) -> HookRecord:
    """Run ``hook.cmd`` for ``context`` now, in this thread, and record how it went.

    Creates ``save_path``, moves ``hook.relocate`` traces into it, then runs the command in its
    own session, streaming its output with a ``[rank r]`` prefix and killing its whole process
    group after ``hook.timeout_s``. ``wait_s`` and ``missing_ranks`` are what a per-node uploader
    waited (recorded here; the caller adds it to the costs) and did not hear from
    (``_node_sync.wait_for_node``); missing ranks are warned about. ``interrupt`` lets the
    thread that waits for this one (``wait=True``) stop the command. Never raises for the command's
    sake: failures are ``FinishHookWarning`` warnings, and the returned record (also appended to
    ``tsp.records().hooks``) says ``ok``, ``failed``, ``timeout`` or ``not-started``.

    >>> run_hook(FinishHookConfig(cmd='ls "$TORCHSTEP_PROF_SAVE_PATH"', timeout_s=600),
    ...          HookContext(save_path="out", rank=0, world_size=1, local_rank=0)).outcome
    ... # doctest: +SKIP
    'ok'
    """
    started = time.monotonic()
    if missing_ranks:
        warn_hook(
            f"finish hook on rank {context.rank}: no word from local rank(s) "
            f"{', '.join(map(str, missing_ranks))} of this node after {wait_s:.1f} s; running anyway "
            f"(does every local rank enter the same on_finish scope?)"
        )
    try:
        os.makedirs(context.save_path, exist_ok=True)
    except OSError as exc:
        warn_hook(f"finish hook on rank {context.rank}: cannot create save_path {context.save_path!r}: {exc}")
    relocated: Tuple[str, ...] = ()
    if hook.relocate:
        try:
            relocated = relocate_traces(hook.relocate, context.save_path, context.rank, context.world_size)
        except OSError as exc:
            warn_hook(f"finish hook on rank {context.rank}: relocate failed: {exc}")

    traces_file = _write_traces_file(context)
    try:
        outcome, exit_code, message = run_command(
            hook.cmd,
            hook_environment(context, traces_file=traces_file),
            timeout_s=hook.timeout_s,
            prefix=f"[rank {context.rank}] ",
            interrupt=interrupt,
        )
    finally:
        if traces_file is not None:  # the command has ended: the list served its purpose
            remove(traces_file)
    record = HookRecord(
        cmd=hook.cmd,
        rank=context.rank,
        outcome=outcome,
        exit_code=exit_code,
        duration_s=time.monotonic() - started,
        wait_s=wait_s,
        message=message,
        missing_ranks=tuple(missing_ranks),
        relocated=relocated,
    )
    STORE.add_hook(record)
    if record.ok:
        _log.info("finish hook on rank %d ended ok in %.2f s: %s", context.rank, record.duration_s, display(hook.cmd))
    else:
        warn_hook(f"finish hook on rank {context.rank} {message}: {display(hook.cmd)}")
    return record
