"""A request being served in one process: its steps, the frame they profile under, what it missed.

The poll thread (watcher.py) makes a :class:`Plan` from a request it read; the training thread's
step boundaries ask it (``at_step``) and retire it once a later step begins or the job ends. A
planned step profiles under a :class:`TriggeredFrame`, made once per plan over the frame in force
there: the job's configuration (save path, names, finish hook) with the request's steps, ranks,
contents and discrete, and a hook scope of its own, so the hook runs once per request, after
its last step. Steps this rank had passed when it read the request are reported, never moved.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Protocol

import attrs

from ..config.model import ScheduleConfig
from ..errors import TorchstepProfWarning, warn
from ..rendering import step_ranges
from ..selection.frames import Frame, HookScope
from ..selection.rules import rank_selected
from ..topology import current_topology
from .request import Request
from .running import ENGINE

__all__ = ["Plan", "TriggeredFrame"]


class _Owner(Protocol):
    """Where the plan in force is published (the watcher): ``plan`` is what a step boundary reads."""

    plan: Optional[Plan]


class TriggeredFrame(Frame):
    """The frame a planned step profiles under: ``base`` is the frame in force at that step
    (a scope's exit ends a ``begin_step`` step begun under it, triggered or not)."""

    __slots__ = ("base",)
    base: Frame


class Plan:
    """One request being served: its steps, which of them this rank began, and the frame they
    profile under (made at the first step boundary after the request arrived)."""

    def __init__(self, owner: _Owner, request: Request, entry: dict[str, Any]) -> None:
        self.owner = owner
        self.entry = entry  # this request's line in the status file: its outcome is kept there
        self.request = request
        self.steps = frozenset(request.steps)
        self.last = max(request.steps)
        self.at_step_read: Optional[int] = None  # this rank's step when the request was read (set by the watcher)
        self.seen: set[int] = set()
        self._lock = threading.Lock()
        self._base: Optional[Frame] = None
        self._frame: Optional[TriggeredFrame] = None

    def frame_over(self, base: Frame) -> TriggeredFrame:
        """The frame of this plan's steps under ``base`` (one per plan and base: the steps of
        one request share its hook scope)."""
        with self._lock:
            frame = self._frame
            if frame is not None and self._base is base:
                return frame
            request = self.request
            config = attrs.evolve(
                base.config,
                schedule=ScheduleConfig(steps=request.steps),
                ranks=request.ranks if request.ranks is not None else base.config.ranks,
                all_ranks=request.all_ranks,
                contents=request.contents if request.contents is not None else base.config.contents,
                discrete=bool(request.discrete),
            )
            hook_scope = None
            if config.finish_hook is not None:
                hook_scope = HookScope(config, None)
                for scope in base.hook_scope.chain() if base.hook_scope is not None else ():
                    scope.served_requests = True  # this request runs their hook with its traces
            frame = TriggeredFrame(config, hook_scope)
            frame.base = base
            self._base, self._frame = base, frame
            return frame

    def at_step(self, frame: Frame, number: int) -> Frame:
        """Step ``number`` begins under ``frame``: the plan's frame for a planned step."""
        if number in self.steps:
            self.seen.add(number)
            return self.frame_over(frame)
        if number > self.last:
            self.retire()
        elif self._frame is None and not frame.disabled:
            # Before the first planned step: pay the profiler's warm-up here, not inside it.
            ENGINE[0].prepare(self.frame_over(frame))
        return frame

    def retire(self, ending: bool = False) -> None:
        """The plan is over (a later step began, or the job ends): report the steps missed."""
        owner = self.owner
        if owner.plan is not self:
            return
        owner.plan = None
        missed = sorted(self.steps - self.seen)
        frame = self._frame
        request = self.request
        if not rank_selected(request.ranks or (), request.all_ranks, current_topology().rank):
            self.entry["outcome"] = "not selected (--ranks)"
        elif missed:
            self._report_missed(missed, ending)
        else:
            self.entry["outcome"] = f"profiled {step_ranges(self.steps)}"
        if frame is not None and frame.hook_scope is not None and not frame.hook_scope.finished:
            ENGINE[0].finish(frame.hook_scope, frame.config)  # as a schedule's scope exit would

    def _report_missed(self, missed: list[int], ending: bool) -> None:
        from ..summary.records import STORE

        profiled = sorted(self.seen & self.steps)
        self.entry["outcome"] = (
            f"profiled {step_ranges(profiled)}, " if profiled else ""
        ) + f"missed {step_ranges(missed)}"
        read_at = self.at_step_read
        if ending and (read_at is None or min(missed) > read_at):
            where = "the job ended before them"
        else:
            where = (
                f"this rank was at step {read_at} when it read the request; trigger again with a "
                "larger --align or a later --at"
            )
        line = f"on-demand request {self.request.id}: step(s) {step_ranges(missed)} not profiled ({where})"
        ENGINE[0].ensure_atexit()
        # A line of its own, not the missed-steps row: that one says the steps never ran, and
        # these did, unprofiled, before this rank read the request.
        STORE.add_attention(f"on-demand-{self.request.id}", line)
        warn(f"torchstep_prof: {line}", TorchstepProfWarning)
