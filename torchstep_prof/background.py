"""The process's background work (trace writes, finish hooks) and ``flush()``, which waits for it.

The trace writer and the finish-hook runner register what a caller may have to wait for; the
scope exit, the hook start, ``records()``, interpreter exit and the user (``tsp.flush()``) wait
here, without knowing who registered what. No torch import: the command line may use it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Iterable, Optional

from ._fork import at_fork_in_child
from .interrupts import interruptible

__all__ = ["HOOKS", "POLL_S", "WRITES", "add", "flush", "wait_for", "wait_for_event"]

WRITES = "writes"
"""Pending trace writes (the writer waits for every trace ended so far)."""
HOOKS = "hooks"
"""Finish hooks started so far."""

Waiter = Callable[[Optional[float]], bool]
"""``wait(timeout)``: block until the work is done or ``timeout`` seconds passed (None: no
limit); returns whether it is done."""

_lock = threading.Lock()
_work: list[tuple[str, Waiter]] = []


POLL_S = 0.005
"""How often a wait in the training thread looks again (see :func:`wait_for_event`)."""


@interruptible
def wait_for_event(event: threading.Event, timeout: Optional[float] = None) -> bool:
    """``event.wait(timeout)``, safe for a Ctrl-C to land anywhere in it.

    ``Event.wait`` (``Condition.wait`` inside) takes its lock back in a ``finally``; a second
    Ctrl-C arriving there leaves the lock released under its ``with``, and ``RuntimeError:
    release unlocked lock`` replaces the KeyboardInterrupt. Polling the flag holds no lock
    while it sleeps; it returns at most :data:`POLL_S` late.

    >>> import threading
    >>> done = threading.Event(); done.set()
    >>> wait_for_event(done), wait_for_event(threading.Event(), timeout=0.01)
    (True, False)
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while not event.is_set():
        if deadline is None:
            time.sleep(POLL_S)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, POLL_S))
    return True


def add(kind: str, wait: Waiter) -> Callable[[], None]:
    """Register background work of ``kind`` (:data:`WRITES`, :data:`HOOKS`); returns a
    function that removes it (call it once, when the work is done, or keep it registered for
    good: a waiter of finished work returns True at once)."""
    entry = (kind, wait)
    with _lock:
        _work.append(entry)

    def remove() -> None:
        with _lock:
            _work.remove(entry)

    return remove


def wait_for(kinds: Iterable[str], timeout: Optional[float] = None) -> bool:
    """Wait for the registered work of ``kinds``, in that order (work registered meanwhile
    too); returns True when all of it is done, False when ``timeout`` seconds ran out first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for kind in kinds:
        waited: set[int] = set()
        while True:
            with _lock:
                todo = [w for k, w in _work if k == kind and id(w) not in waited]
            if not todo:
                break
            for wait in todo:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not wait(left):
                    return False
                waited.add(id(wait))
    return True


def flush(timeout: Optional[float] = None) -> bool:
    """Wait until this process's background work is done: every trace ended so far is on disk
    (or recorded as failed), every finish hook started so far has ended, and the span log holds
    every span recorded so far.

    Returns True when all of it is done, False when ``timeout`` seconds ran out first (the
    work goes on). A test or a notebook calls it before reading the traces; training code
    rarely needs it (scope exits, hooks and interpreter exit already wait for the writes).

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[1]):               # doctest: +SKIP
    ...     with tsp.profile_region("actor", "update", step=1):
    ...         model(batch)
    ...     tsp.flush()                             # the trace is on disk now
    ...     files = os.listdir("outputs/profile")
    """
    spans = sys.modules.get("torchstep_prof.timeline.span_log")
    if spans is not None:  # the span log's lines so far, written now (a Ray actor about to be killed)
        spans.flush_spans()
    return wait_for((WRITES, HOOKS), timeout)


def _forget_in_child() -> None:
    # A forked child has none of its parent's threads: there is nothing of theirs to wait for.
    global _lock
    _lock = threading.Lock()
    _work.clear()


at_fork_in_child(_forget_in_child)
