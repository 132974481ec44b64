"""Per-node completion for ``on_finish(per_node=True)``, without any collective.

Every local rank drops a marker file when its profiling is finished; the node's uploader
(``LOCAL_RANK == 0``) polls for ``LOCAL_WORLD_SIZE`` markers, bounded by ``node_wait_s``. Markers
live in a private folder under ``tempfile.gettempdir()``, never in ``save_path``, so the upload
never ships them. A collective would let a slow rank trip other ranks' NCCL/gloo timeouts.

Layout: ``<tmp>/torchstep_prof-<uid>/<node key>/<scope hash>/rank<local rank>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from typing import Mapping, Optional

from .._shared_files import replace_exclusively
from ..errors import FinishHookWarning, warn

__all__ = ["cleanup", "mark_finished", "node_key", "wait_for_node"]

# What torchrun tells each worker about its launcher; together with the host they name one
# launcher's group of workers in one attempt. A restart bumps the count, a later job gets a new
# agent (and usually a new run id or port), so no attempt sees another's markers.
_LAUNCHER_VARIABLES = (
    "GROUP_RANK",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# torchrun points each worker at <log dir>/<run id>/attempt_<n>/<local rank>/error.json: the
# attempt folder is unique to one agent and one attempt, and shared by all its workers.
_ERROR_FILE_VARIABLE = "TORCHELASTIC_ERROR_FILE"

_ROOT_PREFIX = "torchstep_prof-"
_MARKER = re.compile(r"^rank(\d+)$")
_SAFE = re.compile(r"[^0-9A-Za-z.=+-]+")


def node_key(environ: Optional[Mapping[str, str]] = None) -> str:
    """A folder name shared by the processes of one launcher on this host, in this attempt.

    Built from torchrun's variables (``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``,
    ``TORCHELASTIC_RESTART_COUNT``, ``MASTER_ADDR``, ``MASTER_PORT``), the host name, and the
    launcher itself: torchrun's per-attempt log folder when it set one, else the parent process
    (its pid and start time, so a recycled pid is a different launcher).

    >>> node_key({"GROUP_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"})  # doctest: +SKIP
    'group1-restart0-3f9c2a7d01b4e6c8'
    """
    env = os.environ if environ is None else environ
    parts = [f"host={socket.gethostname()}"]
    parts += [f"{name}={env.get(name, '')}" for name in _LAUNCHER_VARIABLES]
    parts.append(f"launcher={_launcher_identity(env)}")
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    group = _SAFE.sub("-", env.get("GROUP_RANK", "")) or "x"
    restart = _SAFE.sub("-", env.get("TORCHELASTIC_RESTART_COUNT", "")) or "x"
    return f"group{group}-restart{restart}-{digest}"


def mark_finished(scope_id: str, local_rank: int, environ: Optional[Mapping[str, str]] = None) -> None:
    """Record that ``local_rank`` finished profiling under ``scope_id`` on this node.

    The marker appears atomically (written under a temporary name, then renamed). A marker that
    cannot be written is a ``FinishHookWarning``: the uploader then waits out its bound and names
    this rank as missing, but training goes on.

    >>> mark_finished("finish-hook-1", local_rank=2)  # doctest: +SKIP
    """
    try:
        folder = _scope_dir(scope_id, environ)
        final = os.path.join(folder, f"rank{local_rank}")
        replace_exclusively(final, f"{os.getpid()} {time.time():.3f}\n".encode())
    except OSError as exc:
        warn(
            f"finish hook: local rank {local_rank} could not mark its profiling finished ({exc}); "
            f"the node's uploader will report it missing",
            FinishHookWarning,
        )


def wait_for_node(
    scope_id: str,
    local_world_size: int,
    timeout_s: float,
    environ: Optional[Mapping[str, str]] = None,
    poll_s: float = 0.05,
) -> tuple[int, ...]:
    """Wait until local ranks ``0 .. local_world_size - 1`` have all called :func:`mark_finished`
    for ``scope_id``, or ``timeout_s`` has passed; return the local ranks not heard from
    (empty when all finished).

    >>> wait_for_node("finish-hook-1", local_world_size=4, timeout_s=300)  # doctest: +SKIP
    ()
    """
    wanted = set(range(local_world_size))
    deadline = time.monotonic() + timeout_s
    try:
        folder = _scope_dir(scope_id, environ)
    except OSError as exc:
        # No node-mate can mark anything here either (the same folder fails for them): waiting
        # out the bound would only stall every per-node hook. Say why, and run it now.
        warn(
            f"finish hook: cannot wait for the node's ranks ({exc}); running the per-node hook now "
            f"without waiting for them",
            FinishHookWarning,
        )
        return tuple(sorted(wanted))
    while True:
        missing = wanted - _marked(folder)
        if not missing or time.monotonic() >= deadline:
            return tuple(sorted(missing))
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def cleanup(scope_id: str, environ: Optional[Mapping[str, str]] = None) -> None:
    """Remove the markers of ``scope_id`` once the node's hook has run (best effort).

    >>> cleanup("finish-hook-1")  # doctest: +SKIP
    """
    try:
        folder = _scope_dir(scope_id, environ)
    except OSError:
        return
    # Only the scope's folder: removing the (empty) node folder could race with a node-mate
    # creating the next scope's folder inside it.
    shutil.rmtree(folder, ignore_errors=True)


# --- helpers ------------------------------------------------------------------------------------


def _launcher_identity(env: Mapping[str, str]) -> str:
    error_file = env.get(_ERROR_FILE_VARIABLE, "")
    if error_file and os.path.isabs(error_file):
        # Preferred over the parent pid: a wrapper (`torchrun --no-python run.sh`) gives each
        # worker its own parent, but they all share the attempt folder.
        return "attempt-dir=" + os.path.dirname(os.path.dirname(error_file))
    parent = os.getppid()
    return f"ppid={parent}@{_start_time(parent)}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return ""
    # Field 22 (start time); the command name in parentheses may itself hold spaces.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


def _root_dir() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    root = os.path.join(tempfile.gettempdir(), f"{_ROOT_PREFIX}{uid}")
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    # In a shared /tmp another user could have planted this name (or a link) first.
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        owner = "a link" if stat.S_ISLNK(info.st_mode) else f"owned by uid {info.st_uid}, mode {info.st_mode & 0o777:o}"
        raise PermissionError(
            f"{root} ({owner}) is not a private folder of this user (uid {uid}, mode 700): someone else "
            "may have made it; remove it, or point TMPDIR at a folder of your own"
        )
    return root


def _scope_dir(scope_id: str, environ: Optional[Mapping[str, str]]) -> str:
    scope = hashlib.sha256(scope_id.encode()).hexdigest()[:24]
    folder = os.path.join(_root_dir(), node_key(environ), f"scope-{scope}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def _marked(folder: str) -> set[int]:
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {int(m.group(1)) for m in map(_MARKER.match, names) if m}
