"""Hidden work folders of trace writes: made private, removed after, and those of processes gone.

``save_path`` is often a shared, group-writable folder (docs/security.md), and torch writes by
name (``<path>.tmp``, then a rename): a predictable name there is one another user could plant a
link at. So each write happens in a folder of its own,
``.torchstep_prof-partial-<host>-<pid>-<random>``, made by ``mkdtemp`` (mode 0700, a name nobody
could have taken first) and reached through a descriptor held open (``/proc/self/fd/<n>``: still
that folder if someone renames it); torch exports ``trace.json`` there, gzip writes
``trace.json.gz`` beside it, and the finished file is hard-linked to its final name in
``save_path`` (a link never replaces or follows what holds that name). A write that fails, or
ends, removes its folder; a process killed mid-write (SIGKILL, SIGTERM without a handler, a node
losing power) cannot, so the next process on the same host that writes into the folder removes
the work folders of pids that no longer run (and the older ``...-<n>.partial`` files). Other
hosts' leftovers are never touched (a shared file system: their pids mean nothing here), nor a
live pid's, nor anything this user does not own.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
import tempfile
from typing import Iterator

__all__ = ["TEMP_PREFIX", "WorkFolder", "host_label", "link_exclusively", "remove", "remove_dead_temporaries"]

TEMP_PREFIX = ".torchstep_prof-partial-"
_MAX_HOST = 40  # the final name may be near 255 bytes; the temporary must stay far under it

_TEMPORARY = re.compile(
    r"^"
    + re.escape(TEMP_PREFIX)
    + r"(?P<host>[0-9A-Za-z.=+-]+)-(?P<pid>\d+)-(?:(?P<n>\d+)\.partial(\.tmp|\.gz)*|(?P<folder>[a-z0-9_]{8}))$"
)


def host_label() -> str:
    """This host's name as it appears in temporary file names (``[0-9A-Za-z.=+-]``, bounded)."""
    label = re.sub(r"[^0-9A-Za-z.=+-]+", "-", socket.gethostname()).strip("-.")[:_MAX_HOST]
    return label or "host"


class WorkFolder:
    """The private folder one trace write works in (see the module's docstring).

    >>> work = WorkFolder("/shared/traces", host_label(), os.getpid())  # doctest: +SKIP
    >>> torch_profile.export_chrome_trace(work.file("trace.json"))  # doctest: +SKIP
    >>> work.remove()  # doctest: +SKIP
    """

    def __init__(self, folder: str, host: str, pid: int) -> None:
        self.path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{host}-{pid}-", dir=folder)
        self._fd = -1
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            os.rmdir(self.path)
            raise
        by_descriptor = f"/proc/self/fd/{self._fd}"
        self.root = by_descriptor if os.path.isdir(by_descriptor) else self.path

    def file(self, name: str) -> str:
        """The path of ``name`` inside the folder."""
        return os.path.join(self.root, name)

    def remove(self) -> None:
        """Remove the folder and what the write left in it (best effort: never raises)."""
        if self._fd < 0:
            return
        try:
            for name in os.listdir(self.root):
                remove(os.path.join(self.root, name))
        except OSError:
            pass
        try:
            os.rmdir(self.path)  # only ever an empty folder: never what someone put in its place
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1


# os.link fails with one of these where the file system has no hard links (FAT, some FUSE
# mounts); a move across file systems fails earlier, with EXDEV.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS})


def link_exclusively(source: str, target: str) -> bool:
    """Give the file ``source`` (on ``target``'s file system) the name ``target`` unless a file
    holds it; False when one does. A hard link never replaces anything (``source`` keeps its own
    name too); without hard links, an exclusive placeholder is renamed over (``source`` is gone)."""
    try:
        os.link(source, target)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    try:
        os.replace(source, target)
    except BaseException:
        remove(target)
        raise
    return True


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


def remove_dead_temporaries(folder: str, host: str) -> None:
    """Remove the work folders (and older temporary files) in ``folder`` left by processes of
    ``host`` that no longer run and owned by this user. Files of other hosts, of running pids
    and of other users stay."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path, their_host, pid in _temporaries(folder):
        if their_host != host or _pid_runs(pid):
            continue
        try:
            info = os.lstat(path)
            if uid is not None and info.st_uid != uid:
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path)  # never follows a link inside (descriptor-based on Linux)
            else:
                os.unlink(path)  # a file, or a link itself: never what it points at
        except OSError:  # another process cleaning up at the same time got it first
            pass
