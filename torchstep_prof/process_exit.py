"""What interpreter exit and a fork do to the profiling engine.

At exit: the steps begun and never ended end, a trace still recording is stopped and written
(or, in another thread, reported lost), the pending files are written, the environment's hook
and deferred hooks run and are waited for, and the summary prints. In a forked child (a
DataLoader worker) the inherited engine is made inert: it writes nothing, runs no hook, prints
no summary. A companion of ``engine.py``: it works on the engine's own state.
"""

from __future__ import annotations

import threading
from typing import Any

from .selection import open_blocks
from .errors import TorchstepProfWarning, TraceWriteWarning, warn
from .selection.frames import env_hook_scope, frame_if_read
from .selection.rules import StepAction
from .recording.session import NESTED_FAST_PATH

# The engine (engine.Engine) comes as an argument: this module is imported by it.
Engine = Any

__all__ = ["after_fork_in_child", "at_exit", "close_open_blocks"]


def close_open_blocks(engine: Engine) -> None:
    """Interpreter exit: end the steps begun and never ended, stop a trace still recording in
    this thread (a generator left suspended inside a region), and note the missed steps of
    a schedule still in force (the environment's, or a scope never exited)."""
    try:
        open_blocks.end_all()
        owner = engine._owner
        if owner is not None and owner.session.owner_thread == threading.get_ident():
            owner.__exit__(None, None, None)
        elif owner is not None:
            _lose_at_exit(engine, owner)
        frame = frame_if_read()
        if frame is not None:
            engine._report_missed(frame)
    except Exception as exc:  # the exit code and the rest of the exit work come first
        engine._warn_once("exit", f"torchstep_prof: ending open blocks at exit failed: {exc!r}", TorchstepProfWarning)

def _lose_at_exit(engine: Engine, owner: Any) -> None:
    """A trace still recording at exit in another thread (a daemon thread inside a region):
    torch stops a profiler only in the thread that started it (from here its session is not
    found, and the export crashes), so it is lost: said once, and a row of the summary."""
    with engine.lock:
        if owner._done:
            return
        owner._done = True  # a late exit of its block in that thread must not stop it now
    session = owner.session
    thread = next((t.name for t in threading.enumerate() if t.ident == session.owner_thread), None)
    where = f"thread {thread!r}" if thread is not None else f"thread {session.owner_thread}"
    reason = f"still recording in {where} at interpreter exit (torch can only stop it in that thread)"
    label = f"{session.owner_role}/{session.owner_stage}" if not session.fused else "fused trace"
    warn(f"torchstep_prof: {label} trace of step {session.step} not written: {reason}", TraceWriteWarning, stacklevel=2)
    if session.action is StepAction.RECORD:
        session.record_unwritten(reason)

def at_exit(engine: Engine) -> None:
    if engine.forked:
        return
    try:
        close_open_blocks(engine)
        _flush_at_exit(engine)
        scope = env_hook_scope()
        if scope is not None:
            engine.finish(scope)
        with engine.lock:
            deferred, engine._deferred_finishes = engine._deferred_finishes, []
        engine._start_hooks(deferred)  # a trace still open at exit: its hooks run now
        from .hook.finishing import wait_at_exit

        wait_at_exit()
    finally:
        from .summary.exit_table import print_summary_at_exit

        print_summary_at_exit(engine.summary_wanted)

def _flush_at_exit(engine: Engine) -> None:
    try:
        if engine._writer is not None:
            engine._writer.flush(count=False)
    except KeyboardInterrupt:
        # Ctrl-C while the last traces are written: the exit work still waits for them (the
        # summary's records()); a second Ctrl-C there exits without them (summary/exit_table.py).
        warn(
            "torchstep_prof: interrupted at exit while traces were still being written; still "
            "waiting for them (Ctrl-C again exits without the traces not yet on disk)",
            TraceWriteWarning,
            stacklevel=2,
        )


def after_fork_in_child(engine: Engine) -> None:
    # A DataLoader worker inherits the parent's state, maybe a running profiler: it must
    # write nothing, run no hook and print no summary.
    if engine.warmed or engine.session is not None:  # Kineto ran here: its exit would hang
        from ._fork import exit_without_destructors

        exit_without_destructors()
    engine.forked = True
    engine.session = engine._owner = None
    NESTED_FAST_PATH.frame = NESTED_FAST_PATH.thread = None
    engine._busy = engine._stopping = False
    engine._deferred_finishes = []
    engine.lock = threading.Lock()
    if engine._writer is not None:
        engine._writer.forget_after_fork()
