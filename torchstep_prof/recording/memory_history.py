"""The CUDA allocator's history over one trace window, for ``contents("memory_snapshot")``.

While a selected step's trace records, torch's caching allocator records every allocation and
free with its Python stack (``torch.cuda.memory._record_memory_history``). At the window's end
the history is taken as a snapshot (the dict PyTorch's memory viz reads, pickled by the writer
next to the trace) and recording stops with the history cleared, so each snapshot holds its own
window only. Only Python stacks are kept: with C++ stacks (``stacks="all"``) taking a snapshot
has been seen to take minutes. At most :data:`MAX_ENTRIES` events are kept (the latest), which
bounds the snapshot; the writer also refuses one past a byte limit
(:mod:`~torchstep_prof.writing.memory_snapshot`). Without CUDA: one warning, no snapshots.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Optional

import torch

from ..errors import warn_once

__all__ = ["CONTENT", "MAX_ENTRIES", "MemoryHistory"]

CONTENT = "memory_snapshot"
MAX_ENTRIES = 50_000
"""Allocator events kept per window (the latest; torch's ring buffer drops older ones)."""

_warned: set[str] = set()


@functools.lru_cache(maxsize=1)
def _clears_on_stop() -> bool:
    """Whether this torch's ``_record_memory_history`` takes ``clear_history`` (else stopping
    is what clears it)."""
    try:
        return "clear_history" in inspect.signature(torch.cuda.memory._record_memory_history).parameters
    except (TypeError, ValueError):  # pragma: no cover - a C function without a signature
        return False


class MemoryHistory:
    """Recording of the allocator's history for one trace window (one object per window).

    >>> history = MemoryHistory.wanted(("cpu", "memory_snapshot"))  # doctest: +SKIP
    >>> history.start(); ...; snapshot = history.stop(take=True)     # doctest: +SKIP
    """

    __slots__ = ("_recording",)

    def __init__(self) -> None:
        self._recording = False

    @classmethod
    def wanted(cls, contents: tuple[str, ...]) -> Optional[MemoryHistory]:
        """A recorder when ``contents`` asks for ``memory_snapshot`` and CUDA is available; None
        otherwise (with one warning per process when it is asked for without CUDA)."""
        if CONTENT not in contents:
            return None
        if not torch.cuda.is_available():
            warn_once(
                _warned,
                "no-cuda",
                "torchstep_prof: contents asks for 'memory_snapshot' but CUDA is not available; "
                "no memory snapshots are written",
            )
            return None
        return cls()

    def start(self) -> None:
        """Start recording (a failure is one warning: the trace still records)."""
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=MAX_ENTRIES
            )
            self._recording = True
        except Exception as exc:
            warn_once(
                _warned, "start", f"torchstep_prof: cannot record the CUDA allocator's history ({exc!r}); no snapshot"
            )

    def stop(self, *, take: bool) -> Optional[dict[str, Any]]:
        """Stop recording and clear the history; with ``take``, the snapshot first (None when
        nothing was recorded or taking it failed). Never raises an ``Exception``."""
        if not self._recording:
            return None
        self._recording = False
        snapshot = None
        try:
            if take:
                snapshot = torch.cuda.memory._snapshot()
        except Exception as exc:
            warn_once(_warned, "take", f"torchstep_prof: cannot take the CUDA memory snapshot ({exc!r})")
        try:
            if _clears_on_stop():
                torch.cuda.memory._record_memory_history(enabled=None, clear_history=True)
            else:  # pragma: no cover - older torch: stopping drops the history
                torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as exc:
            warn_once(_warned, "stop", f"torchstep_prof: cannot stop the CUDA allocator's history ({exc!r})")
        return snapshot
