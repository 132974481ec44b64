"""Hidden temporary files of trace writes: their names, and removing those of processes gone.

A trace is written under ``.torchstep_prof-partial-<host>-<pid>-<n>.partial`` in ``save_path``
(torch itself writes ``<that>.tmp`` first and renames it; gzip writes ``<that>.gz``), then given
its final name. A write that fails removes its own; a process killed mid-write (SIGKILL, SIGTERM
without a handler, a node losing power) cannot, so the next process on the same host that writes
into the folder removes the temporaries of pids that no longer run. Other hosts' files are never
touched (a shared file system: their pids mean nothing here), nor a live pid's.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Iterator

__all__ = [
    "SNAPSHOT_TEMP_SUFFIX",
    "TEMP_PREFIX",
    "host_label",
    "leftovers_of",
    "remove",
    "remove_dead_temporaries",
    "temporary_path",
]

TEMP_PREFIX = ".torchstep_prof-partial-"
TORCH_TEMP_SUFFIX = ".tmp"  # Kineto writes ``<path>.tmp``, then renames it to ``<path>``
GZIP_SUFFIX = ".gz"
SNAPSHOT_TEMP_SUFFIX = ".pickle"  # a CUDA memory snapshot on its way (memory_snapshot.py)
_MAX_HOST = 40  # the final name may be near 255 bytes; the temporary must stay far under it

_TEMPORARY = re.compile(
    r"^"
    + re.escape(TEMP_PREFIX)
    + r"(?P<host>[0-9A-Za-z.=+-]+)-(?P<pid>\d+)-(?P<n>\d+)\.partial(\.tmp|\.gz|\.pickle)*$"
)


def host_label(hostname: str | None = None) -> str:
    """This host's name as it appears in temporary file names (``[0-9A-Za-z.=+-]``, bounded)."""
    name = socket.gethostname() if hostname is None else hostname
    label = re.sub(r"[^0-9A-Za-z.=+-]+", "-", name).strip("-.")[:_MAX_HOST]
    return label or "host"


def temporary_path(folder: str, host: str, pid: int, number: int) -> str:
    """The hidden name write ``number`` of process ``pid`` on ``host`` uses in ``folder``."""
    return os.path.join(folder, f"{TEMP_PREFIX}{host}-{pid}-{number}.partial")


def leftovers_of(raw_path: str) -> tuple[str, ...]:
    """Every file a write under ``raw_path`` may have made, torch's own temporary included."""
    return (
        raw_path,
        raw_path + TORCH_TEMP_SUFFIX,
        raw_path + GZIP_SUFFIX,
        raw_path + TORCH_TEMP_SUFFIX + GZIP_SUFFIX,
        raw_path + SNAPSHOT_TEMP_SUFFIX,
    )


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _pid_runs(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, under another user
        return True
    return True


def _temporaries(folder: str) -> Iterator[tuple[str, str, int]]:
    try:
        entries = os.scandir(folder)
    except OSError:
        return
    with entries:
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX):
                match = _TEMPORARY.match(entry.name)
                if match is not None:
                    yield entry.path, match["host"], int(match["pid"])


def remove_dead_temporaries(folder: str, host: str) -> list[str]:
    """Remove the temporaries in ``folder`` left by processes of ``host`` that no longer run;
    returns their paths. Files of other hosts and of running pids stay."""
    removed: list[str] = []
    for path, their_host, pid in _temporaries(folder):
        if their_host == host and not _pid_runs(pid):
            try:
                os.unlink(path)
            except OSError:  # another process cleaning up at the same time got it first
                continue
            removed.append(path)
    return removed
