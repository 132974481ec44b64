"""Files in folders other users may write: created exclusively, read without blocking, size-capped.

The on-demand folder and ``save_path`` are often group-writable shared folders (docs/security.md).
Anyone who can write there can plant a link or a FIFO at a name the toolkit uses, so:

- a file is never opened for writing at a name someone else could have created first: it is
  created under a fresh random name with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a link or file already
  there makes the open fail, never followed), then put in place with a rename, which replaces a
  link at the final name instead of writing through it;
- a file is read with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO cannot block the open, a link is refused),
  checked to be a regular file, and read up to a cap (a link to ``/dev/zero`` or a huge file
  costs at most the cap); a file the user named (a config file, a trace) is read by the same
  function, following links, since the user chose it;
- work that other tools write by name, such as torch's export, is done in a private folder
  (``mkdtemp``: mode 0700, created exclusively; ``writing/temp_files.py``).

No torch here: the command line uses it too.
"""

from __future__ import annotations

import errno
import glob
import io
import os
import secrets
import stat
from typing import Callable, Optional, TypeVar

__all__ = [
    "SharedFileError",
    "create_exclusively",
    "read_capped",
    "read_each",
    "replace_exclusively",
]

T = TypeVar("T")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class SharedFileError(OSError):
    """A file in a shared folder that is not what it should be (a FIFO, a device, a link, too
    big); the message names the file and what was found. A caller that words its own message
    reads why: ``mode`` is the ``st_mode`` of a file that is not a regular one, ``too_big`` is
    true for one over the cap."""

    mode: Optional[int] = None
    too_big = False


def _refused(message: str, mode: Optional[int] = None, too_big: bool = False) -> SharedFileError:
    error = SharedFileError(message)
    error.mode, error.too_big = mode, too_big
    return error


def read_capped(path: str, limit: Optional[int], *, follow_links: bool = False) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (``None``: no cap).

    The package's one non-blocking reader of a file someone else may have put in place. Never blocks (a FIFO is
    refused, not waited on), checks the very file opened (``fstat``, not a name that may change
    meanwhile), never reads more than ``limit + 1`` bytes, and never follows a link at ``path``
    unless ``follow_links`` (a file the user named: a config file, a trace; one found in a
    shared folder is never followed). Raises :class:`SharedFileError` for a file that is not a
    regular file or is bigger than ``limit``, ``OSError`` when it cannot be opened.

    >>> read_capped("/dev/zero", 100)
    Traceback (most recent call last):
    ...
    torchstep_prof._shared_files.SharedFileError: /dev/zero: not a regular file (a character device)
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _BINARY | (0 if follow_links else _NOFOLLOW))
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:  # O_NOFOLLOW met a symbolic link
            raise SharedFileError(f"{path}: a symbolic link (refused: not written by the toolkit)") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refused(f"{path}: not a regular file ({_kind(info.st_mode)})", mode=info.st_mode)
        if limit is None:  # a regular file, read whole (readall sizes its buffer from fstat)
            with io.FileIO(fd, closefd=False) as whole:
                return whole.readall()
        if info.st_size > limit:
            raise _refused(f"{path}: bigger than {limit} bytes (refused)", too_big=True)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # it grew since fstat
        raise _refused(f"{path}: bigger than {limit} bytes (refused)", too_big=True)
    return data


def replace_exclusively(path: str, data: bytes) -> None:
    """Put ``data`` at ``path`` atomically: written to a new file of a random name in the same
    folder (created with ``O_EXCL | O_NOFOLLOW``, mode 0666 less the umask), then renamed over
    ``path``. A link or FIFO someone planted at ``path`` is replaced, never written through.

    >>> replace_exclusively("/shared/od/status-rank0.json", b"{}")  # doctest: +SKIP
    """
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def create_exclusively(path: str) -> int:
    """A new file at ``path`` opened for appending (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0666
    less the umask); its descriptor. Anything already at ``path`` (a file, a link, a FIFO) makes
    it fail with ``FileExistsError``: the caller picks another name.

    >>> fd = create_exclusively("/shared/spans/spans-node1-4242.jsonl")  # doctest: +SKIP
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW | _BINARY, 0o666)


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def read_each(folder: str, pattern: str, read: Callable[[str], T], limit: int, what: str) -> tuple[list[T], list[str]]:
    """``read`` of each file of ``folder`` named like ``pattern`` (the first ``limit`` by name, so a
    folder flooded with files costs a bounded read), and a line for each file that is not one
    (``read`` raised OSError or ValueError) and for the files left unread.
    """
    found: list[T] = []
    bad: list[str] = []
    paths = sorted(glob.glob(os.path.join(glob.escape(folder), pattern)))
    if len(paths) > limit:
        bad.append(f"{folder}: {len(paths)} {what} files; only the first {limit} are read")
    for path in paths[:limit]:
        try:
            found.append(read(path))
        except (OSError, ValueError) as exc:
            bad.append(f"{path}: {exc}" if path not in str(exc) else str(exc))
    return found, bad
