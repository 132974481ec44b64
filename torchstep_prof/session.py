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
import warnings
from typing import Any, Optional

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from .config import ProfilerConfig
from .errors import TorchstepProfWarning
from .naming import range_label, sanitize_label
from .selection import StepAction
from .topology import Topology, distributed_initialized

__all__ = ["TraceSession", "open_range", "profiler_kwargs"]

FUSED_STAGE = "train"
FUSED_DEFAULT_ROLE = "main"
METADATA_KEY = "torchstep_prof"

try:  # A private torch API, ~10x cheaper than record_function; the public one is the fallback.
    from torch._C._profiler import _RecordFunctionFast as _FastRange
except ImportError:  # pragma: no cover - depends on the torch build
    _FastRange = None


new_range: Any = _FastRange if _FastRange is not None else record_function
"""``new_range(name)``: a range for the running trace, as a context manager not yet entered."""


class GuardedRange:
    """A range for a region of another thread than the trace's owner.

    That thread may enter its range just as the owner stops the trace and leave it after the next
    trace started: torch then raises ``self->guard INTERNAL ASSERT FAILED`` from the range's exit.
    Nothing was recorded for it either way, so the exit swallows that one error.
    """

    __slots__ = ("_marker",)

    def __init__(self, name: str) -> None:
        self._marker = new_range(name)

    def __enter__(self) -> GuardedRange:
        self._marker.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self._marker.__exit__(None, None, None)
        except RuntimeError:
            pass


def open_range(name: str) -> Any:
    """An entered range named ``name``; call its ``__exit__`` to close it."""
    marker = new_range(name)
    # Entered by hand: its exit belongs to a region's own __exit__, not to a `with` here.
    marker.__enter__()
    return marker


@functools.lru_cache(maxsize=1)
def _cuda_available() -> bool:
    return torch.cuda.is_available()


_warned_no_cuda = False


@functools.lru_cache(maxsize=32)
def profiler_kwargs(contents: tuple[str, ...], all_threads: bool = False) -> dict[str, Any]:
    """torch.profiler.profile arguments for a ``contents`` selection (CPU always); with
    ``all_threads``, every thread's events (see ``other_threads_running``)."""
    global _warned_no_cuda
    activities = [ProfilerActivity.CPU]
    wants_cuda = "cuda" in contents or (not contents and _cuda_available())
    if wants_cuda and _cuda_available():
        activities.append(ProfilerActivity.CUDA)
    elif "cuda" in contents and not _warned_no_cuda:
        _warned_no_cuda = True
        warnings.warn(
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
    # torch 2.13 records no [memory] events under profile_all_threads: with "memory", memory
    # wins, and ranges of regions in other threads go unrecorded in such traces.
    experimental = _all_threads_config() if all_threads and not kwargs["profile_memory"] else None
    if experimental is not None:
        kwargs["experimental_config"] = experimental
    return kwargs


HELPER_THREAD_PREFIX = "torchstep_prof-"


def other_threads_running() -> bool:
    """Whether a Python thread besides this one (and our own helpers) is alive.

    torch's ``profile_all_threads`` is what puts other threads' ranges into a trace, but it
    costs ~10% on a small step: a process with one Python thread goes without it.
    """
    current = threading.current_thread()
    return any(
        thread is not current and not thread.name.startswith(HELPER_THREAD_PREFIX)
        for thread in threading.enumerate()
    )


def _all_threads_config() -> Any:
    # Without it Kineto records only the thread that started the profiler: a region entered in
    # another thread while a trace is recorded would silently vanish from it.
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # pragma: no cover - older torch
        return None


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
        all_threads: bool = True,
    ) -> None:
        self.config = config
        self.all_threads = all_threads
        self.fused = role is None  # a step block owns it; regions inside add their roles
        self.owner_role = role
        self.owner_stage = stage
        self.step = step
        self.action = action
        self.topology = topology
        self.hook_scope = hook_scope
        self.roles: list[str] = [] if role is None else [role]
        # Only the owner's thread starts and stops the profiler, so only its regions can use
        # bare torch ranges (see GuardedRange).
        self.owner_thread = threading.get_ident()
        # The common nested case in one comparison: the owner's thread, no roles to collect.
        self.plain_thread = None if self.fused else self.owner_thread
        self.started_at = _dt.datetime.now(_dt.timezone.utc)
        self._t0 = 0.0
        self.wall_s = 0.0
        self.start_s = 0.0
        self.stop_s = 0.0
        self._profile: Optional[profile] = None
        self._ranges = contextlib.ExitStack()

    # --- labels -------------------------------------------------------------------------------

    def add_role(self, role: str) -> None:
        if role not in self.roles:
            # A bad label is the region's ValueError at entry, not a lost trace at stop.
            sanitize_label(role, "role")
            self.roles.append(role)

    @property
    def file_role(self) -> str:
        if not self.fused:
            return sanitize_label(self.owner_role or "", "role")
        if self.config.process_role is not None:
            return sanitize_label(self.config.process_role, "process_role")
        labels = [sanitize_label(r, "role") for r in self.roles]
        return "-".join(dict.fromkeys(labels)) or FUSED_DEFAULT_ROLE

    @property
    def file_stage(self) -> str:
        return FUSED_STAGE if self.fused else sanitize_label(self.owner_stage or "", "stage")

    @property
    def file_roles(self) -> tuple[str, ...]:
        """The individual roles as file names write them (for the hook's environment)."""
        if self.fused and self.config.process_role is None:
            return tuple(dict.fromkeys(sanitize_label(r, "role") for r in self.roles)) or (FUSED_DEFAULT_ROLE,)
        return (self.file_role,)

    # --- the window -------------------------------------------------------------------------

    def start(self) -> None:
        """Start torch's profiler and open the step and owner ranges. Raises if torch fails."""
        t0 = time.perf_counter()
        prof = profile(**profiler_kwargs(self.config.contents, self.all_threads))
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

    def _add_metadata(self, prof: profile) -> None:
        rank, world = self.topology.rank, self.topology.world_size
        if not distributed_initialized():
            # torch writes distributedInfo only with a process group; HTA reads the rank there.
            prof.add_metadata_json("distributedInfo", json.dumps({"rank": rank, "world_size": world}))
        metadata = {
            "role": self.file_role,
            "stage": self.file_stage,
            "step": self.step,
            "rank": rank,
            "world_size": world,
            "discrete": not self.fused,
        }
        # Labels are sanitized (ASCII, no quotes or backslashes): torch writes this unescaped.
        prof.add_metadata_json(METADATA_KEY, json.dumps(metadata))
