"""One background worker per process: started by a scope, stopped by it or at exit, forgotten after fork.

The live status (``live/reporter.py``) and the on-demand poll thread (``triggers/watcher.py``)
each run at most one, however many scopes opt in; a step boundary reads the one in force as
one attribute, ``running`` (None unless a scope opted in).
"""

from __future__ import annotations

import atexit
import threading
from typing import Callable, Generic, Optional, Protocol, TypeVar

from ._fork import at_fork_in_child

__all__ = ["OnePerProcess"]


class _Worker(Protocol):
    def stop(self) -> None: ...


W = TypeVar("W", bound=_Worker)


class OnePerProcess(Generic[W]):
    """The one worker of a kind this process runs, ``running`` (None: none), and the lock its start and stop take.

    >>> ON_DEMAND: OnePerProcess[Watcher] = OnePerProcess()  # doctest: +SKIP
    >>> ON_DEMAND.start(lambda: Watcher(config), if_running=lambda watcher: None)  # doctest: +SKIP
    """

    __slots__ = ("running", "_lock")

    def __init__(self) -> None:
        self.running: Optional[W] = None
        self._lock = threading.Lock()
        at_fork_in_child(self._forget)

    def start(self, make: Callable[[], Optional[W]], if_running: Callable[[W], None]) -> None:
        """Unless a worker runs (then ``if_running(it)``), make and start one with ``make()``
        (None: it could not start, and said why); it is stopped at exit if still running then."""
        with self._lock:
            running = self.running
            if running is not None:
                if_running(running)
                return
            worker = make()
            if worker is None:
                return
            self.running = worker
        atexit.register(self._stop_at_exit, worker)

    def stop_if(self, started_it: Callable[[W], bool]) -> None:
        """Stop the worker running when ``started_it(worker)`` (the scope exiting started it)."""
        with self._lock:
            worker = self.running
            if worker is None or not started_it(worker):
                return
            self.running = None
        worker.stop()

    def _stop_at_exit(self, worker: W) -> None:
        with self._lock:
            if self.running is not worker:
                return
            self.running = None
        try:
            worker.stop()
        except Exception:  # interpreter exit: nothing to report to
            pass

    def _forget(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self.running = None  # the worker's thread is the parent's
