"""The per-file summary cache: what reading a trace found, kept so a second run reads no trace.

One JSON file per trace folder, under the user's cache home (``$TORCHSTEP_PROF_CACHE_DIR``, else
``$XDG_CACHE_HOME/torchstep_prof``, else ``~/.cache/torchstep_prof``), never in the trace folder:
a read-only folder (a mounted bucket, another user's run) is cached like any other. Each entry is
one file's description (:class:`~torchstep_prof.traces.reading.files.TraceInfo`) or the reason it was
skipped, keyed by the file's real path and valid while the file's size and modification time
(nanoseconds) are unchanged and it was read with at least as many operators as asked for. A cache
written by another version of torchstep_prof is ignored; one that cannot be read or written is
no error (the folder is read as without one).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import typing
from typing import Any, Optional, Tuple, Union

import attrs

from ._json import dumps, loads
from ..._shared_files import replace_exclusively
from .files import TraceInfo, Unreadable

__all__ = ["CACHE_ENV", "SummaryCache", "cache_dir", "file_key"]

CACHE_ENV = "TORCHSTEP_PROF_CACHE_DIR"
_FORMAT = 3


_NOT_CONTENTS = ("cannot read", "not a regular file", "a symbolic link")
"""Reasons a file is skipped that its contents do not decide (see
:mod:`~torchstep_prof.traces.reading.loading`): never cached."""


def cache_dir() -> str:
    """Where summary caches live: ``$TORCHSTEP_PROF_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/torchstep_prof``, else ``~/.cache/torchstep_prof``."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "torchstep_prof")


