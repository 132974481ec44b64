"""The table printed at interpreter exit: traces written, hook runs, profiling costs.

One line per trace this process wrote, then its hook runs and what profiling cost. Rows come
from ``records()`` (``summary/records.py``); rendering takes a ``Console`` so tests can pass a
fixed-width one writing to a buffer."""

from __future__ import annotations

import io
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any, List, Sequence, Tuple

from ..errors import TraceWriteWarning, warn
from ..rendering import format_ms, format_size, print_stripped, safe_text, wrap_label
from ..naming import TraceName, format_timestamp, parse_trace_name
from .records import HookRecord, ProfilingRecords, TraceRecord, records

if TYPE_CHECKING:  # rich costs ~70 ms to import: only when a summary is printed
    from rich.console import Console, Group
    from rich.table import Table

__all__ = ["print_summary", "render_summary"]


def _short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return relative if len(relative) < len(path) else path


def _file_cells(traces: list[TraceRecord], folder: str | None, pid: int) -> tuple[list[str], str]:
    """The file column's cells and, when they are shortened, the line that says how.

    In one folder, a row's name holds only its role, stage, step, rank (all in other columns),
    the world size and pid (in the title) and the start time: the time, less the digits every
    row shares (the date, usually), tells the rows apart.
    """
    names: list[TraceName | None] = []
    for trace in traces:
        try:
            names.append(parse_trace_name(trace.path) if trace.path else None)
        except ValueError:
            names.append(None)
    written = [(t, n) for t, n in zip(traces, names) if t.path]
    shortened = folder is not None and all(
        n is not None and n.pid == pid and (n.role, n.stage, n.step, n.rank) == (t.role, t.stage, t.step, t.rank)
        for t, n in written
    )
    if not shortened:
        cells = [_display(t.path, folder) if t.path else "NOT WRITTEN" for t in traces]
        return cells, ""

    def tail(name: TraceName) -> str:  # what follows the pid in the name
        part = f"_part{name.part}" if name.part else ""
        return f"{format_timestamp(name.timestamp)}{part}{'.json.gz' if name.gzip else '.json'}"

    stamps = [format_timestamp(n.timestamp) for _, n in written if n is not None]
    common = len(os.path.commonprefix(stamps)) if len(stamps) > 1 else 8
    cut = min(common, 8)  # keep the time of day (HHMMSS + ms): a reader matches it by eye
    short = [None if name is None else (f"…{tail(name)[cut:]}" if cut else tail(name)) for name in names]
    # Two traces started in the same millisecond share the time: those rows show their whole
    # file name, so that no two rows show the same cell (nor one a cell the other's name ends with).
    cells = [
        "NOT WRITTEN"
        if cell is None
        else (os.path.basename(trace.path) if short.count(cell) > 1 and trace.path else cell)
        for cell, trace in zip(short, traces)
    ]
    world = traces[0].world_size
    rank = "<rank>" if len({t.rank for t in traces}) > 1 else str(traces[0].rank)
    how = f"file: the end of <role>_<stage>_step<n>_rank{rank}-of-{world}_pid{pid}_<UTC time>.json"
    return cells, how


_Column = Tuple[str, str, List[str]]  # header, justification, cells
_LABELS = ("role", "stage")
_MIN_LABEL = 8  # a folded role or stage keeps this many characters a line at least
MAX_ROWS = 20
"""Traces the table shows at most: the ones not written and the longest; a line under it counts
the others and names the command that lists them all."""


def _rows_shown(traces: tuple[TraceRecord, ...]) -> list[TraceRecord]:
    """Every trace, in the order written, when they fit in :data:`MAX_ROWS`; else those not
    written, then the longest, longest first."""
    if len(traces) <= MAX_ROWS:
        return list(traces)
    return sorted(traces, key=lambda t: (t.ok, -t.wall_s))[:MAX_ROWS]


def _natural_width(table: Table) -> int:
    """The width rich lays ``table`` out in when nothing limits it."""
    from rich.console import Console
    from rich.measure import Measurement

    console = Console(file=io.StringIO(), width=100_000)
    return Measurement.get(console, console.options, table).maximum


