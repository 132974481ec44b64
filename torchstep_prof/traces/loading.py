"""Opening one trace file: a regular file only (never a fifo), gzipped or not, parsed as JSON.

:func:`load_trace` turns whatever goes wrong (an unreadable file, a fifo or a device named
``*.json``, bad gzip, bad JSON, deep nesting) into one :class:`TraceReadError` naming the file.
"""

from __future__ import annotations

import gzip
import os
import stat
from typing import IO, Any

from ._json import loads
from ..errors import TorchstepProfError

__all__ = ["TraceReadError", "describe_error", "load_trace"]

_GZIP_MAGIC = b"\x1f\x8b"


class TraceReadError(TorchstepProfError):
    """A file that cannot be used as a trace; the message says which file and why."""


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed JSON object of a ``.json`` or gzipped trace file.

    Uses orjson when it is installed. Raises :class:`TraceReadError` naming the file when it
    cannot be read, is not (gzipped) JSON, or is not a JSON object -- whatever the reader raised
    (a gzip or zlib error, ``RecursionError`` from deeply nested JSON, ``MemoryError``...).
    """
    path = os.fspath(path)
    try:
        with _open_regular(path) as handle:
            data = handle.read()
        if data[:2] == _GZIP_MAGIC:
            data = gzip.decompress(data)
    except TraceReadError:
        raise
    except Exception as exc:  # OSError, EOFError, zlib.error, MemoryError...: all one to a reader
        raise TraceReadError(f"{path}: cannot read ({describe_error(exc)})") from exc
    try:
        trace = loads(data)
    except Exception as exc:  # JSONDecodeError, UnicodeDecodeError, RecursionError, MemoryError
        raise TraceReadError(f"{path}: not valid JSON ({describe_error(exc)})") from exc
    finally:
        del data
    if not isinstance(trace, dict):
        raise TraceReadError(f"{path}: not a Chrome trace (top level is not a JSON object)")
    return trace


_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _open_regular(path: str) -> IO[bytes]:
    """``path`` opened for reading, once it is known to be a regular file.

    A fifo named ``x.json`` would block a plain ``open`` until a writer comes, and a link to
    ``/dev/zero`` would be read forever: the file is opened without blocking and checked with
    ``fstat`` (the very file opened, not a name that may change meanwhile) before one byte is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        if os.path.islink(path):
            raise TraceReadError(f"{path}: a symbolic link to nothing (to {os.readlink(path)}), not read") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((what for test, what in _FILE_KINDS if test(mode)), "a special file")
            raise TraceReadError(f"{path}: not a regular file ({kind}), not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one short line (the reason a file is skipped)."""
    text = str(exc)
    if len(text) > 200:  # a decoder may quote the input: keep one line short
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
