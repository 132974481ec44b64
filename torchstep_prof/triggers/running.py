"""What a step boundary reads of on-demand traces: the poll thread in force, and the engine plans drive.

Kept apart from ``watcher.py`` (the poll thread, the request and status files), which is
imported only when a frame opts in (``engine.py``): a job that never does pays for neither the
import nor anything but one attribute read per step block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..one_per_process import OnePerProcess

if TYPE_CHECKING:
    from ..recording.slot import ProfilerSlot
    from ..selection.frames import Frame, HookScope

__all__ = ["ENGINE", "ON_DEMAND", "Engine", "use_engine"]

# The one process-wide place a step boundary looks: ``ON_DEMAND.running`` is None unless a
# scope opted in (so a job that did not pays one attribute read per step block). Its worker is
# a ``watcher.Watcher``, typed where it is read (this module may not import watcher.py).
ON_DEMAND: OnePerProcess[Any] = OnePerProcess()


class Engine(Protocol):
    """What on-demand plans use of ``engine.Engine``: the engine imports this package, so it
    registers itself (:func:`use_engine`) instead of being imported."""

    slot: ProfilerSlot  # the automatic-trace watch asks whether a trace is recording

    def prepare(self, frame: Frame) -> None: ...

    def finish(self, scope: HookScope, where: Any = None) -> None: ...

    def ensure_atexit(self) -> None: ...


# The process's one engine, registered when engine.py is imported: regions, scopes and the
# start-up import it before any frame can opt in to on-demand traces.
ENGINE: list[Engine] = []


def use_engine(engine: Engine) -> None:
    """Drive ``engine`` from on-demand plans: their warm-up, their finish hooks, the exit work."""
    ENGINE[:] = [engine]
