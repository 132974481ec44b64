"""Summarizing a folder of traces: wall time per rank of each region and step, and stragglers.

Data first: :func:`summarize` groups scanned traces by role, stage and step into plain records
(:class:`Summary`), :func:`summary_to_dict` gives the documented JSON shape. Rendering second:
:func:`render_summary` prints a rich table on the ``Console`` it is given.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Tuple

import attrs

from ...rendering import format_ms, safe_text, wrap_label
from .runs import OtherRun
from ..reading.events import ranked_ops
from ..reading.files import OpTime, TraceInfo, Unreadable

if TYPE_CHECKING:  # rich is imported where it renders: grouping traces does not need it
    from rich.console import Console
    from rich.table import Table

__all__ = [
    "DEFAULT_STRAGGLER_RATIO",
    "STRAGGLER_MIN_MS",
    "GroupSummary",
    "Summary",
    "find_straggler",
    "group_fields",
    "render_summary",
    "summarize",
    "summary_to_dict",
    "trim_summary",
]

DEFAULT_STRAGGLER_RATIO = 1.25
STRAGGLER_MIN_MS = 5.0
"""A straggler is also at least this many milliseconds over its group's median: on regions of a
few milliseconds, a ratio alone flags noise."""


@attrs.frozen(kw_only=True)
class GroupSummary:
    """The traces of one region (role, stage) at one step and occurrence, one per rank
    (``ranks``: each with its operators cut to ``top``; a trace's ``role`` is its own, which
    differs between the ranks of a fused group when they ran different roles).

    A fused group (``fused``) holds the whole-step traces of its step from every rank, whatever
    roles each rank ran; its ``role`` is the roles of its ranks' traces, distinct, joined by
    ``-`` as fused file names join them. ``top_ops`` is the group's operators by self time
    averaged over its ranks.
    """

    role: str
    stage: str
    step: int
    ranks: Tuple[TraceInfo, ...]
    median_ms: float
    min_ms: float
    max_ms: float
    slowest: int
    straggler: Optional[int]
    occurrence: int = 1
    fused: bool = False
    top_ops: Tuple[OpTime, ...] = ()

    @property
    def label(self) -> str:
        """``<role>/<stage>``, with `` #k`` for occurrence k >= 2."""
        suffix = f" #{self.occurrence}" if self.occurrence > 1 else ""
        return f"{self.role}/{self.stage}{suffix}"


@attrs.frozen(kw_only=True)
class Summary:
    """Every group found, in role, stage, step, occurrence order; the files that could not be
    used; the runs left out (several pids for one rank: see :mod:`torchstep_prof.traces.analysis.runs`)."""

    groups: Tuple[GroupSummary, ...]
    unreadable: Tuple[Unreadable, ...] = ()
    straggler_ratio: float = DEFAULT_STRAGGLER_RATIO
    other_runs: Tuple[OtherRun, ...] = ()


def group_fields(record: Any) -> dict[str, Any]:
    """What names a group, of a :class:`GroupSummary` or a record about one: its role, stage,
    step, occurrence and whether it is fused (in this order, as the JSON lists them)."""
    return {
        "role": record.role,
        "stage": record.stage,
        "step": record.step,
        "occurrence": record.occurrence,
        "fused": record.fused,
    }


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
    other_runs: Iterable[OtherRun] = (),
) -> Summary:
    """Group ``traces`` by role, stage, step and occurrence and find each group's straggler.

    Occurrences stay apart (a region that ran twice in a step is two groups, never two ranks).
    Fused traces of a step form one group across ranks, whatever roles each rank ran. A rank
    with two traces in one group keeps both rows; the straggler test uses the slower one
    (:func:`torchstep_prof.traces.analysis.runs.choose_runs` first keeps one run per rank).
    """
    by_group: dict[tuple[str, str, int, int], list[TraceInfo]] = {}
    for info in traces:
        role = _FUSED_KEY if info.fused else info.role
        by_group.setdefault((role, info.stage, info.step, info.occurrence), []).append(info)
    groups = []
    for (role, stage, step, occurrence), infos in by_group.items():
        infos.sort(key=lambda i: (i.rank, i.path))
        if role == _FUSED_KEY:
            role = "-".join(dict.fromkeys(r for i in infos for r in (i.roles or (i.role,))))
        walls: dict[int, float] = {}
        for info in infos:
            walls[info.rank] = max(walls.get(info.rank, 0.0), info.wall_ms)
        values = [info.wall_ms for info in infos]
        groups.append(
            GroupSummary(
                role=role,
                stage=stage,
                step=step,
                occurrence=occurrence,
                fused=infos[0].fused,
                ranks=tuple(attrs.evolve(i, top_ops=i.top_ops[:top]) for i in infos),
                median_ms=statistics.median(values),
                min_ms=min(values),
                max_ms=max(values),
                slowest=max(sorted(walls), key=lambda rank: walls[rank]),
                straggler=find_straggler(walls, straggler_ratio),
                top_ops=_mean_ops(infos, top),
            )
        )
    groups.sort(key=lambda g: (g.role, g.stage, g.step, g.occurrence))
    return Summary(
        groups=tuple(groups),
        unreadable=tuple(unreadable),
        straggler_ratio=straggler_ratio,
        other_runs=tuple(other_runs),
    )


