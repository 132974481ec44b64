"""What ``torchstep-prof status`` says of a job: each rank's state, and the verdict first (no torch here).

The verdict names the ranks that hold the others up: ranks outside any collective while others
wait in one ("rank 1 has been in actor/update for 312 s at step 482; ranks 0, 2, 3 wait in
all_reduce #482 for it"), ranks in different collectives (a mismatch), a rank the stall rule
fired on, and ranks whose status went stale (a dead process) or that have none. Records first
(:class:`RankView`), text second: every text taken from a status file is escaped where printed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs

from .status import LiveStatus

__all__ = ["RANKS_SHOWN", "STALE_S", "RankView", "verdict", "view"]

STALE_S = 10.0
"""A running rank's status older than this (and than 5 of its polls) is stale: its process
died, or its status thread cannot run."""
RANKS_SHOWN = 8  # ranks named in one verdict line; more are counted
_MAX_WORLD = 1 << 20  # a larger world size in a status is not believed (no missing ranks listed)


@attrs.frozen(kw_only=True)
class RankView:
    """One rank as the command shows it; ``state`` is running, stalled, stale or stopped."""

    status: LiveStatus
    state: str
    age_s: float

    @property
    def in_collective(self) -> bool:
        return self.status.collective is not None

    def region_text(self, now: float) -> Optional[str]:
        """``actor/update for 312 s`` (the innermost open region), or None."""
        if not self.status.regions:
            return None
        entry = self.status.regions[-1]
        return f"{entry.role}/{entry.stage} for {_seconds(now - entry.since)}"

    def collective_text(self) -> str:
        status = self.status
        ordinal = f" #{status.ordinal}" if status.ordinal is not None else ""
        return f"{status.collective}{ordinal}"


def view(statuses: Sequence[LiveStatus], now: float) -> list[RankView]:
    """Each status with its state and age."""
    found = []
    for status in statuses:
        age = max(0.0, now - status.time)
        if not status.running:
            state = "stopped"
        elif age > max(STALE_S, 5 * status.poll_s):
            state = "stale"
        elif status.stalled_s is not None:
            state = "stalled"
        else:
            state = "running"
        found.append(RankView(status=status, state=state, age_s=age))
    return found


def verdict(views: Sequence[RankView], now: float) -> list[str]:
    """The verdict's lines, most telling first."""
    lines: list[str] = []
    live = [v for v in views if v.state in ("running", "stalled")]
    waiting = [v for v in live if v.in_collective]
    busy = [v for v in live if not v.in_collective]
    if waiting and busy:
        for v in busy[:RANKS_SHOWN]:
            lines.append(_where_it_is(v, now))
        if len(busy) > RANKS_SHOWN:
            lines.append(f"{len(busy) - RANKS_SHOWN} more ranks outside any collective")
        them = "it" if len(busy) == 1 else "them"
        lines.append("; ".join(_waiters(waiting, now)) + f" for {them}")
    elif waiting:
        groups = _by_collective(waiting)
        if len(groups) == 1:
            ((text, members),) = groups.items()
            lines.append(
                f"every reporting rank is in {text} ({_names(members)}), the longest for "
                f"{_seconds(max(_in_collective_s(v, now) for v in members))}: it is slow, or waits for a rank "
                "that reports no status here"
            )
        else:
            lines.append(
                "the ranks are in different collectives (called in a different order?): "
                + "; ".join(_waiters(waiting, now))
            )
    elif live:
        # Ranks stuck inside a region first, the longest first: those idle outside any region
        # (a Ray worker waiting for its driver) more likely wait for them.
        stalled = sorted(
            (v for v in live if v.state == "stalled"),
            key=lambda v: (not v.status.regions, min((e.since for e in v.status.regions), default=0.0)),
        )
        for v in stalled[:RANKS_SHOWN]:
            lines.append(f"{v.status.name} is stalled: " + _where_it_is(v, now, named=False))
        if not stalled:
            steps = sorted({v.status.step for v in live if v.status.step is not None})
            span = (
                "no step yet"
                if not steps
                else f"step {steps[0]}"
                if len(steps) == 1
                else f"steps {steps[0]}-{steps[-1]}"
            )
            lines.append(f"no rank waits in a collective; {len(live)} running ({span})")
    for v in views:
        if v.state == "stale":
            lines.append(
                f"{v.status.name}'s status is stale (last written {_seconds(v.age_s)} ago): its process may have "
                "died, or be stuck holding the GIL"
            )
        elif v.state == "stopped":
            step = "" if v.status.step is None else f" at step {v.status.step}"
            lines.append(f"{v.status.name} stopped reporting{step} (its scope ended, or the process exited)")
    lines += _missing(views)
    return lines


