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
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, Callable, Iterable, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import attrs

from ..config.model import FinishHookConfig
from ..errors import FinishHookWarning, warn
from ..traces.names import sanitize_label
from ..record_store import HOOK_FAILED, HOOK_NOT_STARTED, HOOK_OK, HOOK_TIMEOUT, STORE, HookRecord
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
    "HOOK_ENV_NAMES",
    "HookContext",
    "hook_environment",
    "kill_running_hooks",
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
HOOK_ENV_NAMES = (
    ENV_SAVE_PATH,
    ENV_RANK,
    ENV_WORLD_SIZE,
    ENV_LOCAL_RANK,
    ENV_PID,
    ENV_ROLES,
    ENV_TRACES,
    ENV_TRACES_FILE,
)
"""Every variable the hook's environment adds to the training process's own."""

OUTPUT_PREFIX = "[rank {rank}] "

_SHELL = "/bin/sh"
_KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL, so an uploader can clean up
_DRAIN_GRACE_S = 1.0  # for the output readers once the command has exited
_MAX_LINE = 64 * 1024  # a line without a newline is printed in pieces of this many bytes
# TORCHSTEP_PROF_TRACES only while it stays this short: thousands of paths in one variable make
# exec fail ("Argument list too long"); TORCHSTEP_PROF_TRACES_FILE always lists them all.
_MAX_TRACES_VARIABLE = 32 * 1024

_log = logging.getLogger(__name__)
_write_lock = threading.Lock()
# Hook commands running now: Ctrl-C during the exit wait kills their process groups.
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()
_cancelled = False  # set by kill_running_hooks: a hook not started yet never starts
_INTERRUPTED = "interrupted (Ctrl-C while training waited for it); its process group was killed"
T = TypeVar("T")


def _roles(value: Iterable[str]) -> Tuple[str, ...]:
    # Sanitizing is idempotent: labels already cleaned by the engine pass unchanged, and the hook
    # can never see a role spelled differently from the file names.
    return tuple(dict.fromkeys(sanitize_label(role, "role") for role in value))


def _paths(value: Iterable[Union[str, "os.PathLike[str]"]]) -> Tuple[str, ...]:
    return tuple(os.fspath(path) for path in value)


@attrs.frozen(kw_only=True)
class HookContext:
    """What the finish hook is told about the rank it runs on.

    ``roles`` are the labels as they appear in file names (sanitized here too, duplicates
    dropped); ``traces`` are the files this process wrote under the ``on_finish`` scope.

    >>> HookContext(save_path="out", rank=1, world_size=4, local_rank=1, pid=7,
    ...             roles=("actor", "compute_log_prob")).roles
    ('actor', 'compute-log-prob')
    """

    save_path: str = attrs.field(converter=os.fspath)
    rank: int
    world_size: int
    local_rank: int
    pid: int = attrs.field(factory=os.getpid)
    roles: Tuple[str, ...] = attrs.field(default=(), converter=_roles)
    traces: Tuple[str, ...] = attrs.field(default=(), converter=_paths)


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
        _warn(f"finish hook on rank {context.rank}: cannot write the list of traces: {exc}")
        return None


def kill_running_hooks() -> int:
    """Kill the process group of every hook command running now, and keep any hook that has
    not started its command yet from starting it; returns how many were killed."""
    global _cancelled
    with _RUNNING_LOCK:
        _cancelled = True
        running = list(_RUNNING)
    for process in running:
        _signal_group(process.pid, signal.SIGKILL)
    return len(running)