def file_key(path: str) -> Optional[tuple[str, int, int]]:
    """(real path, size, mtime in ns) of ``path``; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _real_folder(os.path.dirname(path)) + os.sep + os.path.basename(path), st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=1024)
def _real_folder(folder: str) -> str:
    # Once per folder, not per file: realpath walks every component of the path.
    return os.path.realpath(folder or ".")


# Entries hold each record as the list of its field values (nested records alike): a second run
# rebuilds 20,000 descriptions, and keyword-free lists decode several times faster than cattrs.
# A cache is a file anyone may have edited or torn: every value is checked against its field's
# type as it is decoded, and an entry that does not fit is read again from its trace.
_INFO_GIVEN = ("path",)
_INFO_FIELDS = tuple(f.name for f in attrs.fields(TraceInfo) if f.name not in _INFO_GIVEN)


class _Malformed(ValueError):
    """A cache entry this code did not write: its trace is read again."""


def _encode(value: Any) -> Any:
    if attrs.has(type(value)):
        return [_encode(getattr(value, f.name)) for f in attrs.fields(type(value))]
    if isinstance(value, tuple):
        return [_encode(item) for item in value]
    return value


_CHECKS = {
    str: "{v}.__class__ is str",
    int: "{v}.__class__ is int",
    bool: "{v}.__class__ is bool",
    float: "({v}.__class__ is float or {v}.__class__ is int)",
    Optional[int]: "({v} is None or {v}.__class__ is int)",
    Optional[float]: "({v} is None or {v}.__class__ is float or {v}.__class__ is int)",
    Tuple[str, ...]: "({v}.__class__ is list and all(x.__class__ is str for x in {v}))",
}


def _decoder(cls: type, given: tuple[str, ...] = ()) -> Any:
    """A function of a list of rows (and the ``given`` fields' values) to a tuple of ``cls``'s
    records, written for its fields as attrs writes ``__init__``: no per-row dict. A row of the
    wrong length, or a value not of its field's type, raises :class:`_Malformed`."""
    hints = typing.get_type_hints(cls)
    scope: dict[str, Any] = {"cls": cls, "_Malformed": _Malformed}
    checks, args = [], [f"{name}={name}" for name in given]
    names = [f.name for f in attrs.fields(cls) if f.name not in given]
    for index, name in enumerate(names):
        hint, value = hints[name], f"r[{index}]"
        if hint in _CHECKS:
            checks.append(_CHECKS[hint].format(v=value))
            args.append(f"{name}=tuple({value})" if hint == Tuple[str, ...] else f"{name}={value}")
        else:  # Tuple[<record>, ...]: the nested decoder checks its rows
            record = typing.get_args(hint)[0]
            if typing.get_origin(hint) is not tuple or not attrs.has(record):
                raise TypeError(f"the summary cache cannot check {cls.__name__}.{name} ({hint}): add it to _CHECKS")
            scope[f"d_{name}"] = _decoder(record)
            args.append(f"{name}=d_{name}({value})")
    source = (f"def decode(rows, {', '.join(given)}):\n" if given else "def decode(rows):\n") + (
        "    if rows.__class__ is not list: raise _Malformed\n"
        "    out = []\n"
        "    for r in rows:\n"
        f"        if r.__class__ is not list or len(r) != {len(names)}: raise _Malformed\n"
        f"        if not ({' and '.join(checks) or 'True'}): raise _Malformed\n"
        f"        out.append(cls({', '.join(args)}))\n"
        "    return tuple(out)\n"
    )
    exec(compile(source, f"<cache decoder of {cls.__name__}>", "exec"), scope)  # noqa: S102
    return scope["decode"]


@functools.lru_cache(maxsize=1)
def _info_decoder() -> Any:
    return _decoder(TraceInfo, _INFO_GIVEN)


class SummaryCache:
    """The cache of one trace folder: :meth:`get` an entry, :meth:`put` new ones, :meth:`save`.

    >>> cache = SummaryCache.for_folder("outputs/profile")  # doctest: +SKIP
    >>> cache.get("outputs/profile/x.json", top=5)           # doctest: +SKIP
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._changed = False
        self._seen: set[str] = set()
        self.problem: Optional[str] = None
        self._load()

    @classmethod
    def for_folder(cls, directory: str, *, recursive: bool = False) -> SummaryCache:
        """The cache of ``directory`` (its subfolders too when ``recursive``)."""
        what = f"{os.path.realpath(directory)}\0{int(recursive)}".encode()
        name = f"summaries-{hashlib.sha256(what).hexdigest()[:32]}.json"
        return cls(os.path.join(cache_dir(), name))

    def _load(self) -> None:
        from ... import __version__

        try:
            with open(self.path, "rb") as handle:
                doc = loads(handle.read())
        except Exception:  # none yet, or a torn or foreign file: start afresh, it is rewritten on save
            return
        if (
            isinstance(doc, dict)
            and doc.get("format") == _FORMAT
            and doc.get("version") == __version__
            and isinstance(doc.get("entries"), dict)
        ):
            self._entries = doc["entries"]

    def get(self, path: str, top: int) -> Union[TraceInfo, Unreadable, None]:
        """What reading ``path`` with ``top`` operators gave last time, when still valid."""
        key = file_key(path)
        if key is None:
            return None
        self._seen.add(key[0])
        entry = self._entries.get(key[0])
        if not isinstance(entry, dict) or entry.get("size") != key[1] or entry.get("mtime_ns") != key[2]:
            return None
        decode = _info_decoder()  # outside the try: a field type it cannot check is a bug to see, not a miss
        try:
            if "reason" in entry:
                reason = entry["reason"]
                return Unreadable(path=path, reason=reason) if isinstance(reason, str) else None
            if entry.get("top", 0) < top:
                return None
            (info,) = decode([entry["info"]], path)
            return _trimmed(info, top)
        except Exception:  # an entry this code did not write (edited, torn): read the file again
            return None

    def put(self, path: str, result: Union[TraceInfo, Unreadable], top: int) -> None:
        """Remember ``result`` of reading ``path`` with ``top`` operators."""
        key = file_key(path)
        if key is None:
            return
        entry: dict[str, Any] = {"size": key[1], "mtime_ns": key[2]}
        if isinstance(result, Unreadable):
            if result.reason.startswith(_NOT_CONTENTS):
                return  # a permission, a link, a kind of file: may change with neither
            entry["reason"] = result.reason
        else:
            entry.update(top=top, info=[_encode(getattr(result, name)) for name in _INFO_FIELDS])
        self._entries[key[0]] = entry
        self._changed = True

    def save(self) -> None:
        """Write the cache if anything changed (atomically); a failure is kept in ``problem``."""
        if not self._changed:
            return
        from ... import __version__

        # Files gone since: their entries go (a folder that is cleaned keeps a small cache).
        for key in [k for k in self._entries if k not in self._seen and not os.path.exists(k)]:
            del self._entries[key]
        folder = os.path.dirname(self.path)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            replace_exclusively(self.path, dumps({"format": _FORMAT, "version": __version__, "entries": self._entries}))
            _forget_old(folder)
        except OSError as exc:
            self.problem = f"cannot write the summary cache {self.path}: {exc.strerror or exc}"
        else:
            self._changed = False


MAX_AGE_S = 30 * 24 * 3600
"""A folder's cache not written for this long is removed (by the next save of any cache): the
folders read once, a test's or a finished run's, do not pile up."""


def _forget_old(folder: str) -> None:
    cutoff = time.time() - MAX_AGE_S
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("summaries-") and entry.name.endswith(".json"):
                try:
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                except OSError:  # another run removed it, or rewrote it meanwhile
                    pass


def _trimmed(info: TraceInfo, top: int) -> TraceInfo:
    """``info`` with its operator lists cut to ``top`` (a cache entry may hold more)."""
    if len(info.top_ops) <= top and all(len(r.ops) <= top for r in info.region_ops):
        return info
    return attrs.evolve(
        info,
        top_ops=info.top_ops[:top],
        region_ops=tuple(attrs.evolve(r, ops=r.ops[:top]) for r in info.region_ops) if top else (),
    )
