"""Each rank's live status file: its names, what it holds, and reading it back (no torch here).

The job's status thread writes ``live-rank<R>.json`` (``live-rank<R>-<role>.json`` with a
``process_role``, the role written as in trace file names) every poll; a stalled rank writes
``stall-rank<R>.txt`` (``stall-rank<R>-<role>.txt``) once. ``torchstep-prof status`` reads them.
Anyone who can write the folder can write a status file, so reading one checks every field's
type and range, and what is printed of it is escaped by the command.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import attrs

from .._shared_files import read_each
from ..triggers.status import in_range, read_status_json, role_suffix

__all__ = [
    "MAX_LIVE_BYTES", "MAX_LIVE_FILES", "LiveStatus", "OpenEntry", "live_path", "read_live", "read_lives", "stall_path",
]  # fmt: skip

MAX_LIVE_BYTES = 256 * 1024
"""The largest live status file read (one holds at most 64 frames and 64 regions of bounded text)."""
MAX_LIVE_FILES = 4096
"""The most live status files ``status`` reads in one folder (one per rank and role)."""
_MAX_ENTRIES = 64
_MAX_TEXT = 300


def live_path(folder: str, rank: int, role: Optional[str] = None) -> str:
    """Where rank ``rank`` (of process role ``role``) keeps its live status.

    >>> live_path("/d", 3), live_path("/d", 0, "actor")
    ('/d/live-rank3.json', '/d/live-rank0-actor.json')
    """
    return os.path.join(folder, f"live-rank{rank}{role_suffix(role)}.json")


def stall_path(folder: str, rank: int, role: Optional[str] = None) -> str:
    """Where a stalled rank writes its status and stack, once.

    >>> stall_path("/d", 1)
    '/d/stall-rank1.txt'
    """
    return os.path.join(folder, f"stall-rank{rank}{role_suffix(role)}.txt")


@attrs.frozen(kw_only=True)
class OpenEntry:
    """One open region: ``role/stage``, entered at ``since`` (seconds since the epoch)."""

    role: str
    stage: str
    since: float


@attrs.frozen(kw_only=True)
class LiveStatus:
    """What one rank last wrote. ``time``: when (seconds since the epoch); ``step`` and
    ``step_since`` (when it was first seen); ``regions``: the training thread's open regions,
    outermost first; ``collective``/``ordinal``/``collective_since``: the collective it is in;
    ``where``: its innermost line of user code; ``stack``: its Python stack, outermost first;
    ``stalled_s``: seconds without progress when the detector fired (None: not stalled)."""

    path: str
    rank: int
    world_size: Optional[int] = None
    role: Optional[str] = None
    pid: Optional[int] = None
    host: Optional[str] = None
    time: float = 0.0
    poll_s: float = 1.0
    running: bool = True
    step: Optional[int] = None
    step_since: Optional[float] = None
    regions: tuple[OpenEntry, ...] = ()
    collective: Optional[str] = None
    ordinal: Optional[int] = None
    collective_since: Optional[float] = None
    where: Optional[str] = None
    stack: tuple[dict[str, Any], ...] = ()
    stalled_s: Optional[float] = None

    @classmethod
    def from_json(cls, path: str, data: Any) -> LiveStatus:
        """A status from a decoded file; ``ValueError`` for one that is not a live status."""
        if not isinstance(data, dict) or not _is_int(data.get("rank")) or data["rank"] < 0:
            raise ValueError(f"{path}: not a live status file (no integer 'rank')")
        regions = data.get("regions")
        stack = data.get("stack")
        return cls(
            path=path,
            rank=data["rank"],
            world_size=data["world_size"] if _is_int(data.get("world_size")) and data["world_size"] > 0 else None,
            role=_text(data.get("role")),
            pid=data["pid"] if _is_int(data.get("pid")) else None,
            host=_text(data.get("host")),
            time=_number(data.get("time"), 1e12) or 0.0,
            poll_s=_number(data.get("poll_s"), 3600.0) or 1.0,
            running=data.get("running") is not False,
            step=data["step"] if _is_int(data.get("step")) and 0 <= data["step"] <= 2**53 else None,
            step_since=_number(data.get("step_since"), 1e12),
            regions=tuple(_entries(regions)),
            collective=_text(data.get("collective")),
            ordinal=data["ordinal"] if _is_int(data.get("ordinal")) and data["ordinal"] >= 0 else None,
            collective_since=_number(data.get("collective_since"), 1e12),
            where=_text(data.get("where")),
            stack=tuple(_frames(stack)),
            stalled_s=_number(data.get("stalled_s"), 1e12),
        )

    @property
    def name(self) -> str:
        """``rank 1``, or ``rank 0 (actor)``."""
        return f"rank {self.rank}" + (f" ({self.role})" if self.role else "")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any, top: float) -> Optional[float]:
    """``value`` as a float when it is a finite number from 0 to ``top``, else None."""
    number = in_range(value, top)
    return float(number) if number is not None else None


def _text(value: Any) -> Optional[str]:
    return value[:_MAX_TEXT] if isinstance(value, str) else None


def _entries(value: Any) -> list[OpenEntry]:
    if not isinstance(value, list):
        return []
    found = []
    for item in value[:_MAX_ENTRIES]:
        if isinstance(item, dict) and isinstance(item.get("role"), str) and isinstance(item.get("stage"), str):
            found.append(
                OpenEntry(role=item["role"][:_MAX_TEXT], stage=item["stage"][:_MAX_TEXT],
                          since=_number(item.get("since"), 1e12) or 0.0)
            )  # fmt: skip
    return found


def _frames(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        return []
    found = []
    for item in value[-_MAX_ENTRIES:]:
        if isinstance(item, dict):
            found.append(
                {"file": _text(item.get("file")) or "?", "line": item["line"] if _is_int(item.get("line")) else 0,
                 "function": _text(item.get("function")) or "?", "code": _text(item.get("code")) or ""}
            )  # fmt: skip
    return found


def read_live(path: str) -> LiveStatus:
    """The live status in ``path``; ``OSError`` or ``ValueError`` when it cannot be read as one
    (see :func:`~torchstep_prof.triggers.status.read_status_json`; at most :data:`MAX_LIVE_BYTES`)."""
    return LiveStatus.from_json(path, read_status_json(path, MAX_LIVE_BYTES, "live status"))


def read_lives(folder: str) -> tuple[list[LiveStatus], list[str]]:
    """Every rank's live status in ``folder``, by rank and role, and a line for each file that
    is not one."""
    found, bad = read_each(folder, "live-rank*.json", read_live, MAX_LIVE_FILES, "live status")
    found.sort(key=lambda s: (s.rank, s.role or ""))
    return found, bad
