"""What interpreter exit does to the profiling engine, through the engine's public methods.

The steps begun and never ended end, a trace still recording is stopped and written (or, in
another thread, reported lost), the pending files are written, the environment's hook and
deferred hooks run and are waited for, and the summary prints. (What a fork does is
``Engine.after_fork_in_child``: the inherited engine is made inert.)
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from .errors import TorchstepProfWarning, TraceWriteWarning, warn
from .recording.slot import OwnedTrace, ProfilerSlot
from .selection import open_blocks
from .selection.frames import Frame, HookScope, env_hook_scope, frame_if_read


class Engine(Protocol):
    """What the exit work uses of ``engine.Engine`` (its public methods; the engine imports
    this module, so it is not imported here)."""

    summary_wanted: bool
    slot: ProfilerSlot

    def report_missed(self, frame: Frame) -> None: ...

    def warn_once(self, key: str, message: str, category: type[Warning]) -> None: ...

    def finish(self, scope: HookScope, where: Any = None) -> None: ...

    def start_deferred_hooks(self) -> None: ...

    def flush_pending_writes(self) -> None: ...


__all__ = ["at_exit", "close_open_blocks"]


def close_open_blocks(engine: Engine) -> None:
    """Interpreter exit: end the steps begun and never ended, stop a trace still recording in
    this thread (a generator left suspended inside a region), and note the missed steps of
    a schedule still in force (the environment's, or a scope never exited)."""
    try:
        open_blocks.end_all()
        owner = engine.slot.owner
        if owner is not None and owner.session.owner_thread == threading.get_ident():
            owner.__exit__(None, None, None)
        elif owner is not None:
            _lose_at_exit(owner)
        frame = frame_if_read()
        if frame is not None:
            engine.report_missed(frame)
    except Exception as exc:  # the exit code and the rest of the exit work come first
        engine.warn_once("exit", f"torchstep_prof: ending open blocks at exit failed: {exc!r}", TorchstepProfWarning)


def _lose_at_exit(owner: OwnedTrace) -> None:
    """A trace still recording at exit in another thread (a daemon thread inside a region):
    torch stops a profiler only in the thread that started it (from here its session is not
    found, and the export crashes), so it is lost: said once, and a row of the summary."""
    if not owner.claim():  # a late exit of its block in that thread must not stop it now
        return
    session = owner.session
    thread = next((t.name for t in threading.enumerate() if t.ident == session.owner_thread), None)
    where = f"thread {thread!r}" if thread is not None else f"thread {session.owner_thread}"
    reason = f"still recording in {where} at interpreter exit (torch can only stop it in that thread)"
    label = f"{session.owner_role}/{session.owner_stage}" if not session.fused else "fused trace"
    warn(f"torchstep_prof: {label} trace of step {session.step} not written: {reason}", TraceWriteWarning)
    if session.keep:
        session.record_unwritten(reason)


def import_exit_modules() -> None:
    """Import now what the finish hook and interpreter exit need, off every step.

    Done with the profiler's warm-up: the first hook would otherwise pay ~30 ms of imports in
    the training thread when it triggers, and an import inside an at-exit callback makes
    CPython forget that the script ended on an unhandled KeyboardInterrupt (the process then
    exits 1, not 130 as python does).
    """
    import rich.box  # noqa: F401
    import rich.console  # noqa: F401
    import rich.live  # noqa: F401
    import rich.measure  # noqa: F401
    import rich.status  # noqa: F401
    import rich.table  # noqa: F401
    import rich.text  # noqa: F401

    from . import rendering  # noqa: F401
    from .hook import command, finishing, node_sync, process, relocate  # noqa: F401
    from .summary import exit_table  # noqa: F401


def at_exit(engine: Engine) -> None:
    """The engine's interpreter-exit work (registered by ``Engine.ensure_atexit``)."""
    if engine.slot.forked:
        return
    written = True
    try:
        close_open_blocks(engine)
        written = _flush_at_exit(engine)
        if not written:  # Ctrl-C twice: the user wants out, with no summary and no hook left running
            from .hook.process import kill_running_hooks

            kill_running_hooks()
            return
        scope = env_hook_scope()
        if scope is not None:
            engine.finish(scope)
        engine.start_deferred_hooks()  # a trace still open at exit: its hooks run now
        from .hook.finishing import wait_at_exit

        wait_at_exit()
    finally:
        if written:
            from .summary.exit_table import print_summary_at_exit

            print_summary_at_exit(engine.summary_wanted)


def _flush_at_exit(engine: Engine) -> bool:
    """Wait for the traces still being written; ``False`` when a second Ctrl-C gave up on them."""
    try:
        engine.flush_pending_writes()
        return True
    except KeyboardInterrupt:
        pass
    # Ctrl-C while the last traces are written: wait on, here (one place for both Ctrl-Cs, so
    # the second lands in this wait whatever the exit work would have done next).
    try:
        warn(
            "torchstep_prof: interrupted at exit while traces were still being written; still "
            "waiting for them (Ctrl-C again exits without the traces not yet on disk)",
            TraceWriteWarning,
        )
        engine.flush_pending_writes()
        return True
    except KeyboardInterrupt:
        # The next process writing into the folder removes their temporary files.
        warn(
            "torchstep_prof: interrupted again at exit; exiting without the traces not yet on disk (no summary)",
            TraceWriteWarning,
        )
        return False
