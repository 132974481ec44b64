"""Which ``record_function`` ranges of the training thread are open, while a run needs to know.

torch crashes when a range that began while one profiler recorded ends while another records
(its end reaches the new profiler with the old one's freed state: stopping one and starting the
next inside a range around each iteration segfaulted 6 runs in 6). Torch's own ``Optimizer.step#...`` range and a user's ``record_function("iter")``
around the iteration are such ranges when a step boundary falls inside them. So while a step
records, or the next one will, ``torchstep-prof run`` wraps ``record_function``'s
``__enter__``/``__exit__`` to see the ranges of the training thread open and close: a step's
trace ends, and the next one starts, once every range opened since that step began has closed,
and no trace starts while a range opened under another trace is open. Not needed (no selected step near): the wrappers are removed and cost nothing.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from torch.autograd import profiler as _autograd_profiler

__all__ = ["RangeWatch"]


class RangeWatch:
    """Open ranges of thread ``owner``: ``{id(range): (name, opened_while_recording, step)}``.

    While ``waiting``, ``on_ready`` runs (in the owner thread) when the last range opened in the
    current step closes, or just before a range opens (the next step's work begins before the
    old ranges closed: an outer range, an epoch's, stays open).
    """

    def __init__(self, owner: int, on_ready: Callable[[], None]) -> None:
        self.owner = owner
        self.open: dict[int, tuple[str, bool, int]] = {}  # id -> (name, while recording, step index)
        self.step_index = 0  # advanced by new_step(): a step waits only for its own ranges
        self.current = 0  # open ranges opened in the current step
        self.waiting = False
        self.recording = False  # a trace of ours records now: ranges opened now are unsafe later
        self.ignoring = False  # our own ranges (the step's ProfilerStep#<n>, regions) are not watched
        self._on_ready = on_ready
        self._saved: Optional[tuple[Any, Any]] = None

    @property
    def installed(self) -> bool:
        return self._saved is not None

    def new_step(self) -> None:
        """A step begins: ranges still open are older than it."""
        self.step_index += 1
        self.current = 0

    def unsafe(self) -> Optional[str]:
        """The name of an open range that began while a trace of ours recorded, if any."""
        for name, recorded, _ in list(self.open.values()):
            if recorded:
                return name
        return None

    def install(self) -> None:
        if self._saved is not None:
            return
        cls = _autograd_profiler.record_function
        enter, leave = cls.__enter__, cls.__exit__
        self._saved = (enter, leave)
        watch, owner, get_ident, opened = self, self.owner, threading.get_ident, self.open

        def __enter__(rf: Any) -> Any:
            if watch.ignoring or get_ident() != owner:
                return enter(rf)
            if watch.waiting:
                watch._on_ready()
            result = enter(rf)
            opened[id(rf)] = (getattr(rf, "name", "?"), watch.recording, watch.step_index)
            watch.current += 1
            return result

        def __exit__(rf: Any, *exc_info: Any) -> Any:
            result = leave(rf, *exc_info)
            entry = opened.pop(id(rf), None)
            if entry is not None and entry[2] == watch.step_index:
                watch.current -= 1
                if not watch.current and watch.waiting:
                    watch._on_ready()
            return result

        # ignores: functools-style markers on functions, and the class's methods patched on purpose.
        __enter__.__wrapped__ = enter  # type: ignore[attr-defined]
        __exit__.__wrapped__ = leave  # type: ignore[attr-defined]
        cls.__enter__, cls.__exit__ = __enter__, __exit__  # type: ignore[method-assign]

    def uninstall_if_idle(self) -> None:
        """Remove the wrappers unless a watched range is still open (its exit must be seen)."""
        if self._saved is None or self.open:
            return
        cls = _autograd_profiler.record_function
        cls.__enter__, cls.__exit__ = self._saved  # type: ignore[method-assign]  # put back
        self._saved = None

    def remove(self) -> None:
        """At the run's end: the wrappers go whatever is open."""
        self.open.clear()
        self.current = 0
        self.waiting = False
        self.uninstall_if_idle()
