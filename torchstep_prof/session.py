"""One torch profiler window: started by the block that owns a trace, stopped when it exits.

A session holds the torch ``profile`` object, the ``ProfilerStep#<n>`` range spanning the owning
block, the owner's own ``<role>/<stage>`` range, and what the file name and metadata need.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import threading
import time
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .config import ProfilerConfig
from .errors import TorchstepProfWarning, warn
from .naming import fit_label, range_label, sanitize_label
from .selection import StepAction
from .topology import Topology, distributed_initialized

__all__ = ["NESTED_FAST_PATH", "ThreadSpan", "TraceSession", "entered", "new_range", "profiler_kwargs"]

FUSED_STAGE = "train"
FUSED_DEFAULT_ROLE = "main"
_MAX_FUSED_ROLE = 100  # with a stage of at most 80 (naming.MAX_LABEL): under 255 bytes
METADATA_KEY = "torchstep_prof"

try:  # A private torch API, ~10x cheaper than record_function; the public one is the fallback.
    from torch._C._profiler import _RecordFunctionFast as _FastRange
except ImportError:  # pragma: no cover - depends on the torch build
    _FastRange = None


new_range: Any = _FastRange if _FastRange is not None else record_function
"""``new_range(name)``: a range for the running trace, as a context manager not yet entered."""


class NestedFastPath:
    """Where a region may skip every check and be a bare torch range: under ``frame`` (the
    owner's scopes, inside its step block) in ``thread`` (the owner's), while a discrete trace
    records. Set by the engine when it publishes such a trace, cleared before it stops."""

    __slots__ = ("frame", "thread")

    def __init__(self) -> None:
        self.frame: Any = None
        self.thread: Optional[int] = None


NESTED_FAST_PATH = NestedFastPath()


class ThreadSpan:
    """A region of another thread than the trace's owner, while the trace records.

    torch records other threads only under its ``profile_all_threads`` option, which costs ~10%
    on a small step, drops memory events, and crashes when threads open ranges while the
    profiler stops. So such regions are timed here and written into the trace at export, as
    ``user_annotation`` events on their own thread's track.
    """

    __slots__ = ("_session", "_name")

    def __init__(self, session: TraceSession, name: str) -> None:
        self._session = session
        self._name = name

    def __enter__(self) -> ThreadSpan:
        self._session.open_span(self, self._name, threading.get_native_id(), time.time_ns())
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._session.close_span(self, time.time_ns())


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
        self.later_steps: list[int] = []
        # Regions of the owner's thread are torch ranges; other threads' are ThreadSpans.
        self.owner_thread = threading.get_ident()
        self.started_at = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = 0.0
        self.wall_s = 0.0
        self.start_s = 0.0
        self.stop_s = 0.0
        self._profile: Optional[profile] = None
        self._ranges = contextlib.ExitStack()
        self._spans: list[tuple[str, int, int, int]] = []  # other threads' regions (ThreadSpan)
        self._open_spans: dict[Any, tuple[str, int, int]] = {}
        self._spans_lock = threading.Lock()
        self._stopped = False

    def open_span(self, key: Any, name: str, native_tid: int, start_ns: int) -> None:
        """A region of another thread began (see ThreadSpan)."""
        with self._spans_lock:
            if not self._stopped:
                self._open_spans[key] = (name, native_tid, start_ns)

    def close_span(self, key: Any, end_ns: int) -> None:
        """It ended; one still open when the trace stops is cut off there, as torch does."""
        with self._spans_lock:
            opened = self._open_spans.pop(key, None)
            if opened is not None and not self._stopped:
                self._spans.append((*opened, end_ns))

    @property
    def spans(self) -> list[tuple[str, int, int, int]]:
        """Other threads' regions: (range name, native thread id, start and end in epoch ns)."""
        return self._spans

    # --- labels -------------------------------------------------------------------------------

    def add_role(self, role: str) -> None:
        if role not in self.roles:
            # A bad label is the region's ValueError at entry, not a lost trace at stop.
            sanitize_label(role, "role")
            self.roles.append(role)

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

    # --- the window -------------------------------------------------------------------------

    def start(self) -> None:
        """Start torch's profiler and open the step and owner ranges. Raises if torch fails."""
        t0 = time.perf_counter()
        prof = profile(**profiler_kwargs(self.config.contents))
        prof.start()
        self._profile = prof
        try:
            # The row torch's own schedule writes per step: HTA and others find iterations by it.
            self._ranges.enter_context(record_function(f"ProfilerStep#{self.step}"))
            if not self.fused:
                name = range_label(f"{self.owner_role}/{self.owner_stage}")
                self._ranges.enter_context(new_range(name))
        except BaseException:
            self._ranges.close()
            prof.stop()
            self._profile = None
            raise
        now = time.perf_counter()
        self.start_s = now - t0
        self._t0 = now

    def stop(self) -> None:
        """Close the ranges, attach the metadata, stop torch's profiler (always, even on error)."""
        t0 = time.perf_counter()
        self.wall_s = t0 - self._t0
        prof = self._profile
        with self._spans_lock:
            self._stopped = True
            stop_ns = time.time_ns()
            self._spans.extend((*opened, stop_ns) for opened in self._open_spans.values())
            self._open_spans.clear()
        try:
            self._ranges.close()
            if prof is not None and self.action is StepAction.RECORD:
                self._add_metadata(prof)
        finally:
            if prof is not None:
                prof.stop()
            self.stop_s = time.perf_counter() - t0

    @property
    def profile(self) -> Optional[profile]:
        return self._profile

    def release(self) -> None:
        """Drop torch's results once the trace is written or failed: they hold every event,
        and, after a failed export (a full disk), torch's ``.tmp`` file open, so its space
        would stay taken until a garbage collection found the profile object."""
        prof, self._profile = self._profile, None
        inner = getattr(prof, "profiler", None)
        if inner is not None and hasattr(inner, "kineto_results"):
            inner.kineto_results = None

    def _add_metadata(self, prof: profile) -> None:
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
            "discrete": not self.fused,
        }
        # Labels are sanitized (ASCII, no quotes or backslashes): torch writes this unescaped.
        prof.add_metadata_json(METADATA_KEY, json.dumps(metadata))