def _fold_labels(columns: list[_Column], natural: int, width: int) -> list[_Column]:
    """The columns with the role and stage cells folded so that a table ``natural`` characters
    wide fits ``width``: the numbers keep their width, the stage keeps its own when it can, the
    role takes what is left."""
    label_width = {h: max([len(h), *map(len, cells)]) for h, _, cells in columns if h in _LABELS}
    room = width - (natural - sum(label_width.values()))
    stage_width = min(label_width["stage"], max(_MIN_LABEL, room // 3))
    fold_to = {"role": max(_MIN_LABEL, room - stage_width), "stage": stage_width}
    return [
        (h, justify, [wrap_label(cell, fold_to[h]) for cell in cells] if h in _LABELS else cells)
        for h, justify, cells in columns
    ]


def _table(columns: list[_Column], padded: bool) -> Table:
    """The rich table of ``columns``; rich lays it out. No header or number is ever cut (each
    column is at least as wide as both); labels arrive folded to fit."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        collapse_padding=True,
        expand=False,
        padding=(0, 1) if padded else 0,  # plus the box's one-space column separator
    )
    for header, justify, cells in columns:
        lines = "\n".join(cells).split("\n")
        table.add_column(
            header,
            justify=justify,  # type: ignore[arg-type]  # rich's Literal; ours are 'left'/'right'
            no_wrap=True,
            min_width=max([len(header), *map(len, lines)]),
            overflow="ellipsis",
        )
    for row in zip(*(cells for _, _, cells in columns)):
        table.add_row(*(Text(cell) for cell in row))
    return table


def _display(path: str, folder: str | None) -> str:
    return os.path.basename(path) if folder is not None else _short_path(path)


def _gpu_column(traces: Sequence[TraceRecord]) -> list[_Column]:
    """The ``gpu ms`` column (time CUDA kernels ran inside each region: traces/reading/gpu_time.py),
    blank for a trace without kernels; none when no trace holds kernels."""
    if all(t.gpu_ms is None for t in traces):
        return []
    return [("gpu ms", "right", ["" if t.gpu_ms is None else format_ms(t.gpu_ms) for t in traces])]


def render_summary(data: ProfilingRecords, width: int | None = None) -> Group:
    """The summary of ``data``: a title, one table line per trace (the longest
    :data:`MAX_ROWS` when there are more), then hooks, costs and what needs attention, one line
    each. ``width`` (the console's) decides whether file names fit as a column or are listed
    under the table."""
    from rich.console import Group
    from rich.text import Text

    pid = os.getpid()
    rank_label = ""
    if data.traces:
        first = data.traces[0]
        rank_label = f" rank {first.rank} of {first.world_size}"
    elif data.hooks:
        rank_label = f" rank {data.hooks[0].rank}"
    written = [t.path for t in data.traces if t.path]
    folders = {os.path.dirname(p) for p in written}
    # All in one folder (the usual case): name it once in the title, keep the rows short.
    folder = folders.pop() if len(folders) == 1 else None
    where = f" to {_short_path(folder) or '.'}" if folder is not None else ""
    title = f"torchstep_prof{rank_label} (pid {pid}): {len(written)} trace(s) written{where}"
    shown = _rows_shown(data.traces)
    files, how = _file_cells(shown, folder, pid)
    show_occ = any(t.occurrence > 1 for t in shown)
    columns: list[_Column] = [
        ("role", "left", [safe_text(t.role) for t in shown]),
        ("stage", "left", [safe_text(t.stage) for t in shown]),
        ("step", "right", [str(t.step) for t in shown]),
        *([("occ", "right", [str(t.occurrence) for t in shown])] if show_occ else []),
        ("rank", "right", [str(t.rank) for t in shown]),
        ("wall ms", "right", [format_ms(t.wall_s * 1000) for t in shown]),
        *_gpu_column(shown),
        ("size", "right", [format_size(t.size_bytes) if t.ok else "-" for t in shown]),
        ("file", "left", [safe_text(cell) for cell in files]),
    ]
    # The first layout rich fits in the console: two spaces between columns, then one, then
    # without the file column (the names then listed under the table), and last with the role
    # and stage folded after a "-" (never a number cut: step, rank, wall time and size keep
    # their width whatever the labels).
    layouts = [(columns, True), (columns, False), (columns[:-1], True), (columns[:-1], False)]
    for chosen, padded in layouts:
        table = _table(chosen, padded)
        if width is None or _natural_width(table) <= width:
            break
    else:  # not even the narrowest fits whole: fold its labels to what is left
        table = _table(_fold_labels(chosen, _natural_width(table), width or 0), False)
    parts: list[Any] = [Text(safe_text(title))]
    if data.traces:
        parts.append(table)
    lines: list[str] = []
    if len(chosen) < len(columns):
        parts.append(Text("files, in the order of the rows:"))
        # A file name is copied whole: longer than the console, it runs past the edge unfolded.
        parts += [
            Text(f"  {safe_text(_display(t.path, folder))}", no_wrap=True, overflow="ignore") for t in shown if t.path
        ]
    elif how:
        lines.append(how)
    if len(shown) < len(data.traces):
        lines.append(_more_line(len(data.traces), len(shown), folder))
    for trace in data.traces:
        if not trace.ok:
            lines.append(f"NOT WRITTEN: {trace.role}/{trace.stage} step {trace.step}: {trace.error}")
    for hook in data.hooks:
        code = "-" if hook.exit_code is None else str(hook.exit_code)
        extra = _hook_detail(hook)
        missing = f"; no word from local ranks {list(hook.missing_ranks)}" if hook.missing_ranks else ""
        lines.append(
            f"hook on rank {hook.rank}: {hook.outcome}, exit code {code}, {hook.duration_s:.2f} s{missing}{extra}"
        )
    costs = data.costs
    lines.append(
        f"profiling cost {costs.total_s * 1000:.0f} ms: warm-up {costs.warmup_s * 1000:.0f}, "
        f"start {costs.start_s * 1000:.1f}, stop {costs.stop_s * 1000:.1f}, export {costs.export_s * 1000:.1f}"
        + (f", waiting for node-mates {costs.hook_wait_s * 1000:.0f}" if costs.hook_wait_s else "")
        + (f", waiting for the writer {costs.writer_wait_s * 1000:.1f}" if costs.writer_wait_s >= 0.00005 else "")
    )
    if data.missed_steps or data.missed_steps_unlisted:
        lines.append(_missed_line(data))
    lines.extend(data.attention)
    lines.extend(_metrics_lines())
    parts.extend(Text(safe_text(line)) for line in lines)
    return Group(*parts)


def _hook_detail(hook: HookRecord) -> str:
    """What a failed hook's message adds to its outcome and exit code, already on the line:
    ``; last stderr line: 'x'``, not ``; failed with exit code 3 (last stderr line: 'x')``."""
    if hook.ok or not hook.message:
        return ""
    detail = hook.message
    said = f"failed with exit code {hook.exit_code}"
    if detail.startswith(said):
        detail = detail[len(said) :].strip()
        if detail.startswith("(") and detail.endswith(")") and detail.count("(") == 1:
            detail = detail[1:-1]
    return f"; {detail}" if detail else ""


def _more_line(total: int, shown: int, folder: str | None) -> str:
    """``268 more not shown (the table holds the 20 longest): torchstep-prof ls DIR``."""
    where = shlex.quote(_short_path(folder) or ".") if folder is not None else "DIR"
    return f"{total - shown} more not shown (the table holds the {shown} longest): torchstep-prof ls {where}"


def _metrics_lines() -> list[str]:
    """A line per (role, stage) and one for steps when metrics are on (region_metrics/recorder.py)."""
    recorder = sys.modules.get("torchstep_prof.region_metrics.recorder")
    return list(recorder.summary_lines()) if recorder is not None and recorder.BOUNDS else []


def _missed_line(data: ProfilingRecords) -> str:
    """``steps 3-999999 never ran``: the selected steps that never ran, as ranges, one line."""
    ranges = data.missed_steps
    listed = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
    more = f"{' and' if listed else ''} {data.missed_steps_unlisted} more" if data.missed_steps_unlisted else ""
    single = len(ranges) == 1 and ranges[0][0] == ranges[0][1] and not more
    return f"{'step' if single else 'steps'} {listed}{more} never ran (selected by the schedule)"


def print_summary(data: ProfilingRecords, console: Console | None = None) -> None:
    """Print the summary of ``data`` (to stdout unless ``console`` is given): one line per
    trace, no word folded, no trailing spaces."""
    from rich.console import Console

    if console is None:
        # Piped to a log: no colour codes (rich's default), and wide enough not to fold file
        # names (COLUMNS when set, else 160) rather than rich's 80.
        width = None if sys.stdout.isatty() else _log_width()
        console = Console(file=sys.stdout, width=width)
    # crop=False: a file name listed under the table is never cut at the console's edge.
    print_stripped(console, render_summary(data, console.width), crop=False)


_LOG_WIDTH = 160  # a log line may be long; a folded file name is hard to copy


def _log_width() -> int:
    try:
        return max(int(os.environ.get("COLUMNS", "")), 80)
    except ValueError:
        return _LOG_WIDTH


def print_summary_at_exit(wanted: bool) -> None:
    """The at-exit summary, when this process wrote a trace or ran a hook, and ``wanted`` (the
    ``summary`` field of the config it profiled under) and the environment allow it."""
    from ..config.environment import summary_disabled

    try:
        data = records()  # waits for the traces still being written
    except KeyboardInterrupt:
        # Ctrl-C while traces are still written (at_exit's own wait handles the usual case, a
        # Ctrl-C while it flushes): exit now, saying what is lost.
        warn(
            "torchstep_prof: interrupted at exit; exiting without the traces not yet on disk (no summary)",
            TraceWriteWarning,
        )
        return
    if (data or _metrics_lines()) and wanted and not summary_disabled():
        print_summary(data)
