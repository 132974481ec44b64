"""One torch profiler window, live: started by the block that owns a trace, stopped when it exits.

A session holds the torch ``profile`` object, the ``ProfilerStep#<n>`` range spanning the owning
block, the owner's own ``<role>/<stage>`` range and other threads' spans while the trace records.
Its stop leaves a frozen :class:`~torchstep_prof.recording.stopped.StoppedTrace`, the only thing
the engine, the writer, the hook and the summary read of it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Union

import torch
from torch.profiler import ProfilerActivity, record_function
from torch.profiler import profile as Profile

from .memory_history import MemoryHistory
from .nvtx import NvtxRange, nvtx_wanted
from .foreign import disturbed_since, kineto_recording, mark_own, new_own_profile, profiles_state, settle_own_profile
from .spans import SpanLog, ThreadSpan, running_task
from .stopped import Outcome, StoppedTrace, decide_outcome
from ..config.model import ProfilerConfig
from ..errors import TorchstepProfWarning, warn
from ..naming import METADATA_KEY, TraceName, name_trace, range_label
from ..selection.rules import StepAction
from ..selection.step_meaning import step_meaning
from ..slow_steps.why import metadata as why_traced
from ..topology import Topology, default_group

if TYPE_CHECKING:
    from ..selection.frames import HookScope

__all__ = ["TraceSession", "entered", "new_range", "profiler_kwargs"]

INTERRUPTED_STOP = "interrupted by Ctrl-C while torch stopped the profiler, which lost what it recorded"

# ``new_range(name)``: a range for the running trace, as a context manager not yet entered.
new_range: Any
try:  # A private torch API (docs/hot-path.md, "torch's fast range"); the public one is the fallback.
    from torch._C._profiler import _RecordFunctionFast as new_range
except ImportError:  # pragma: no cover - depends on the torch build
    new_range = record_function


def entered(marker: Any) -> Any:
    """``marker`` entered; its ``__exit__`` belongs to a region's own ``__exit__``, not to a
    ``with`` here (the region's enter and exit are separate calls)."""
    marker.__enter__()
    return marker


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    return torch.cuda.is_available()


_warned_no_cuda = False


@functools.lru_cache(maxsize=32)
def profiler_kwargs(contents: tuple[str, ...]) -> dict[str, Any]:
    """torch.profiler.profile arguments for a ``contents`` selection (CPU always)."""
    global _warned_no_cuda
    activities = [ProfilerActivity.CPU]
    wants_cuda = "cuda" in contents or (not contents and _cuda_available())
    if wants_cuda and _cuda_available():
        activities.append(ProfilerActivity.CUDA)
    elif "cuda" in contents and not _warned_no_cuda:
        _warned_no_cuda = True
        warn(
            "torchstep_prof: contents asks for 'cuda' but CUDA is not available; recording CPU only",
            TorchstepProfWarning,
        )
    return {
        "activities": activities,
        "record_shapes": "shapes" in contents,
        "profile_memory": "memory" in contents,
        "with_stack": "stack" in contents,
        "with_flops": "flops" in contents,
        "with_modules": "modules" in contents,
    }


class TraceSession:
    """The live profiler window of one owned trace (a discrete region, or a fused ``step``
    block); :meth:`stop` ends it and leaves :attr:`stopped`."""

    def __init__(
        self,
        *,
        config: ProfilerConfig,
        role: Optional[str],
        stage: Optional[str],
        step: int,
        action: StepAction,
        topology: Topology,
        hook_scope: Optional[HookScope],
    ) -> None:
        self.config = config
        self.fused = role is None  # a step block owns it; regions inside add their roles
        self.owner_role = role
        self.owner_stage = stage
        self.owner_range: Optional[str] = None  # the owning region's range name, once started
        self.step = step
        self.keep = action is StepAction.RECORD  # a warm-up window records, never kept
        self.topology = topology
        self.hook_scope = hook_scope
        self.roles: list[str] = [] if role is None else [role]
        # The k-th trace of this (role, stage) in this step of the process (docs/scopes-and-regions.md,
        # occurrences), and, for a region that owns it, the step block it was entered in,
        # whether it was still open when that block ended, and the steps that began while it was
        # (set by the engine).
        self.occurrence = 1
        self.step_block: Any = None
        self.left_open = False
        self.holds_ctrl_c = False  # the main thread started it: see interrupts.py
        self.later_steps: list[int] = []
        # Regions of the owner's thread and asyncio task are torch ranges; any other thread's or
        # task's are spans (torch's ranges are per thread and must nest; tasks interleave).
        self.owner_thread = threading.get_ident()
        self.owner_task = running_task()
        self.started_at = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = 0.0
        self.start_s = 0.0
        self._profile: Optional[Profile] = None
        self._profiles_at_start: tuple[Any, ...] = ()  # foreign.profiles_state() once started
        self._ranges = contextlib.ExitStack()
        # contents("nvtx"): regions also push NVTX ranges (nvtx.py); contents("memory_snapshot"):
        # the CUDA allocator's history of this window (memory_history.py), handed to the writer.
        self.nvtx = nvtx_wanted(config.contents)
        self.memory_history = MemoryHistory.wanted(config.contents)
        # Other threads' and tasks' regions; also guards ``roles``, frozen when the trace stops
        # (a role added later is in neither the file name nor the metadata).
        self.spans = SpanLog(self.owner_thread, self.roles)
        self.stopped: Optional[StoppedTrace] = None  # the trace's record, once stopped

    def owns_here(self) -> bool:
        """Whether a region entered here may be a torch range: in the owner's thread and task."""
        return self.owner_thread == threading.get_ident() and self.owner_task is running_task()

    def span(self, name: str, role: str) -> Union[ThreadSpan, NvtxRange]:
        """A region's span in this trace (for a region outside the owner's thread or task); a
        fused trace takes its role when the span opens, as long as the trace records. With
        ``nvtx``, inside an NVTX range (pushed in that thread)."""
        span = ThreadSpan(self.spans, name, role if self.fused else None)
        return NvtxRange(name, span, nested=False) if self.nvtx else span

    def add_role(self, role: str) -> None:
        """A region of the owner's thread and task entered a fused trace."""
        if role not in self.roles:
            self.spans.add_role(role)  # any label names a file (naming.py): nothing to check

    def identity(self) -> tuple[TraceName, tuple[str, ...]]:
        """The trace's name and its roles as file names write them (see naming.py)."""
        return name_trace(
            owner=None if self.fused else (self.owner_role or "", self.owner_stage or ""),
            roles=self.roles,
            process_role=self.config.process_role,
            step=self.step,
            rank=self.topology.rank,
            world_size=self.topology.world_size,
            pid=os.getpid(),
            timestamp=self.started_at,
            gzip=self.config.gzip,
        )

    def record_unwritten(self, error: str) -> None:
        """This trace has no file (the profiler failed to start, it was still recording in
        another thread at exit): a row of the summary, labelled as its file would have been."""
        from ..summary.records import STORE

        STORE.add_trace(self._record(decide_outcome(kept=self.keep, lost=error)).unwritten_row())

    # --- the window -------------------------------------------------------------------------

    def start(self) -> None:
        """Start torch's profiler and open the step and owner ranges. Raises if torch fails."""
        t0 = time.perf_counter()
        prof = new_own_profile(**profiler_kwargs(self.config.contents))
        if self.memory_history is not None:
            self.memory_history.start()
        try:
            prof.start()
        except BaseException:  # a Ctrl-C inside torch's start: none of it may stay on
            settle_own_profile(prof, stopping=False)
            if self.memory_history is not None:
                self.memory_history.stop(take=False)
            raise
        mark_own(prof)
        self._profile = prof
        try:
            # The row torch's own schedule writes per step: HTA and others find iterations by it.
            step_range = f"ProfilerStep#{self.step}"
            self._ranges.enter_context(self._with_nvtx(step_range, record_function(step_range)))
            if not self.fused:
                self.owner_range = range_label(f"{self.owner_role}/{self.owner_stage}")
                self._ranges.enter_context(self._with_nvtx(self.owner_range, new_range(self.owner_range)))
        except BaseException:
            self._ranges.close()
            prof.stop()
            if self.memory_history is not None:
                self.memory_history.stop(take=False)
            self._profile = None
            raise
        self._profiles_at_start = profiles_state()
        now = time.perf_counter()
        self.start_s = now - t0
        self._t0 = now

    def _with_nvtx(self, name: str, marker: Any) -> Any:
        return NvtxRange(name, marker) if self.nvtx else marker

    def stop(self) -> None:
        """Close the ranges, attach the metadata, stop torch's profiler (always: also when a
        step of this raises, with the metadata attached all the same), and leave the trace's
        record in :attr:`stopped`, its outcome decided (also when torch's stop raised)."""
        t0 = time.perf_counter()
        wall_s = t0 - self._t0
        prof = self._profile
        settled = prof is None  # torch's profiler stopped, or left to the user's that took it over
        described = False  # the metadata is attached
        lost: Optional[str] = None  # why the trace cannot be written (another profiler)
        failed: Optional[str] = None  # why torch's stop left nothing to export
        try:
            self.spans.stop()  # before the metadata: the roles it names are final from here on
            if prof is not None and not kineto_recording():
                # A user's profiler opened and closed inside this trace ended our Kineto session
                # too ("stopping either turns both off"): stopping or exporting now would crash.
                settled = True
                lost = "another torch profiler started and stopped inside it, which ended its recording"
                with contextlib.suppress(Exception):
                    self._ranges.close()  # ending a range after Kineto stopped is harmless
                return
            disturbed = disturbed_since(self._profiles_at_start) if prof is not None else None
            if disturbed is not None:
                # Theirs prepared or started Kineto under ours (a scheduled profile's step() into
                # its warm-up, one opened inside ours): our session is no longer Kineto's, and
                # exporting it crashes (rc 139). Never export it; stop it only if theirs does not
                # record yet (stopping either ends both: their export would crash instead).
                settled = True
                reason, theirs_records = disturbed
                lost = f"{reason} and took over its recording"
                with contextlib.suppress(Exception):
                    self._ranges.close()
                if not theirs_records and prof is not None:
                    with contextlib.suppress(Exception):
                        prof.stop()
                return
            self._ranges.close()
            if prof is not None and self.keep:
                self._add_metadata(prof)
                described = True
        finally:
            snapshot: Optional[dict[str, Any]] = None
            try:
                if prof is not None and not settled:
                    try:
                        if self.keep and not described:
                            # A Ctrl-C landed before the metadata was attached: the file must
                            # still say whose trace it is (attaching a key again replaces it).
                            self._ranges.close()
                            self._add_metadata(prof)
                    finally:
                        try:
                            prof.stop()
                        except BaseException as exc:
                            # A Ctrl-C (or a failure) inside torch's stop, which takes seconds for
                            # a big trace: finish stopping, so that the next region profiles, then
                            # propagate. What survived is written; what torch lost is the trace's
                            # recorded failure, not a silent gap.
                            if not settle_own_profile(prof, stopping=True):
                                failed = (
                                    INTERRUPTED_STOP
                                    if isinstance(exc, KeyboardInterrupt)
                                    else f"torch's stop failed: {exc!r}"
                                )
                            raise
            finally:
                if self.memory_history is not None:
                    # After torch's stop (which must happen whatever this does); never raises.
                    # The history is cleared either way, so the next window starts empty.
                    snapshot = self.memory_history.stop(take=self.keep and lost is None)
                outcome = decide_outcome(kept=self.keep, lost=lost, failed=failed)
                results, self._profile = self._profile, None  # the record holds them from here on
                self.stopped = self._record(outcome, wall_s, time.perf_counter() - t0, results, snapshot)

    def _record(
        self,
        outcome: tuple[Outcome, Optional[str]],
        wall_s: float = 0.0,
        stop_s: float = 0.0,
        results: Optional[Profile] = None,
        snapshot: Optional[dict[str, Any]] = None,
    ) -> StoppedTrace:
        """The frozen record of this trace (``outcome`` from :func:`decide_outcome`)."""
        name, roles = self.identity()
        return StoppedTrace(
            name=name,
            roles=roles,
            discrete=not self.fused,
            occurrence=self.occurrence,
            save_path=self.config.save_path,
            outcome=outcome[0],
            reason=outcome[1],
            kept=self.keep,
            wall_s=wall_s,
            start_s=self.start_s,
            stop_s=stop_s,
            results=results,
            spans=self.spans,
            owner_range=self.owner_range,
            process_role=self.config.process_role,
            records_cuda=ProfilerActivity.CUDA in profiler_kwargs(self.config.contents)["activities"],
            memory_snapshot=snapshot,
            hook_scope=self.hook_scope,
            left_open=self.left_open,
            later_steps=tuple(self.later_steps),
        )

    def _add_metadata(self, prof: Profile) -> None:
        rank, world = self.topology.rank, self.topology.world_size
        if default_group() is None:
            # torch writes distributedInfo only with a process group; HTA reads the rank there.
            prof.add_metadata_json("distributedInfo", json.dumps({"rank": rank, "world_size": world}))
        name, _ = self.identity()
        metadata = {
            "role": name.role,
            "stage": name.stage,
            "step": self.step,
            "occurrence": self.occurrence,
            "rank": rank,
            "world_size": world,
            "pid": os.getpid(),
            "discrete": not self.fused,
            **step_meaning(self.step),
            **why_traced(self.step),  # auto_trace: the slowdown this trace was taken for
        }
        # Labels are sanitized (ASCII, no quotes or backslashes): torch writes this unescaped.
        prof.add_metadata_json(METADATA_KEY, json.dumps(metadata))
