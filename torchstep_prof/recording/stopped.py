"""A stopped trace as data: the frozen record its window leaves, and what becomes of it.

Made once, when the trace stops (``TraceSession.stop``), it is all the engine, the writer, the
hook and the summary read of a trace. Torch-free: torch's results travel in it as an opaque
handle that only the writer exports.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Optional

import attrs

from ..naming import TraceName

if TYPE_CHECKING:
    from ..selection.frames import HookScope
    from ..summary.records import TraceRecord
    from .spans import SpanLog

__all__ = ["Outcome", "StoppedTrace", "decide_outcome"]


class Outcome(enum.Enum):
    """What becomes of a stopped trace."""

    WRITE = "write"  # the writer exports it and names its file
    DISCARD = "discard"  # recorded, never kept: a warm-up window, a step ``run`` dropped
    LOST = "lost"  # another profiler ended or took over its recording: nothing to export
    FAILED = "failed"  # torch's stop failed or was interrupted: the writer records it in turn


def decide_outcome(
    *, kept: bool, lost: Optional[str] = None, failed: Optional[str] = None
) -> tuple[Outcome, Optional[str]]:
    """The outcome of a trace, and its reason: ``kept`` (its step is selected and was not
    dropped), ``lost`` (why another profiler took its recording), ``failed`` (why torch's stop
    left nothing to export). A loss is reported even for a window not kept; a failed stop
    matters only for a kept one (tests/test_trace_record.py has the whole table)."""
    if lost is not None:
        return Outcome.LOST, lost
    if not kept:
        return Outcome.DISCARD, None
    if failed is not None:
        return Outcome.FAILED, failed
    return Outcome.WRITE, None


@attrs.frozen(kw_only=True)
class StoppedTrace:
    """One trace once its window stopped: ``name`` (the file's labels, step, rank, pid, start
    time), ``roles`` (as file names write them: the hook's list), and what becomes of it."""

    name: TraceName
    roles: tuple[str, ...]
    discrete: bool  # a region owned it, not a fused ``step`` block
    occurrence: int  # the k-th trace of (role, stage) in this step of the process
    save_path: str
    outcome: Outcome
    reason: Optional[str] = None  # why it is LOST or FAILED
    kept: bool = True  # a selected step's, not dropped: a loss is then a row of the summary
    wall_s: float = 0.0  # the block's time as the window measured it (the file's own replaces it)
    start_s: float = 0.0
    stop_s: float = 0.0
    # For the writer: torch's stopped profile, other threads' spans, the owner's range name.
    results: Any = attrs.field(default=None, repr=False, eq=False)
    spans: SpanLog = attrs.field(repr=False, eq=False)
    owner_range: Optional[str] = None
    process_role: Optional[str] = None  # the config's, for the spans the trace carries
    records_cuda: bool = False
    memory_snapshot: Optional[dict[str, Any]] = attrs.field(default=None, repr=False, eq=False)
    # For the engine once written: the ``on_finish`` scope it belongs to; whether its owning
    # region stayed open past its step, and the steps that began meanwhile.
    hook_scope: Optional[HookScope] = attrs.field(default=None, repr=False, eq=False)
    left_open: bool = False
    later_steps: tuple[int, ...] = ()

    def row(self, **changes: Any) -> TraceRecord:
        """This trace as a row of the summary, with ``changes`` (its path, its error)."""
        from ..summary.records import TraceRecord

        n = self.name
        fields = dict(role=n.role, stage=n.stage, step=n.step, rank=n.rank, world_size=n.world_size, path=None)
        times = dict(wall_s=self.wall_s, start_s=self.start_s, stop_s=self.stop_s)
        return TraceRecord(**{**fields, **times, **changes}, discrete=self.discrete, occurrence=self.occurrence)

    def unwritten_row(self) -> TraceRecord:
        """The row of a trace that never reached the writer (lost, or torch failed to start):
        labelled as its file would have been, its ``reason`` the error, no times (no file)."""
        return self.row(error=self.reason or "not written", wall_s=0.0, start_s=0.0, stop_s=0.0)