def _where_it_is(v: RankView, now: float, named: bool = True) -> str:
    status = v.status
    step = "before its first step" if status.step is None else f"at step {status.step}"
    region = v.region_text(now)
    who = f"{status.name} has been" if named else "has been"
    if region is not None:
        text = f"{who} in {region} {step}"
    else:
        since = status.step_since if status.step_since is not None else status.time
        text = f"{who} outside any region for {_seconds(now - since)} {step}"
    return text + (f" ({status.where})" if status.where else "")


def _in_collective_s(v: RankView, now: float) -> float:
    since = v.status.collective_since
    return now - since if since is not None else 0.0


def _by_collective(views: Sequence[RankView]) -> dict[str, list[RankView]]:
    groups: dict[str, list[RankView]] = {}
    for v in views:
        groups.setdefault(v.collective_text(), []).append(v)
    return groups


def _waiters(views: Sequence[RankView], now: float) -> list[str]:
    found = []
    for text, members in _by_collective(views).items():
        verb = "waits" if len(members) == 1 else "wait"
        longest = max(_in_collective_s(v, now) for v in members)
        found.append(f"{_names(members)} {verb} in {text} ({_seconds(longest)})")
    return found


def _names(views: Sequence[RankView]) -> str:
    plain = all(v.status.role is None for v in views)  # "ranks 0, 2", else "rank 0 (actor), rank 1 (critic)"
    shown = [str(v.status.rank) if plain else v.status.name for v in views[:RANKS_SHOWN]]
    if len(views) > RANKS_SHOWN:
        shown.append(f"{len(views) - RANKS_SHOWN} more")
    head = ("rank " if len(views) == 1 else "ranks ") if plain else ""
    return head + ", ".join(shown)


def _missing(views: Sequence[RankView]) -> list[str]:
    sizes = {v.status.world_size for v in views if v.status.world_size is not None and v.status.role is None}
    if len(sizes) != 1:
        return []
    (size,) = sizes
    if size > _MAX_WORLD:  # anyone who can write the folder writes the world size too
        return []
    seen = {v.status.rank for v in views}
    absent = [r for r in range(size) if r not in seen]
    if not absent:
        return []
    shown = ", ".join(map(str, absent[:RANKS_SHOWN])) + (
        f" and {len(absent) - RANKS_SHOWN} more" if len(absent) > RANKS_SHOWN else ""
    )
    return [f"no status here for rank{'s' if len(absent) > 1 else ''} {shown} of {size}"]


def _seconds(value: float) -> str:
    value = max(0.0, value)
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def as_json(views: Sequence[RankView], now: float, stacks: bool) -> list[dict[str, Any]]:
    """The ranks as ``--json`` prints them."""
    found = []
    for v in views:
        s = v.status
        item: dict[str, Any] = {
            "rank": s.rank, "role": s.role, "pid": s.pid, "host": s.host, "state": v.state,
            "age_s": round(v.age_s, 3), "step": s.step,
            "regions": [{"role": e.role, "stage": e.stage, "for_s": round(now - e.since, 3)} for e in s.regions],
            "collective": s.collective, "ordinal": s.ordinal,
            "collective_for_s": round(_in_collective_s(v, now), 3) if s.collective else None,
            "where": s.where, "stalled_s": s.stalled_s, "path": s.path,
        }  # fmt: skip
        if stacks:
            item["stack"] = list(s.stack)
        found.append(item)
    return found
