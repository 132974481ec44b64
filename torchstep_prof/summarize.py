"""Summarizing a folder of traces: wall time per rank of each region and step, and stragglers.

Data first: :func:`summarize` groups scanned traces by role, stage and step into plain records
(:class:`Summary`), :func:`summary_to_dict` gives the documented JSON shape. Rendering second:
:func:`render_summary` prints a rich table on the ``Console`` it is given.
"""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Tuple

import attrs

from .tracefiles import OpTime, TraceInfo, Unreadable

if TYPE_CHECKING:  # rich is imported where it renders: grouping traces does not need it
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "DEFAULT_STRAGGLER_RATIO",
    "STRAGGLER_MIN_MS",
    "GroupSummary",
    "RankTime",
    "Summary",
    "find_straggler",
    "render_summary",
    "summarize",
    "summary_to_dict",
]

DEFAULT_STRAGGLER_RATIO = 1.25
STRAGGLER_MIN_MS = 5.0
"""A straggler is also at least this many milliseconds over its group's median: on regions of a
few milliseconds, a ratio alone flags noise."""


@attrs.frozen(kw_only=True)
class RankTime:
    """One rank's trace within a group."""

    rank: int
    wall_ms: float
    file: str
    top_ops: Tuple[OpTime, ...] = ()


@attrs.frozen(kw_only=True)
class GroupSummary:
    """The traces of one region (role, stage) at one step, one per rank.

    ``top_ops`` is the group's operators by self time averaged over its ranks.
    """

    role: str
    stage: str
    step: int
    ranks: Tuple[RankTime, ...]
    median_ms: float
    min_ms: float
    max_ms: float
    slowest: int
    straggler: Optional[int]
    top_ops: Tuple[OpTime, ...] = ()


@attrs.frozen(kw_only=True)
class Summary:
    """Every group found, in role, stage, step order, and the files that could not be used."""

    groups: Tuple[GroupSummary, ...]
    unreadable: Tuple[Unreadable, ...] = ()
    straggler_ratio: float = DEFAULT_STRAGGLER_RATIO


def find_straggler(
    wall_ms: Mapping[int, float],
    ratio: float = DEFAULT_STRAGGLER_RATIO,
    min_over_ms: float = STRAGGLER_MIN_MS,
) -> Optional[int]:
    """The slowest rank when it is over ``ratio`` times the median of ``wall_ms`` and over it by
    at least ``min_over_ms``; else None.

    >>> find_straggler({0: 100.0, 1: 101.0, 2: 180.0, 3: 99.0})
    2
    >>> find_straggler({0: 2.0, 1: 2.1, 2: 4.0})  # twice the median, but only 2 ms over it
    """
    if not wall_ms:
        return None
    median = statistics.median(wall_ms.values())
    slowest = max(sorted(wall_ms), key=lambda rank: wall_ms[rank])
    over = wall_ms[slowest]
    if over > ratio * median and over - median >= min_over_ms:
        return slowest
    return None


def summarize(
    traces: Iterable[TraceInfo],
    unreadable: Iterable[Unreadable] = (),
    *,
    straggler_ratio: float = DEFAULT_STRAGGLER_RATIO,
    top: int = 5,
) -> Summary:
    """Group ``traces`` by role, stage and step and find each group's straggler.

    A rank with two traces in one group (two runs in one folder) keeps both rows; the straggler
    test uses the slower one.
    """
    by_group: dict[tuple[str, str, int], list[TraceInfo]] = {}
    for info in traces:
        by_group.setdefault((info.role, info.stage, info.step), []).append(info)
    groups = []
    for (role, stage, step), infos in sorted(by_group.items()):
        infos.sort(key=lambda i: (i.rank, i.path))
        walls: dict[int, float] = {}
        for info in infos:
            walls[info.rank] = max(walls.get(info.rank, 0.0), info.wall_ms)
        values = [info.wall_ms for info in infos]
        groups.append(
            GroupSummary(
                role=role,
                stage=stage,
                step=step,
                ranks=tuple(
                    RankTime(rank=i.rank, wall_ms=i.wall_ms, file=i.path, top_ops=i.top_ops[:top])
                    for i in infos
                ),
                median_ms=statistics.median(values),
                min_ms=min(values),
                max_ms=max(values),
                slowest=max(sorted(walls), key=lambda rank: walls[rank]),
                straggler=find_straggler(walls, straggler_ratio),
                top_ops=_mean_ops(infos, top),
            )
        )
    return Summary(
        groups=tuple(groups), unreadable=tuple(unreadable), straggler_ratio=straggler_ratio
    )