def run_hook(
    hook: FinishHookConfig,
    context: HookContext,
    *,
    wait_s: float = 0.0,
    missing_ranks: Sequence[int] = (),
    interrupt: Optional["HookInterrupt"] = None,
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
        _warn(
            f"finish hook on rank {context.rank}: no word from local rank(s) "
            f"{', '.join(map(str, missing_ranks))} of this node after {wait_s:.1f} s; running anyway "
            f"(does every local rank enter the same on_finish scope?)"
        )
    try:
        os.makedirs(context.save_path, exist_ok=True)
    except OSError as exc:
        _warn(f"finish hook on rank {context.rank}: cannot create save_path {context.save_path!r}: {exc}")
    relocated: Tuple[str, ...] = ()
    if hook.relocate:
        try:
            relocated = relocate_traces(hook.relocate, context.save_path, context.rank, context.world_size)
        except OSError as exc:
            _warn(f"finish hook on rank {context.rank}: relocate failed: {exc}")

    traces_file = _write_traces_file(context)
    try:
        outcome, exit_code, message = _run_command(
            hook.cmd,
            hook_environment(context, traces_file=traces_file),
            timeout_s=hook.timeout_s,
            prefix=OUTPUT_PREFIX.format(rank=context.rank),
            interrupt=interrupt,
        )
    finally:
        if traces_file is not None:  # the command has ended: the list served its purpose
            try:
                os.unlink(traces_file)
            except OSError:
                pass
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
        _log.info("finish hook on rank %d ended ok in %.2f s: %s", context.rank, record.duration_s, _display(hook.cmd))
    else:
        _warn(f"finish hook on rank {context.rank} {message}: {_display(hook.cmd)}")
    return record


# --- running the command ------------------------------------------------------------------------


class HookInterrupt:
    """Ctrl-C in the training thread while it waits for a ``wait=True`` hook running on its own
    thread (where no KeyboardInterrupt can land half-way through starting the command): before
    the command starts, it never starts; after, its process group is killed."""

    def __init__(self) -> None:
        self.interrupted = False
        self._process: Optional[subprocess.Popen[bytes]] = None

    def interrupt(self) -> None:
        with _RUNNING_LOCK:
            self.interrupted = True
            process = self._process
        if process is not None:
            _signal_group(process.pid, signal.SIGKILL)

    def unless_interrupted(self, start: Callable[[], T]) -> Optional[T]:
        """``start()``, unless the hook was interrupted first (then None)."""
        with _RUNNING_LOCK:
            return None if self.interrupted else start()


def _run_command(
    cmd: Union[str, Tuple[str, ...]],
    env: dict[str, str],
    *,
    timeout_s: Optional[float],
    prefix: str,
    interrupt: Optional[HookInterrupt] = None,
) -> tuple[str, Optional[int], Optional[str]]:
    argv = [_SHELL, "-c", cmd] if isinstance(cmd, str) else list(cmd)
    process: Optional[subprocess.Popen[bytes]] = None
    readers: list[threading.Thread] = []
    last_error_line: deque[str] = deque(maxlen=1)
    timed_out = False
    try:
        # Started under the lock: a Ctrl-C at exit (kill_running_hooks) either keeps the command
        # from starting or finds it running and kills it, never misses one that is just starting.
        with _RUNNING_LOCK:
            if _cancelled:
                return HOOK_NOT_STARTED, None, "not started: the process was interrupted (Ctrl-C) at exit"
            if interrupt is not None and interrupt.interrupted:
                return HOOK_NOT_STARTED, None, "not started: interrupted (Ctrl-C while training waited for it)"
            try:
                # A session of its own: a timeout can kill the hook's whole process group,
                # grandchildren included, and a Ctrl-C meant for training does not reach an upload.
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return HOOK_NOT_STARTED, None, f"could not start ({exc})"
            _RUNNING.add(process)
            if interrupt is not None:
                interrupt._process = process
        readers = [
            _start_reader(process.stdout, "stdout", prefix, None),
            _start_reader(process.stderr, "stderr", prefix, last_error_line),
        ]
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process)
    except BaseException:
        # A KeyboardInterrupt while training waits for it (wait=True): the hook must not
        # outlive the interrupted wait.
        if process is not None:
            _kill_group(process)
        raise
    finally:
        if process is not None:
            with _RUNNING_LOCK:
                _RUNNING.discard(process)
        _join_readers(readers)

    if interrupt is not None and interrupt.interrupted:
        return HOOK_FAILED, process.returncode, _INTERRUPTED
    if timed_out:
        return HOOK_TIMEOUT, None, f"timed out after {timeout_s:g} s; its process group was killed"
    code = process.returncode
    if code == 0:
        return HOOK_OK, 0, None
    return HOOK_FAILED, code, _failure_message(code, isinstance(cmd, str), last_error_line)


def _failure_message(code: int, through_shell: bool, last_error_line: deque[str]) -> str:
    if code < 0:
        try:
            text = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            text = f"was killed by signal {-code}"
    else:
        text = f"failed with exit code {code}"
        if through_shell and code in (126, 127):
            text += " (the shell could not " + ("find" if code == 127 else "execute") + " the program)"
    if last_error_line:
        text += f" (last stderr line: {last_error_line[0]!r})"
    return text


def _start_reader(pipe: Optional[IO[bytes]], stream: str, prefix: str, last_line: Optional[deque[str]]) -> threading.Thread:
    thread = threading.Thread(
        target=_copy_lines, args=(pipe, stream, prefix, last_line), name=f"torchstep_prof-hook-{stream}", daemon=True
    )
    thread.start()
    return thread


def _copy_lines(pipe: Optional[IO[bytes]], stream: str, prefix: str, last_line: Optional[deque[str]]) -> None:
    if pipe is None:
        return
    try:
        for raw in iter(lambda: pipe.readline(_MAX_LINE), b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if last_line is not None and text.strip():
                last_line.append(text)
            # Looked up per line, so a console swapped after import (pytest, a notebook) is used.
            target = getattr(sys, stream, None)
            if target is None:
                continue
            with _write_lock:
                target.write(f"{prefix}{text}\n")
                target.flush()
    except (OSError, ValueError):
        pass  # a closed console or pipe: the hook's output is lost, the hook itself goes on
    finally:
        pipe.close()


def _join_readers(readers: list[threading.Thread]) -> None:
    # A background process the hook started may hold the pipes open for ever: give the readers a
    # short grace, then leave them (daemon threads) draining whatever it still prints.
    deadline = time.monotonic() + _DRAIN_GRACE_S
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    group = process.pid  # start_new_session made the hook the leader of its own group
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    while time.monotonic() < deadline:
        if process.poll() is not None and not _signal_group(group, 0):
            return
        time.sleep(0.05)
    _signal_group(group, signal.SIGKILL)
    try:
        process.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass  # stuck in the kernel: nothing more a signal can do


def _signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to the process group; False once the group is gone."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _display(cmd: Union[str, Tuple[str, ...]], limit: int = 200) -> str:
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _warn(message: str) -> None:
    # The warning is what the user sees; the log line is at INFO so an unconfigured logging
    # setup does not print the same message a second time.
    _log.info(message)
    warn(message, FinishHookWarning, stacklevel=3)
