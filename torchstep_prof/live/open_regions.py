"""The regions each thread has entered and not left, with their entry times: what the live status shows.

With live status on (a ``stall`` section or an ``on_demand`` folder in force), a region is wrapped
in an :class:`OpenRegion`: its entry appends ``[role, stage, wall time]`` to its thread's list and
its exit removes that entry. Each thread appends to its own list only, so the training thread
takes no lock per region; the status thread copies the lists (``list.copy`` is atomic) when it
polls. Interleaved asyncio tasks share their thread's list: an exit removes its own entry, not
the last one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._fork import at_fork_in_child

__all__ = ["OpenIdle", "OpenRegion", "open_regions"]

_wall = time.time
_LOCAL = threading.local()  # .entries: this thread's open regions, outermost first
_LISTS: dict[int, list[list[Any]]] = {}  # thread ident -> its list (a thread registers once)
_LISTS_LOCK = threading.Lock()


def _entries() -> list[list[Any]]:
    """This thread's list, made and registered on its first region."""
    entries: list[list[Any]] = []
    _LOCAL.entries = entries
    with _LISTS_LOCK:
        _LISTS[threading.get_ident()] = entries
    return entries


class OpenIdle(list):  # type: ignore[type-arg]
    """A not-profiled region the live status shows while it is open (the common case): itself
    the list entry ``[role, stage, entered]``, made by ``list``'s own C constructor (no Python
    frame). ``as`` gets ``""``, as a timed region's does."""

    __slots__ = ()

    def __enter__(self) -> Any:
        self[2] = _wall()
        try:
            _LOCAL.entries.append(self)
        except AttributeError:  # this thread's first region
            _entries().append(self)
        return ""

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        entries = _LOCAL.entries
        if entries[-1] is self:
            entries.pop()
        else:
            _remove(entries, self)


def _remove(entries: list[Any], entry: Any) -> None:
    if entries[-1] is entry:
        entries.pop()
        return
    for index in range(len(entries) - 1, -1, -1):  # an interleaved task's region, or out of order
        if entries[index] is entry:
            del entries[index]
            return


class OpenRegion:
    """A region the live status shows while it is open, around what the region is otherwise
    (``inner``: a range in a trace, a trace of its own, a timed region)."""

    __slots__ = ("entry", "inner")

    def __init__(self, role: str, stage: str, inner: Any) -> None:
        self.inner = inner
        self.entry = [role, stage, 0.0]

    def __enter__(self) -> Any:
        entered = self.inner.__enter__()
        entry = self.entry
        entry[2] = _wall()
        try:
            _LOCAL.entries.append(entry)
        except AttributeError:
            _entries().append(entry)
        return entered

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        _remove(_LOCAL.entries, self.entry)
        return self.inner.__exit__(exc_type, exc, tb)


def open_regions() -> dict[int, list[tuple[Any, Any, float]]]:
    """Every thread's open regions now, outermost first (for the status thread)."""
    with _LISTS_LOCK:
        lists = list(_LISTS.items())
    alive = {thread.ident for thread in threading.enumerate()}
    found: dict[int, list[tuple[Any, Any, float]]] = {}
    gone = []
    for ident, entries in lists:
        if ident not in alive:
            gone.append(ident)
            continue
        copied = entries.copy()
        if copied:
            found[ident] = [(e[0], e[1], e[2]) for e in copied]
    if gone:
        with _LISTS_LOCK:
            for ident in gone:
                _LISTS.pop(ident, None)
    return found


def _forget_after_fork() -> None:
    # A forked child keeps only its own thread's list (the others' threads do not exist there).
    global _LISTS_LOCK
    _LISTS_LOCK = threading.Lock()
    me = threading.get_ident()
    kept = _LISTS.get(me)
    _LISTS.clear()
    if kept is not None:
        _LISTS[me] = kept


at_fork_in_child(_forget_after_fork)
