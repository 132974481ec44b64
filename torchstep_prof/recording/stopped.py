"""A stopped trace as data: the frozen record its window leaves, and what becomes of it.

:class:`StoppedTrace` is made once, when the trace stops (``TraceSession.stop``), and is all the
engine, the writer, the finish hook and the summary read of a trace: its identity (named by
:func:`torchstep_prof.naming.name_trace`), occurrence, roles, save path, timings, and its
:class:`Outcome`, decided by :func:`decide_outcome`. Torch-free: the profiler's results travel
in it as an opaque handle only the writer exports.
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
    matters only for a kept one.

    >>> decide_outcome(kept=True)
    (<Outcome.WRITE: 'write'>, None)
    >>> decide_outcome(kept=False, lost="ended")
    (<Outcome.LOST: 'lost'>, 'ended')
    """
    if lost is not None:
        return Outcome.LOST, lost
    if not kept:
        return Outcome.DISCARD, None
    if failed is not None:
        return Outcome.FAILED, failed
    return Outcome.WRITE, None


@attrs.frozen(kw_only=True)
class StoppedTrace:
    """One trace once its window stopped. ``name`` holds the file's labels, step, rank, pid and
    start time; ``roles`` the roles it holds as file names write them (the hook's list)."""

    name: TraceName
    roles: tuple[str, ...]
    discrete: bool  # a region owned it (not a fused ``step`` block)
    occurrence: int  # the k-th trace of (role, stage) in this step of the process
    save_path: str
    outcome: Outcome
    reason: Optional[str] = None  # why it is LOST or FAILED
    kept: bool = True  # a selected step's trace, not dropped: a loss is then a row of the summary
    # The block's time as the window measured it (the writer replaces it with the file's own),
    # torch's start and stop.
    wall_s: float = 0.0
    start_s: float = 0.0
    stop_s: float = 0.0
    # For the writer: torch's stopped profile, other threads' spans, the owning region's range,
    # whether it holds CUDA activity, the CUDA allocator's history (contents "memory_snapshot").
    results: Any = attrs.field(default=None, repr=False, eq=False)
    spans: SpanLog = attrs.field(repr=False, eq=False)
    owner_range: Optional[str] = None
    records_cuda: bool = False
    memory_snapshot: Optional[dict[str, Any]] = attrs.field(default=None, repr=False, eq=False)
    # For the engine once it is written: the ``on_finish`` scope it belongs to, and whether its
    # owning region stayed open past its step (the steps that began meanwhile).
    hook_scope: Optional[HookScope] = attrs.field(default=None, repr=False, eq=False)
    left_open: bool = False
    later_steps: tuple[int, ...] = ()

    def row(self, **changes: Any) -> TraceRecord:
        """This trace as a row of the summary (:class:`~torchstep_prof.summary.records.TraceRecord`),
        with ``changes`` (its path once written, its error)."""
        from ..summary.records import TraceRecord

        name = self.name
        fields: dict[str, Any] = dict(
            role=name.role,
            stage=name.stage,
            step=name.step,
            rank=name.rank,
            world_size=name.world_size,
            discrete=self.discrete,
            path=None,
            occurrence=self.occurrence,
            wall_s=self.wall_s,
            start_s=self.start_s,
            stop_s=self.stop_s,
        )
        fields.update(changes)
        return TraceRecord(**fields)

    def unwritten_row(self, error: str) -> TraceRecord:
        """The summary's row of a trace that never reached the writer (lost, or torch failed to
        start), labelled as its file would have been; no times, as it has no file."""
        return self.row(error=error, wall_s=0.0, start_s=0.0, stop_s=0.0)
