"""Telling runs apart in one folder: the newest run of each rank is used, the others named.

Two jobs writing into the same ``save_path`` (the default ``outputs/profile``) leave traces of
the same rank from several processes. Comparing them as if they were ranks is wrong, so the
trace commands keep, per rank and role, the traces of the process (pid) whose latest trace
started last, and say which pids they left out (``--pid`` chooses another).

Roles are part of the key because processes of different roles may share a rank number in one
job (Ray workers of each role are told ranks 0..n-1): those are not two runs. Fused traces are
keyed by rank alone (role :data:`FUSED_ROLE`): one process per rank writes them, and their names
list different roles from step to step.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple

import attrs

from ..reading.files import TraceInfo, started_at

__all__ = ["FUSED_ROLE", "OtherRun", "choose_runs", "describe_other_runs"]

FUSED_ROLE = "(fused)"
"""The role of :class:`OtherRun` records about fused traces (whatever roles they hold)."""


@attrs.frozen(kw_only=True)
class OtherRun:
    """A rank and role written by several processes: the pid used and the pids left out."""

    rank: int
    role: str
    pid: Optional[int]
    other_pids: Tuple[Optional[int], ...]
    left_out: int  # traces of the other pids


def choose_runs(traces: Iterable[TraceInfo]) -> tuple[list[TraceInfo], Tuple[OtherRun, ...]]:
    """Keep, for each (rank, role), the traces of the newest process; name the others.

    Returns the traces kept and the runs that were left out.

    >>> kept, other_runs = choose_runs(scan_traces("outputs/profile")[0])  # doctest: +SKIP
    >>> [(r.rank, r.pid, r.other_pids) for r in other_runs]  # doctest: +SKIP
    [(0, 4242, (4100,))]
    """
    traces = list(traces)
    by_key: dict[tuple[int, str], dict[Optional[int], list[TraceInfo]]] = {}
    for info in traces:
        role = FUSED_ROLE if info.fused else info.role
        by_key.setdefault((info.rank, role), {}).setdefault(info.pid, []).append(info)
    dropped: set[str] = set()
    others = []
    for (rank, role), by_pid in sorted(by_key.items()):
        if len(by_pid) < 2:
            continue
        newest = max(by_pid, key=lambda pid: (max(started_at(i) for i in by_pid[pid]), pid or 0))
        left = sorted((pid for pid in by_pid if pid != newest), key=lambda pid: pid or 0)
        for pid in left:
            dropped.update(info.path for info in by_pid[pid])
        others.append(
            OtherRun(
                rank=rank,
                role=role,
                pid=newest,
                other_pids=tuple(left),
                left_out=sum(len(by_pid[pid]) for pid in left),
            )
        )
    return [info for info in traces if info.path not in dropped], tuple(others)


def describe_other_runs(other_runs: Sequence[OtherRun]) -> list[str]:
    """One warning line per set of left-out pids, naming the ranks it concerns."""
    lines: dict[tuple, list[int]] = {}
    for run in other_runs:
        lines.setdefault((run.pid, run.other_pids), []).append(run.rank)
    out = []
    for (pid, other_pids), ranks in lines.items():
        ranks = sorted(set(ranks))
        which = f"ranks {', '.join(map(str, ranks))} use" if len(ranks) > 1 else f"rank {ranks[0]} uses"
        others = ", ".join("?" if p is None else str(p) for p in other_pids)
        out.append(
            f"warning: several runs in one folder: {which} the newest, "
            f"pid {'?' if pid is None else pid}; left out pid {others} (--pid chooses)"
        )
    return out
