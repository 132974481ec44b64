"""The table printed at interpreter exit: the traces this process wrote, its hook runs, and what
profiling cost. Rows come from :func:`torchstep_prof.record_store`; rendering takes a ``Console`` so
tests can pass a fixed-width one writing to a buffer."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .record_store import ProfilingRecords, records

if TYPE_CHECKING:  # rich costs ~70 ms to import: only when a summary is printed
    from rich.console import Console
    from rich.table import Table

__all__ = ["print_summary", "render_summary"]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _short_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return relative if len(relative) < len(path) else path


def _display(path: str, folder: str | None) -> str:
    return os.path.basename(path) if folder is not None else _short_path(path)


def render_summary(data: ProfilingRecords) -> Table:
    """The summary of ``data`` as one rich ``Table`` (traces as rows; hooks, costs and missed
    steps in its caption)."""
    from rich.table import Table

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
    table = Table(
        title=f"torchstep_prof{rank_label} (pid {os.getpid()}): {len(written)} trace(s) written{where}",
        title_justify="left",
        caption_justify="left",
        expand=False,
    )
    table.add_column("role")
    table.add_column("stage")
    table.add_column("step", justify="right")
    table.add_column("rank", justify="right")
    table.add_column("wall ms", justify="right")
    table.add_column("size", justify="right")
    table.add_column("file", overflow="fold")
    for trace in data.traces:
        table.add_row(
            trace.role,
            trace.stage,
            str(trace.step),
            str(trace.rank),
            f"{trace.wall_s * 1000:.1f}",
            _size(trace.size_bytes) if trace.ok else "-",
            _display(trace.path, folder) if trace.path else f"NOT WRITTEN: {trace.error}",
        )
    lines = []
    for hook in data.hooks:
        code = "-" if hook.exit_code is None else str(hook.exit_code)
        extra = f"; {hook.message}" if hook.message and not hook.ok else ""
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
    if data.missed_steps:
        lines.append(f"selected but never ran: step(s) {', '.join(map(str, data.missed_steps))}")
    lines.extend(data.attention)
    table.caption = "\n".join(lines)
    return table


def print_summary(data: ProfilingRecords, console: Console | None = None) -> None:
    """Print the summary of ``data`` (to stdout unless ``console`` is given)."""
    from rich.console import Console

    if console is None:
        # Piped to a log: no colour codes (rich's default), and wide enough not to fold file
        # names (COLUMNS when set, else 160) rather than rich's 80.
        width = None if sys.stdout.isatty() else _log_width()
        console = Console(file=sys.stdout, width=width)
    console.print(render_summary(data))


_LOG_WIDTH = 160  # a log line may be long; a folded file name is hard to copy


def _log_width() -> int:
    try:
        return max(int(os.environ.get("COLUMNS", "")), 80)
    except ValueError:
        return _LOG_WIDTH


def print_summary_at_exit(wanted: bool) -> None:
    """The at-exit summary, when this process wrote a trace or ran a hook, and ``wanted`` (the
    ``summary`` field of the config it profiled under) and the environment allow it."""
    from .environment import summary_disabled

    data = records()
    if data and wanted and not summary_disabled():
        print_summary(data)
