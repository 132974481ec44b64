"""What the training thread is doing now, seen from another thread: its Python stack and its collective.

``sys._current_frames()`` gives every thread's innermost frame; reading it costs the training
thread nothing, and works while that thread waits in a collective (gloo's and NCCL's waits
release the GIL). A frame of ``torch/distributed/distributed_c10d.py`` on the stack names the
collective (the outermost such frame: the function the user's code called), and the default
process group's sequence number (``_get_sequence_number_for_group``, which gloo and NCCL keep
without the profiler) is its ordinal: the n-th collective of the job's world group. The
status thread calls this; it imports nothing from torch that the job has not imported.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import FrameType
from typing import Any, Optional

__all__ = ["MAX_FRAMES", "collective_of", "frames_of", "sequence_number", "user_frame"]

MAX_FRAMES = 64
"""The innermost frames of a stack kept in a status (the outermost of a deep one are dropped)."""
_MAX_TEXT = 300  # a source line or a name in a status, at most
_C10D = os.path.join("torch", "distributed", "distributed_c10d.py")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_PARTS = (os.sep + os.path.join("site-packages", "torch") + os.sep, os.sep + "torch" + os.sep)
_STDLIB = os.path.dirname(os.__file__)


def frames_of(ident: int) -> list[FrameType]:
    """Thread ``ident``'s frames, outermost first (empty when it has ended)."""
    frame = sys._current_frames().get(ident)
    found: list[FrameType] = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    found.reverse()
    return found


def stack_lines(frames: list[FrameType]) -> list[dict[str, Any]]:
    """``{"file", "line", "function", "code"}`` for the innermost :data:`MAX_FRAMES` frames,
    outermost first (the source text from linecache: files the job has read already)."""
    lines = []
    for frame in frames[-MAX_FRAMES:]:
        code = frame.f_code
        number = frame.f_lineno or 0
        text = linecache.getline(code.co_filename, number).strip()
        lines.append(
            {"file": code.co_filename[-_MAX_TEXT:], "line": number, "function": code.co_name[:_MAX_TEXT],
             "code": text[:_MAX_TEXT]}
        )  # fmt: skip
    return lines


def collective_of(frames: list[FrameType]) -> Optional[str]:
    """The collective the stack is inside (its outermost ``distributed_c10d`` function), or None."""
    for frame in frames:
        if frame.f_code.co_filename.endswith(_C10D):
            name = frame.f_code.co_name
            return None if name.startswith("_") or name == "<module>" else name
    return None


def user_frame(frames: list[FrameType]) -> Optional[FrameType]:
    """The innermost frame of the user's code: not torch's, not this package's, not the
    standard library's (``train.py:42 in update``)."""
    for frame in reversed(frames):
        path = frame.f_code.co_filename
        if path.startswith(_PACKAGE) or path.startswith("<"):
            continue
        if path.startswith(_STDLIB) and "-packages" not in path:  # an installed framework is the user's code
            continue
        if any(part in path for part in _TORCH_PARTS):
            continue
        return frame
    return None


def sequence_number() -> Optional[int]:
    """The default process group's collective count (the ordinal of the one in flight), or
    None without one (no torch.distributed, not initialized, or a backend that keeps none)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world = getattr(c10d, "_world", None)
    group = getattr(world, "_default_pg", None)
    if group is None:
        return None
    try:
        number = group._get_sequence_number_for_group()
    except Exception:  # a backend without sequence numbers, or a group being torn down
        return None
    return number if isinstance(number, int) else None
