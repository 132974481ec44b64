"""Opening one trace file: a regular file only (never a fifo), gzipped or not, parsed as JSON.

:func:`load_trace` turns whatever goes wrong (an unreadable file, a fifo or a device named
``*.json``, bad gzip, a gzip that inflates past :func:`inflate_limit`, bad JSON, deep nesting)
into one :class:`TraceReadError` naming the file.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
from typing import Any

from ._json import loads
from ..._shared_files import SharedFileError, read_capped
from ...errors import TorchstepProfError

__all__ = ["INFLATE_MIN_BYTES", "INFLATE_RATIO", "TraceReadError", "describe_error", "inflate_limit", "load_trace"]

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20

INFLATE_RATIO = 100
"""A gzipped trace may inflate to this many times its size (torch's Chrome traces compress about
10-20x)..."""
INFLATE_MIN_BYTES = 64 << 20
"""...or to this many bytes, whichever is more. Past it the file is skipped, never inflated
whole: a 510 KB gzip holding 512 MiB of JSON took 1.6 GB to read."""


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
        data: bytes | bytearray = _read_regular(path)
        if data[:2] == _GZIP_MAGIC:
            data = _inflate(path, data)
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


def inflate_limit(gzipped_bytes: int) -> int:
    """The most bytes a gzipped trace of ``gzipped_bytes`` may inflate to: :data:`INFLATE_RATIO`
    times its size, and at least :data:`INFLATE_MIN_BYTES`."""
    return max(INFLATE_MIN_BYTES, INFLATE_RATIO * gzipped_bytes)


def _inflate(path: str, data: bytes | bytearray) -> bytearray:
    """``data`` inflated a chunk at a time, stopping past :func:`inflate_limit` (memory stays
    bounded by the limit, whatever the gzip claims)."""
    limit = inflate_limit(len(data))
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data)) as inflating:
        while chunk := inflating.read(_CHUNK):
            out += chunk
            if len(out) > limit:
                raise TraceReadError(
                    f"{path}: a gzip that inflates past {_mib(limit)}, the most a {_mib(len(data))} "
                    f"gzip may hold ({INFLATE_RATIO}x its size, at least {_mib(INFLATE_MIN_BYTES)}): "
                    "not read; gunzip it to read it whole"
                )
    return out


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size / 1024:.0f} KB"


_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def _read_regular(path: str) -> bytes:
    """The bytes of ``path``, once it is known to be a regular file.

    A fifo named ``x.json`` would block a plain ``open`` until a writer comes, and a link to
    ``/dev/zero`` would be read forever: ``_shared_files.read_capped`` opens it without blocking
    and checks the very file opened before one byte is read. A link is followed (the user named
    the file), and the file is read whole (a trace has no cap; a gzip's inflating has).
    """
    try:
        return read_capped(path, None, follow_links=True)
    except FileNotFoundError:
        if os.path.islink(path):
            raise TraceReadError(f"{path}: a symbolic link to nothing (to {os.readlink(path)}), not read") from None
        raise
    except SharedFileError as exc:
        mode = exc.mode if exc.mode is not None else 0
        kind = next((what for test, what in _FILE_KINDS if test(mode)), "a special file")
        raise TraceReadError(f"{path}: not a regular file ({kind}), not read") from None


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one short line (the reason a file is skipped)."""
    text = str(exc)
    if len(text) > 200:  # a decoder may quote the input: keep one line short
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
