"""Each rank's status file next to the trigger file: its current step, step rate and served requests.

The job's poll thread writes ``status-rank<R>.json`` (``status-rank<R>-<role>.json`` with a
``process_role``) every poll; ``torchstep-prof trigger`` reads them to choose the steps of a
request and to show ``--status``. A restarted poll thread reads its own file back: a request
already served there is never served again. No torch here.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

import attrs

__all__ = ["MAX_SERVED", "RankStatus", "read_statuses", "status_path"]

MAX_SERVED = 50  # requests kept in a status file (the newest): it stays small


def status_path(folder: str, rank: int, role: Optional[str] = None) -> str:
    """Where rank ``rank`` (of process role ``role``) writes its status.

    >>> status_path("/d", 3)
    '/d/status-rank3.json'
    """
    suffix = f"-{role}" if role else ""
    return os.path.join(folder, f"status-rank{rank}{suffix}.json")


@attrs.frozen(kw_only=True)
class RankStatus:
    """What one rank last wrote: ``step`` (the step it was in, None before its first),
    ``time`` (when, seconds since the epoch), ``rate`` (steps per second lately, None until
    known), its ``poll_s``, and the requests it ``served`` (``{"id", "steps", "outcome"}``)."""

    path: str
    rank: int
    role: Optional[str] = None
    pid: Optional[int] = None
    host: Optional[str] = None
    step: Optional[int] = None
    time: float = 0.0
    rate: Optional[float] = None
    poll_s: float = 1.0
    served: tuple[dict[str, Any], ...] = ()
    running: bool = True

    @classmethod
    def from_json(cls, path: str, data: Any) -> RankStatus:
        """A status from a decoded file; ``ValueError`` for one that is not a status."""
        if not isinstance(data, dict) or not isinstance(data.get("rank"), int):
            raise ValueError(f"{path}: not a status file (no integer 'rank')")
        served = data.get("served")
        number = (int, float)
        return cls(
            path=path,
            rank=data["rank"],
            role=data.get("role") if isinstance(data.get("role"), str) else None,
            pid=data.get("pid") if isinstance(data.get("pid"), int) else None,
            host=data.get("host") if isinstance(data.get("host"), str) else None,
            step=data.get("step") if isinstance(data.get("step"), int) else None,
            time=float(data["time"]) if isinstance(data.get("time"), number) else 0.0,
            rate=float(data["rate"]) if isinstance(data.get("rate"), number) else None,
            poll_s=float(data["poll_s"]) if isinstance(data.get("poll_s"), number) else 1.0,
            served=tuple(s for s in served if isinstance(s, dict)) if isinstance(served, list) else (),
            running=data.get("running") is not False,
        )

    def served_ids(self) -> set[str]:
        return {s["id"] for s in self.served if isinstance(s.get("id"), str)}


def read_status(path: str) -> RankStatus:
    """The status in ``path``; ``OSError`` or ``ValueError`` when it cannot be read as one."""
    with open(path, encoding="utf-8") as handle:
        return RankStatus.from_json(path, json.load(handle))


def read_statuses(folder: str) -> tuple[list[RankStatus], list[str]]:
    """Every rank's status in ``folder``, by rank, and a line for each file that is not one."""
    found: list[RankStatus] = []
    bad: list[str] = []
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), "status-rank*.json"))):
        try:
            found.append(read_status(path))
        except (OSError, ValueError) as exc:
            bad.append(f"{path}: {exc}")
    found.sort(key=lambda s: (s.rank, s.role or ""))
    return found, bad
