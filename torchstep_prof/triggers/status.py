"""Each rank's status file next to the trigger file: its current step, step rate and served requests.

The job's poll thread writes ``status-rank<R>.json`` (``status-rank<R>-<role>.json`` with a
``process_role``) every poll; ``torchstep-prof trigger`` reads them to choose the steps of a
request and to show ``--status``. A restarted poll thread reads its own file back: a request
already served there is never served again. No torch here.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

import attrs

from .._shared_files import read_capped, read_each
from ..naming import file_label

__all__ = [
    "MAX_SERVED", "MAX_STATUS_BYTES", "MAX_STATUS_FILES", "STALE_S", "RankStatus", "in_range", "is_stale",
    "read_status_json", "read_statuses", "role_suffix", "status_path",
]  # fmt: skip

MAX_SERVED = 50  # requests kept in a status file (the newest): it stays small
MAX_STATUS_BYTES = 1 << 20
"""The largest status file read (one holds at most MAX_SERVED bounded requests: ~100 KiB)."""
MAX_STATUS_FILES = 4096
"""The most status files ``trigger`` reads in one folder (one per rank and role)."""


def role_suffix(role: Optional[str]) -> str:
    """How a per-rank file name of this folder writes a process role: ``-<role>`` as trace file
    names write it, a stable stand-in when nothing is left of it, ``''`` for no role.

    >>> role_suffix("../../etc/actor"), role_suffix(None)
    ('-etc-actor', '')
    """
    if not role:
        return ""
    try:
        return "-" + file_label(role)
    except ValueError:  # nothing left after sanitizing: a stable stand-in
        return "-role+" + hashlib.sha1(role.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def status_path(folder: str, rank: int, role: Optional[str] = None) -> str:
    """Where rank ``rank`` (of process role ``role``) writes its status: always a file directly
    in ``folder``.

    >>> status_path("/d", 3), status_path("/d", 0, "actor")
    ('/d/status-rank3.json', '/d/status-rank0-actor.json')
    """
    return os.path.join(folder, f"status-rank{rank}{role_suffix(role)}.json")


@attrs.frozen(kw_only=True)
class RankStatus:
    """What one rank last wrote: ``step`` (the step it was in, None before its first),
    ``time`` (when, seconds since the epoch), ``rate`` (steps per second lately, None until
    known), its ``poll_s``, and the requests it ``served`` (``{"id", "steps", "outcome"}``)."""

    path: str
    rank: int
    role: Optional[str] = None
    step: Optional[int] = None
    time: float = 0.0
    rate: Optional[float] = None
    poll_s: float = 1.0
    served: tuple[dict[str, Any], ...] = ()
    running: bool = True
    slow: bool = False  # auto_trace: this rank slowed lately (no peer for another's capture)
    auto_bytes: int = 0  # auto_trace: the bytes of the automatic traces this rank wrote

    @classmethod
    def from_json(cls, path: str, data: Any) -> RankStatus:
        """A status from a decoded file; ``ValueError`` for one that is not a status."""
        if not isinstance(data, dict) or not isinstance(data.get("rank"), int):
            raise ValueError(f"{path}: not a status file (no integer 'rank')")
        served = data.get("served")
        # Anyone who can write the folder can write a status file: numbers out of their range
        # count as missing, so no rank's report can push a request's steps out of bounds.
        step, rate, poll_s = (in_range(data.get(key), top) for key, top in _RANGES)
        auto = data.get("auto")
        auto_bytes = in_range(auto.get("bytes"), 2**53) if isinstance(auto, dict) else None
        return cls(
            path=path,
            rank=data["rank"],
            role=data.get("role") if isinstance(data.get("role"), str) else None,
            step=int(step) if isinstance(step, int) else None,
            time=float(data["time"]) if in_range(data.get("time"), 1e12) is not None else 0.0,
            rate=float(rate) if rate is not None else None,
            poll_s=float(poll_s) if poll_s else 1.0,
            served=tuple(s for s in served[-MAX_SERVED:] if isinstance(s, dict)) if isinstance(served, list) else (),
            running=data.get("running") is not False,
            slow=isinstance(auto, dict) and auto.get("slow") is True,
            auto_bytes=int(auto_bytes) if isinstance(auto_bytes, int) else 0,
        )

    def served_ids(self) -> set[str]:
        return {s["id"] for s in self.served if isinstance(s.get("id"), str)}


_RANGES = (("step", 2**53), ("rate", 1e7), ("poll_s", 3600.0))  # the largest value each may take


def in_range(value: Any, top: float) -> Optional[float]:
    """``value`` as written (an int stays one) when it is a finite number from 0 to ``top``, else None.

    >>> in_range(3, 10), in_range(True, 10), in_range(float("nan"), 10), in_range(11.5, 10)
    (3, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if 0 <= value <= top else None  # NaN fails both comparisons


def read_status_json(path: str, limit: int, what: str) -> Any:
    """The decoded JSON of the ``what`` file at ``path``; ``OSError`` or ``ValueError`` when it cannot
    be read (a FIFO, a link, a device or one over ``limit`` bytes is refused, never waited on) or decoded."""
    try:
        return json.loads(read_capped(path, limit))
    except RecursionError:
        raise ValueError(f"{path}: not a {what} file (nested too deeply)") from None


def read_status(path: str) -> RankStatus:
    """The status in ``path``; ``OSError`` or ``ValueError`` when it cannot be read as one
    (see :func:`read_status_json`; at most :data:`MAX_STATUS_BYTES`)."""
    return RankStatus.from_json(path, read_status_json(path, MAX_STATUS_BYTES, "status"))


def read_statuses(folder: str) -> tuple[list[RankStatus], list[str]]:
    """Every rank's status in ``folder``, by rank, and a line for each file that is not one."""
    found, bad = read_each(folder, "status-rank*.json", read_status, MAX_STATUS_FILES, "status")
    found.sort(key=lambda s: (s.rank, s.role or ""))
    return found, bad


STALE_S = 60.0
"""A status file older than this (and than 10 of its rank's polls) is a rank that died."""


def is_stale(status: RankStatus, now: float) -> bool:
    """A running rank's status not written for many of its polls: its step would push every
    request far into the future (its rate times that age), so it is left out."""
    return now - status.time > max(STALE_S, 10 * status.poll_s)
