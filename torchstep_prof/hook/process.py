"""Running one finish-hook command in its own process group, with its output and its timeout.

Its output is streamed with a rank prefix; a timeout kills the whole group, and so does Ctrl-C
at exit for every hook still running. The command runs under a small watchdog process
(``_watchdog.py``) that keeps the same deadline should the training process be killed first.

What the command sees and how a run is recorded is ``command.py``; this module only runs it.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, Any, Callable, Optional, Tuple, TypeVar, Union

from ..errors import FinishHookWarning, warn
from ..summary.records import HOOK_FAILED, HOOK_NOT_STARTED, HOOK_OK, HOOK_TIMEOUT

__all__ = ["HookInterrupt", "display", "kill_running_hooks", "run_command", "warn_hook"]

_log = logging.getLogger("torchstep_prof.hook.command")
_SHELL = "/bin/sh"
_KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL, so an uploader can clean up
_DRAIN_GRACE_S = 1.0  # for the output readers once the command has exited
# The watchdog's deadline is this much later than ours: while training lives, it ends the hook
# (and records a timeout); the watchdog acts only once training is gone.
_WATCHDOG_MARGIN_S = 1.0
_WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_watchdog.py")
_WATCHDOG_START_S = 30.0  # the most the watchdog may take to say whether the command started
_MAX_LINE = 64 * 1024  # a line without a newline is printed in pieces of this many bytes
_write_lock = threading.Lock()
# Hook commands running now: Ctrl-C during the exit wait kills their process groups.
_RUNNING: set[subprocess.Popen[bytes]] = set()
_RUNNING_LOCK = threading.Lock()
_cancelled = False  # set by kill_running_hooks: a hook not started yet never starts
_INTERRUPTED = "interrupted (Ctrl-C while training waited for it); its process group was killed"
T = TypeVar("T")


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


def run_command(
    cmd: Union[str, Tuple[str, ...]],
    env: dict[str, str],
    *,
    timeout_s: float,
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
                process, started = _start(argv, env, timeout_s)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                return HOOK_NOT_STARTED, None, f"could not start ({exc})"
            _RUNNING.add(process)
            if interrupt is not None:
                interrupt._process = process
        failure = started()  # the watchdog's word (outside the lock: it may take a moment)
        if failure is not None:
            _kill_group(process)
            for pipe in (process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()
            return HOOK_NOT_STARTED, None, f"could not start ({failure})"
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


def _start(
    argv: list[str], env: dict[str, str], timeout_s: float
) -> tuple[subprocess.Popen[bytes], Callable[[], Optional[str]]]:
    """Start ``argv`` under its watchdog, in a session of its own, and return the process (the
    watchdog, leader of the group) with a call that waits for the start's outcome (None: started;
    else why not). A session of its own: a timeout can kill the hook's whole process group,
    grandchildren included, and a Ctrl-C meant for training does not reach an upload."""
    options: dict[str, Any] = dict(
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    if not sys.executable:  # an embedded interpreter with no executable to run: no watchdog
        return subprocess.Popen(argv, **options), lambda: None
    read_end, write_end = os.pipe()
    try:
        watchdog = [sys.executable, "-I", "-S", _WATCHDOG, repr(timeout_s + _WATCHDOG_MARGIN_S), repr(_KILL_GRACE_S)]
        process = subprocess.Popen([*watchdog, str(write_end), *argv], pass_fds=(write_end,), **options)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    return process, functools.partial(_start_outcome, read_end)


def _start_outcome(read_end: int) -> Optional[str]:
    """The watchdog's status: None once the command started, else the reason it did not."""
    try:
        # poll, not select: a training process may hold descriptors past select's 1024.
        poller = select.poll()
        poller.register(read_end, select.POLLIN)
        ready = bool(poller.poll(_WATCHDOG_START_S * 1000))
        status = os.read(read_end, 4096) if ready else b""
    finally:
        os.close(read_end)
    if status.startswith(b"S"):
        return None
    if status.startswith(b"E"):
        return status[1:].decode("utf-8", "replace")
    return "its watchdog process did not start it" if ready else "its watchdog process did not answer"


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


def _start_reader(
    pipe: Optional[IO[bytes]], stream: str, prefix: str, last_line: Optional[deque[str]]
) -> threading.Thread:
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


def display(cmd: Union[str, Tuple[str, ...]], limit: int = 200) -> str:
    """``cmd`` as one line of text (a list joined as a shell would quote it), cut to ``limit``."""
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warn_hook(message: str) -> None:
    # The warning is what the user sees; the log line is at INFO so an unconfigured logging
    # setup does not print the same message a second time.
    _log.info(message)
    warn(message, FinishHookWarning)