def trim_summary(summary: Summary, top: int) -> Summary:
    """``summary`` with every operator list cut to ``top``: what :func:`summarize` with ``top``
    gives, without summing the operators again (a deep summary serves both).

    Both rank operators the same way, so the first ``top`` of a deeper list are the list."""
    groups = tuple(
        attrs.evolve(
            g,
            top_ops=g.top_ops[:top],
            ranks=tuple(attrs.evolve(r, top_ops=r.top_ops[:top]) for r in g.ranks),
        )
        for g in summary.groups
    )
    return attrs.evolve(summary, groups=groups)


_FUSED_KEY = "\0fused"  # groups fused traces by step whatever their roles; never a label


def _mean_ops(infos: Sequence[TraceInfo], top: int) -> Tuple[OpTime, ...]:
    totals: dict[str, float] = {}
    for info in infos:
        for op in info.top_ops:
            totals[op.name] = totals.get(op.name, 0.0) + op.self_ms
    return ranked_ops(totals, top, divisor=len(infos))


def summary_to_dict(summary: Summary) -> dict[str, Any]:
    """The JSON shape of ``summarize --json``::

    {"groups": [{"role", "stage", "step", "occurrence", "fused",
                 "ranks": [{"rank", "pid", "role", "wall_ms", "gpu_ms": <ms or null>, "file",
                            "top_ops": [{"name", "self_ms"}]}],
                 "median_ms", "min_ms", "max_ms", "slowest", "straggler": <rank or null>,
                 "top_ops": [{"name", "self_ms"}]}],
     "findings": [...],
     "unreadable": [<path>, ...],
     "other_runs": [{"rank", "role", "pid", "other_pids", "left_out"}]}

    (``summarize --json`` adds ``collectives``, ``memory`` and, when the traces carry spans,
    ``timeline``: traces/analysis/timeline_section.py.)
    """
    return {
        "groups": [
            {
                **group_fields(g),
                "ranks": [
                    {
                        "rank": r.rank,
                        "pid": r.pid,
                        "role": r.role,
                        "wall_ms": _ms(r.wall_ms),
                        "gpu_ms": None if r.gpu_ms is None else _ms(r.gpu_ms),
                        "file": r.path,
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
        "findings": [],
        "unreadable": [u.path for u in summary.unreadable],
        "other_runs": [
            {
                "rank": o.rank,
                "role": o.role,
                "pid": o.pid,
                "other_pids": list(o.other_pids),
                "left_out": o.left_out,
            }
            for o in summary.other_runs
        ],
    }


def _ms(value: float) -> float:
    return round(value, 3)


def _ops(ops: Iterable[OpTime]) -> list[dict[str, Any]]:
    return [{"name": op.name, "self_ms": _ms(op.self_ms)} for op in ops]


def render_summary(summary: Summary, console: Console, *, title: str | None = None) -> None:
    """Print ``summary`` as one table (a section per group), then the files that were skipped.

    Each group shows every rank's wall time and its ratio to the group's median, the slowest
    rank, a straggler flag, and the group's top operators (self time averaged over its ranks);
    a straggler's row also shows its own top operators. Region names are never folded and no
    line ends with spaces; when the console is too narrow for an operators column, the
    operators are listed under the table instead.
    """
    from rich.text import Text

    from ...rendering import print_stripped

    if summary.groups:
        # A gpu ms column only when some trace holds kernels.
        gpu = any(rank.gpu_ms is not None for group in summary.groups for rank in group.ranks)
        table, ops_below = _table(summary, title, console.width, gpu)
        print_stripped(console, table)
        for group in summary.groups if ops_below else ():
            if group.top_ops:
                heading = f"{safe_text(group.label)} step {group.step}, top ops (self ms):"
                # Folded after a "-", "/" or space, as the table folds it: never mid-word.
                print_stripped(console, Text(wrap_label(heading, console.width)))
                print_stripped(console, Text("\n".join(_ops_lines(group.top_ops))), no_wrap=True)
        caption = (
            f"straggler: over {summary.straggler_ratio:g}x its group's median and at least "
            f"{STRAGGLER_MIN_MS:g} ms over it. top ops: self time, averaged over the group's ranks."
        )
        if gpu:
            caption += " gpu ms: time CUDA kernels ran inside the region."
        print_stripped(console, Text(caption))
    if summary.unreadable:
        count = len(summary.unreadable)
        print_stripped(console, f"Skipped {count} file(s) that are not usable traces:")
        for item in summary.unreadable:
            print_stripped(console, Text(f"  {safe_text(item.path)}: {safe_text(item.reason)}"), soft_wrap=True)


_GAP = 2  # characters between two columns
_MIN_OPS_WIDTH = 16  # narrower than this, the operators go under the table
_MIN_REGION_WIDTH = 12  # a folded region name keeps this many characters a line at least


def _table(summary: Summary, title: str | None, width: int, gpu: bool) -> tuple[Table, bool]:
    """The table, and whether the operators must be listed under it (no room for a column)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    show_occ = any(g.occurrence > 1 for g in summary.groups)
    rows = _rows(summary)
    cells = [
        ("region", [r[0] for r in rows]),
        ("step", [r[1] for r in rows]),
        *([("occ", [r[2] for r in rows])] if show_occ else []),
        ("rank", [r[3] for r in rows]),
        ("wall ms", [r[4] for r in rows]),
        *([("gpu ms", [r[8] for r in rows])] if gpu else []),
        ("x median", [r[5] for r in rows]),  # a Text: the straggler's flag is styled
    ]
    widths = [max(len(h), *(len(line) for c in col for line in str(c).split("\n"))) for h, col in cells]
    used = sum(widths) + _GAP * len(cells)
    ops_width = width - used
    ops_column = ops_width >= _MIN_OPS_WIDTH and any(r[6] for r in rows)
    # The numbers keep their width whatever the labels: a region name too long for what is
    # left is folded after its "-" and "/" (never mid-word), and the operators go below.
    region_width = widths[0]
    if ops_width < 0:
        region_width = max(_MIN_REGION_WIDTH, widths[0] + ops_width)
        rows = [(wrap_label(r[0], region_width), *r[1:]) for r in rows]
    table = Table(
        title=Text(safe_text(title)) if title else None,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
    )
    # Nothing wraps inside rich: a region name was folded above at its separators, and each
    # number column is as wide as its widest value (min_width: rich shrinks no number).
    table.add_column("region", no_wrap=True, max_width=region_width)
    for (header, _), min_width in zip(cells[1:], widths[1:]):
        table.add_column(header, justify="left" if header == "x median" else "right", no_wrap=True, min_width=min_width)
    if ops_column:
        # One operator a line, cut with an ellipsis rather than wrapped onto a line of its own.
        table.add_column("top ops (self ms)", no_wrap=True, overflow="ellipsis", max_width=ops_width)
    for index, row in enumerate(rows):
        numbers = [column[index] for _, column in cells[1:]]
        table.add_row(Text(row[0]), *numbers, *([Text(row[6])] if ops_column else []), end_section=row[7])
    return table, not ops_column and any(g.top_ops for g in summary.groups)


def _rows(summary: Summary) -> list[tuple]:
    """(region, step, occ, rank, wall, ratio, ops, end_section, gpu) per rank of every group
    (gpu blank for a trace without kernels)."""
    from rich.text import Text

    rows = []
    for number, group in enumerate(summary.groups):
        mixed_roles = group.fused and len({r.role for r in group.ranks}) > 1
        for row, rank in enumerate(group.ranks):
            median = group.median_ms
            ratio = Text(f"{rank.wall_ms / median:.2f}" if median > 0 else "1.00")
            if not math.isfinite(rank.wall_ms / median if median > 0 else 1.0) or len(ratio) > 8:
                ratio = Text("?")
            is_max = rank.wall_ms == group.max_ms
            ops = _ops_lines(group.top_ops) if row == 0 else []
            if rank.rank == group.straggler and is_max:
                ratio.append(" straggler", style="bold red")
                if rank.top_ops:
                    ops += [f"rank {rank.rank}:"] + _ops_lines(rank.top_ops)
            elif rank.rank == group.slowest and is_max and len(group.ranks) > 1:
                ratio.append(" slowest")
            region = safe_text(group.label) if row == 0 else ""
            if mixed_roles:  # which roles this rank's fused trace holds
                region = "\n".join(filter(None, [region, f"  ran {safe_text(rank.role)}"]))
            rows.append(
                (
                    region,
                    str(group.step) if row == 0 else "",
                    str(group.occurrence) if row == 0 else "",
                    str(rank.rank),
                    format_ms(rank.wall_ms),
                    ratio,
                    "\n".join(ops),
                    row == len(group.ranks) - 1 and number < len(summary.groups) - 1,
                    "" if rank.gpu_ms is None else format_ms(rank.gpu_ms),
                )
            )
    return rows


def _ops_lines(ops: Sequence[OpTime]) -> list[str]:
    return [f"{format_ms(op.self_ms):>6} {safe_text(op.name)}" for op in ops]


def default_title(directory: str | os.PathLike[str], summary: Summary) -> str:
    """``<n> trace(s) in <dir>, <g> group(s)``."""
    count = sum(len(g.ranks) for g in summary.groups)
    return f"{count} trace(s) in {os.fspath(directory)}, {len(summary.groups)} group(s)"
