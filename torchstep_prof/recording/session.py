"""One torch profiler window: started by the block that owns a trace, stopped when it exits.

A session holds the torch ``profile`` object, the ``ProfilerStep#<n>`` range spanning the owning
block, the owner's own ``<role>/<stage>`` range, and what the file name and metadata need.
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
from torch.profiler import profile as Profile  # (the class has a ``profile`` property)

from .memory_history import MemoryHistory
from .nvtx import NvtxRange, nvtx_wanted
from .foreign import disturbed_since, kineto_recording, mark_own, new_own_profile, profiles_state, settle_own_profile
from .spans import SpanLog, ThreadSpan, running_task
from ..config.model import ProfilerConfig
from ..errors import TorchstepProfWarning, warn
from ..traces.names import fit_label, range_label, sanitize_label
from ..selection.rules import StepAction
from ..selection.step_meaning import step_meaning
from ..slow_steps.why import metadata as why_traced
from ..topology import Topology, distributed_initialized

if TYPE_CHECKING:
    from ..summary.records import TraceRecord

__all__ = ["TraceSession", "entered", "new_range", "profiler_kwargs", "records_cuda"]

FUSED_STAGE = "train"
FUSED_DEFAULT_ROLE = "main"
_MAX_FUSED_ROLE = 100  # with a stage of at most 80 (traces/names.py MAX_LABEL): under 255 bytes
METADATA_KEY = "torchstep_prof"
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


def records_cuda(contents: tuple[str, ...]) -> bool:
    """Whether traces recorded with ``contents`` hold CUDA activity (kernels)."""
    return ProfilerActivity.CUDA in profiler_kwargs(contents)["activities"]


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
    kwargs: dict[str, Any] = {
        "activities": activities,
        "record_shapes": "shapes" in contents,
        "profile_memory": "memory" in contents,
        "with_stack": "stack" in contents,
        "with_flops": "flops" in contents,
        "with_modules": "modules" in contents,
    }
    return kwargs


class TraceSession:
    """The profiler window of one owned trace (a discrete region, or a fused ``step`` block)."""

    def __init__(
        self,
        *,
        config: ProfilerConfig,
        role: Optional[str],
        stage: Optional[str],
        step: int,
        action: StepAction,
        topology: Topology,
        hook_scope: Any,
    ) -> None:
        self.config = config
        self.fused = role is None  # a step block owns it; regions inside add their roles
        self.owner_role = role
        self.owner_stage = stage
        self.owner_range: Optional[str] = None  # the owning region's range name, once started
        self.step = step
        self.action = action
        self.topology = topology
        self.hook_scope = hook_scope
        self.roles: list[str] = [] if role is None else [role]
        # The k-th trace of this (role, stage) in this step of the process (SPEC: Occurrences),
        # and, for a region that owns it, the step block it was entered in, whether it was still
        # open when that block ended, and the steps that began while it was (set by the engine).
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
        # Until the writer reads the file's ProfilerStep range (the one wall time: see
        # writing/range_marks.py), the block's time as this session measured it.
        self.wall_s = 0.0
        self.start_s = 0.0
        self.stop_s = 0.0
        self._profile: Optional[Profile] = None
        self._profiles_at_start: tuple[Any, ...] = ()  # foreign.profiles_state() once started
        self.lost: Optional[str] = None  # why the trace cannot be written (another profiler)
        # Why torch's stop left nothing to export (the writer records it as the trace's failure).
        self.no_output: Optional[str] = None
        self._ranges = contextlib.ExitStack()
        # contents("nvtx"): regions also push NVTX ranges (nvtx.py); contents("memory_snapshot"):
        # the CUDA allocator's history of this window (memory_history.py), handed to the writer.
        self.nvtx = nvtx_wanted(config.contents)
        self.memory_history = MemoryHistory.wanted(config.contents)
        self.memory_snapshot: Optional[dict[str, Any]] = None
        # Other threads' and tasks' regions; also guards ``roles``, frozen when the trace stops
        # (a role added later is in neither the file name nor the metadata).
        self.spans = SpanLog(self.owner_thread, self.roles)

    def owns_here(self) -> bool:
        """Whether a region entered here may be a torch range: in the owner's thread and task."""
        return self.owner_thread == threading.get_ident() and self.owner_task is running_task()

    def span(self, name: str, role: str) -> Union[ThreadSpan, NvtxRange]:
        """A region's span in this trace (for a region outside the owner's thread or task); a
        fused trace takes its role when the span opens, as long as the trace records. With
        ``nvtx``, inside an NVTX range (pushed in that thread)."""
        if self.fused:
            span = ThreadSpan(self.spans, name, role)
        else:
            span = ThreadSpan(self.spans, name)
        return NvtxRange(name, span, nested=False) if self.nvtx else span

    # --- labels -------------------------------------------------------------------------------

    def add_role(self, role: str) -> None:
        """A region of the owner's thread and task entered a fused trace."""
        if role not in self.roles:
            self.spans.add_role(role)  # any label names a file (traces/names.py): nothing to check

    @property
    def file_role(self) -> str:
        if not self.fused:
            return fit_label(sanitize_label(self.owner_role or "", "role"))
        if self.config.process_role is not None:
            return fit_label(sanitize_label(self.config.process_role, "process_role"))
        labels = list(dict.fromkeys(fit_label(sanitize_label(r, "role")) for r in self.roles))
        joined = "-".join(labels)
        if len(joined) > _MAX_FUSED_ROLE:
            # File names are limited to 255 bytes: keep the first roles, count the rest.
            kept: list[str] = []
            while labels and len("-".join(kept + labels[:1])) <= _MAX_FUSED_ROLE - 6:
                kept.append(labels.pop(0))
            joined = "-".join(kept) + f"+{len(labels)}-more"
        return joined or FUSED_DEFAULT_ROLE

    @property
    def file_stage(self) -> str:
        return FUSED_STAGE if self.fused else fit_label(sanitize_label(self.owner_stage or "", "stage"))

    @property
    def file_roles(self) -> tuple[str, ...]:
        """The individual roles as file names write them (for the hook's environment)."""
        if self.fused and self.config.process_role is None:
            return tuple(dict.fromkeys(fit_label(sanitize_label(r, "role")) for r in self.roles)) or (
                FUSED_DEFAULT_ROLE,
            )
        return (self.file_role,)

    def record_unwritten(self, error: str) -> None:
        """This trace has no file (the profiler failed to start, another profiler ended it, it
        was still recording in another thread at exit): a row of the summary, labelled as its
        file would have been."""
        from ..summary.records import STORE, TraceRecord

        STORE.add_trace(
            TraceRecord(
                role=self.file_role,
                stage=self.file_stage,
                step=self.step,
                rank=self.topology.rank,
                world_size=self.topology.world_size,
                discrete=not self.fused,
                path=None,
                occurrence=self.occurrence,
                error=error,
            )
        )

    def report_left_open(self, record: TraceRecord) -> None:
        """This trace's owning region stayed open after its step ended (a generator suspended
        inside it): the summary says so, naming the trace later steps' work landed in."""
        from ..summary.records import STORE

        where = record.path if record.path is not None else f"a trace not written ({record.error})"
        later = f"; step(s) {', '.join(map(str, self.later_steps))} ran inside it" if self.later_steps else ""
        STORE.add_attention(
            f"left-open:{id(self)}",
            f"region {record.role}/{record.stage} of step {self.step} stayed open after its step "
            f"ended (a suspended generator?){later}: what ran meanwhile landed in its trace {where}",
        )

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
        step of this raises, with the metadata attached all the same)."""
        t0 = time.perf_counter()
        self.wall_s = t0 - self._t0
        prof = self._profile
        settled = prof is None  # torch's profiler stopped, or left to the user's that took it over
        described = False  # the metadata is attached
        try:
            self.spans.stop()  # before the metadata: the roles it names are final from here on
            if prof is not None and not kineto_recording():
                # A user's profiler opened and closed inside this trace ended our Kineto session
                # too ("stopping either turns both off"): stopping or exporting now would crash.
                settled = True
                self.lost = "another torch profiler started and stopped inside it, which ended its recording"
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
                self.lost = f"{reason} and took over its recording"
                with contextlib.suppress(Exception):
                    self._ranges.close()
                if not theirs_records and prof is not None:
                    with contextlib.suppress(Exception):
                        prof.stop()
                return
            self._ranges.close()
            if prof is not None and self.action is StepAction.RECORD:
                self._add_metadata(prof)
                described = True
        finally:
            try:
                if prof is not None and not settled:
                    try:
                        if self.action is StepAction.RECORD and not described:
                            # A Ctrl-C landed before the metadata was attached: the file must
                            # still say whose trace it is (attaching a key again replaces it).
                            self._ranges.close()
                            self._add_metadata(prof)
                    finally:
                        self._stop_torch(prof)
            finally:
                if self.memory_history is not None:
                    # After torch's stop (which must happen whatever this does); never raises.
                    # The history is cleared either way, so the next window starts empty.
                    take = self.action is StepAction.RECORD and self.lost is None
                    self.memory_snapshot = self.memory_history.stop(take=take)
                self.stop_s = time.perf_counter() - t0

    def _stop_torch(self, prof: Profile) -> None:
        try:
            prof.stop()
        except BaseException as exc:
            # A Ctrl-C (or a failure) inside torch's stop, which takes seconds for a big trace:
            # finish stopping, so that the next region profiles, then propagate. What survived
            # is written; what torch lost is the trace's recorded failure, not a silent gap.
            if not settle_own_profile(prof, stopping=True):
                self.no_output = (
                    INTERRUPTED_STOP if isinstance(exc, KeyboardInterrupt) else f"torch's stop failed: {exc!r}"
                )
            raise

    @property
    def profile(self) -> Optional[Profile]:
        return self._profile

    def release(self) -> None:
        """Drop torch's results once the trace is written or failed: they hold every event,
        and, after a failed export (a full disk), torch's ``.tmp`` file open, so its space
        would stay taken until a garbage collection found the profile object."""
        prof, self._profile = self._profile, None
        self.memory_snapshot = None
        inner = getattr(prof, "profiler", None)
        if inner is not None and hasattr(inner, "kineto_results"):
            inner.kineto_results = None

    def _add_metadata(self, prof: Profile) -> None:
        rank, world = self.topology.rank, self.topology.world_size
        if not distributed_initialized():
            # torch writes distributedInfo only with a process group; HTA reads the rank there.
            prof.add_metadata_json("distributedInfo", json.dumps({"rank": rank, "world_size": world}))
        metadata = {
            "role": self.file_role,
            "stage": self.file_stage,
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