def _mean_ops(infos: Sequence[TraceInfo], top: int) -> Tuple[OpTime, ...]:
    totals: dict[str, float] = {}
    for info in infos:
        for op in info.top_ops:
            totals[op.name] = totals.get(op.name, 0.0) + op.self_ms
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:top]
    return tuple(OpTime(name=name, self_ms=ms / len(infos)) for name, ms in ranked)


def summary_to_dict(summary: Summary) -> dict[str, Any]:
    """The JSON shape of ``summarize --json``::

    {"groups": [{"role", "stage", "step",
                 "ranks": [{"rank", "wall_ms", "file", "top_ops": [{"name", "self_ms"}]}],
                 "median_ms", "min_ms", "max_ms", "slowest", "straggler": <rank or null>,
                 "top_ops": [{"name", "self_ms"}]}],
     "unreadable": [<path>, ...]}
    """
    return {
        "groups": [
            {
                "role": g.role,
                "stage": g.stage,
                "step": g.step,
                "ranks": [
                    {
                        "rank": r.rank,
                        "wall_ms": _ms(r.wall_ms),
                        "file": r.file,
                        "top_ops": _ops(r.top_ops),
                    }
                    for r in g.ranks
                ],
                "median_ms": _ms(g.median_ms),
                "min_ms": _ms(g.min_ms),
                "max_ms": _ms(g.max_ms),
                "slowest": g.slowest,
                "straggler": g.straggler,
                "top_ops": _ops(g.top_ops),
            }
            for g in summary.groups
        ],
        "unreadable": [u.path for u in summary.unreadable],
    }


def _ms(value: float) -> float:
    return round(value, 3)


def _ops(ops: Iterable[OpTime]) -> list[dict[str, Any]]:
    return [{"name": op.name, "self_ms": _ms(op.self_ms)} for op in ops]


def render_summary(summary: Summary, console: Console, *, title: str | None = None) -> None:
    """Print ``summary`` as one table (a section per group), then the files that were skipped.

    Each group shows every rank's wall time and its ratio to the group's median, the slowest
    rank, a straggler flag, and the group's top operators (self time averaged over its ranks);
    a straggler's row also shows its own top operators.
    """
    from rich.text import Text

    if summary.groups:
        console.print(_table(summary, title))
    if summary.unreadable:
        console.print(f"Skipped {len(summary.unreadable)} file(s) that are not usable traces:")
        for item in summary.unreadable:
            console.print(Text(f"  {item.path}: {item.reason}"), soft_wrap=True)


def _table(summary: Summary, title: str | None) -> Table:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    caption = (
        f"straggler: over {summary.straggler_ratio:g}x its group's median and at least "
        f"{STRAGGLER_MIN_MS:g} ms over it. top ops: self time, averaged over the group's ranks"
    )
    table = Table(
        title=Text(title) if title else None,
        title_justify="left",
        caption=Text(caption),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )
    table.add_column("region", overflow="fold", max_width=24)
    table.add_column("step", justify="right")
    table.add_column("rank", justify="right")
    table.add_column("wall ms", justify="right", no_wrap=True)
    table.add_column("x median", no_wrap=True)
    table.add_column("top ops (self ms)", overflow="fold", ratio=1)
    for number, group in enumerate(summary.groups):
        for row, rank in enumerate(group.ranks):
            ratio = Text(f"{rank.wall_ms / group.median_ms if group.median_ms > 0 else 1.0:.2f}")
            is_max = rank.wall_ms == group.max_ms
            ops = _ops_lines(group.top_ops) if row == 0 else []
            if rank.rank == group.straggler and is_max:
                ratio.append(" straggler", style="bold red")
                if rank.top_ops:
                    ops += [f"rank {rank.rank}:"] + _ops_lines(rank.top_ops)
            elif rank.rank == group.slowest and is_max and len(group.ranks) > 1:
                ratio.append(" slowest")
            table.add_row(
                Text(f"{group.role}/{group.stage}") if row == 0 else "",
                str(group.step) if row == 0 else "",
                str(rank.rank),
                f"{rank.wall_ms:.1f}",
                ratio,
                Text("\n".join(ops)),
                end_section=row == len(group.ranks) - 1 and number < len(summary.groups) - 1,
            )
    return table


def _ops_lines(ops: Sequence[OpTime]) -> list[str]:
    return [f"{op.self_ms:6.1f} {op.name}" for op in ops]


def default_title(directory: str | os.PathLike[str], summary: Summary) -> str:
    """``<n> trace(s) in <dir>, <g> group(s)``."""
    count = sum(len(g.ranks) for g in summary.groups)
    return f"{count} trace(s) in {os.fspath(directory)}, {len(summary.groups)} group(s)"
