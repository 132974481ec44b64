"""What the trace subcommands share: folder, filters, scanning, skipped files.

Scanning shows a progress bar; the files that could not be read are reported, not
silently dropped."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from typing import TYPE_CHECKING, Callable, Container, Iterator, Sequence

import attrs

from ..rendering import safe_text
from ..traces.reading.files import TraceFilter, TraceInfo, Unreadable, find_trace_files
from ..naming import parse_trace_name

if TYPE_CHECKING:
    from ..traces.analysis.runs import OtherRun

PROG = "torchstep-prof"

EXIT_OK = 0
EXIT_NO_TRACE = 1  # nothing usable found: an empty folder, only bad files, or filters match none
EXIT_FAILED = 1  # an output that could not be written
EXIT_USAGE = 2  # as argparse: a bad argument, a folder that cannot be listed

PROGRESS_MIN_FILES = 50
"""A progress bar shows (on a terminal) when a folder holds at least this many trace files."""


def add_folder_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", help="folder of trace files (save_path)")
    parser.add_argument("-r", "--recursive", action="store_true", help="also read the traces in DIR's subfolders")


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters (each may be repeated; a trace passes any value)")
    group.add_argument("--role", action="append", default=[], metavar="ROLE")
    group.add_argument("--stage", action="append", default=[], metavar="STAGE")
    group.add_argument("--step", action="append", default=[], type=int, metavar="N")
    group.add_argument("--rank", action="append", default=[], type=int, metavar="R")
    add_pid_argument(group)


def add_pid_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--pid",
        action="append",
        default=[],
        type=int,
        metavar="P",
        help="the run (process id) to read; default: the newest run of each rank",
    )


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """``--jobs N`` and ``--no-cache``: how a large folder is read (see
    :mod:`torchstep_prof.traces.reading.cache`)."""
    parser.add_argument(
        "-j",
        "--jobs",
        type=int_at_least(1),
        metavar="N",
        help="processes reading traces (default: the CPU cores; 1 reads in this process)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="read every file again, neither using nor updating the per-file summary cache",
    )


def filters_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TraceFilter:
    try:
        return TraceFilter(roles=args.role, stages=args.stage, steps=args.step, ranks=args.rank, pids=args.pid)
    except ValueError as exc:
        parser.error(str(exc))


def error(message: str) -> None:
    print(f"{PROG}: {safe_text(message)}", file=sys.stderr)


def scan_folder(
    args: argparse.Namespace, filters: TraceFilter, *, top: int = 0
) -> tuple[list[TraceInfo], list[Unreadable]] | int:
    """Scan ``args.directory``; returns the exit code instead when the folder cannot be listed."""
    try:
        paths = find_trace_files(args.directory, recursive=args.recursive)
    except OSError as exc:
        error(f"cannot read folder {args.directory}: {exc.strerror or exc}")
        return EXIT_USAGE
    from ..traces.reading.cache import SummaryCache
    from ..traces.reading.parallel import default_jobs, scan_paths

    # A command without --jobs and --no-cache reads in this process, with no cache.
    jobs = (args.jobs or default_jobs()) if hasattr(args, "jobs") else 1
    cache = (
        None if getattr(args, "no_cache", True) else SummaryCache.for_folder(args.directory, recursive=args.recursive)
    )
    with _progress(len(paths)) as progress:
        scanned = scan_paths(paths, filters, top=top, jobs=jobs, cache=cache, progress=progress)
    if cache is not None and cache.problem:
        print(f"note: {cache.problem}", file=sys.stderr)
    return scanned


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[int, int], None] | None]:
    if total < PROGRESS_MIN_FILES or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("reading traces", total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def report_unreadable(unreadable: Sequence[Unreadable]) -> None:
    """One line per skipped file on stderr, naming it and saying why."""
    for item in unreadable:
        print(f"skipped {safe_text(item.path)}: {safe_text(item.reason)}", file=sys.stderr)


def newest_runs(infos: Sequence[TraceInfo]) -> tuple[list[TraceInfo], tuple[OtherRun, ...]]:
    """The newest run of each rank (see :mod:`torchstep_prof.traces.analysis.runs`), the others warned about."""
    from ..traces.analysis.runs import choose_runs, describe_other_runs

    kept, other_runs = choose_runs(infos)
    for line in describe_other_runs(other_runs):
        print(safe_text(line), file=sys.stderr)
    return kept, other_runs


def usable_traces(args: argparse.Namespace, filters: TraceFilter, *, one_run: bool = True) -> list[TraceInfo] | int:
    """The traces of ``args.directory`` that pass ``filters`` (the newest run of each rank
    unless ``one_run`` is False), skipped files reported; the exit code instead when the folder
    cannot be read or nothing usable is in it."""
    scanned = scan_folder(args, filters)
    if isinstance(scanned, int):
        return scanned
    infos, unreadable = scanned
    report_unreadable(unreadable)
    if not infos:
        return nothing_found(args, filters, unreadable)
    if one_run:
        infos, _ = newest_runs(infos)
    return infos


def nothing_found(args: argparse.Namespace, filters: TraceFilter, unreadable: Sequence) -> int:
    """Say why there is nothing to show; returns the exit code."""
    extra = f" ({len(unreadable)} file(s) skipped)" if unreadable else ""
    others = attrs.evolve(filters, pids=())
    skipped = {u.path for u in unreadable}
    here = _pids_by_name(args, others, skipped) if filters.pids else []
    if here:  # a --pid that matches no run: say which runs there are, not only "nothing"
        wanted = ", ".join(map(str, filters.pids))
        but = " matching the other filters" if others != TraceFilter() else ""
        error(
            f"no trace of pid {wanted}{but} in {args.directory}; pids here: "
            f"{', '.join(map(str, here))} (--pid chooses){extra}"
        )
        return EXIT_NO_TRACE
    what = "no usable trace"
    if filters != TraceFilter():
        what += " matching the filters"
    error(f"{what} in {args.directory}{extra}")
    spans = _span_folder_here(args) if filters == TraceFilter() else None
    if spans is not None:  # a span log, not a trace folder: the command that reads it
        error(f"{spans} holds span files: {PROG} timeline {shlex.quote(spans)}")
    return EXIT_NO_TRACE


def _span_folder_here(args: argparse.Namespace) -> str | None:
    """The span folder a trace command would read beside ``args.directory`` (``--spans``, else
    DIR or DIR/spans), when it holds span files: a folder with no trace may be a span log."""
    from ..traces.analysis.span_clocks import find_span_folder, holds_span_files

    folder = find_span_folder(args.directory, getattr(args, "spans", None))
    return folder if folder is not None and holds_span_files(folder) else None


def _pids_by_name(args: argparse.Namespace, filters: TraceFilter, skipped: set[str]) -> list[int]:
    """The pids in the names of the folder's traces that pass ``filters``, the ``skipped``
    files aside (no file is opened: this only words an error)."""
    pids: set[int] = set()
    try:
        paths = find_trace_files(args.directory, recursive=args.recursive)
    except OSError:
        return []
    for path in paths:
        if path in skipped:
            continue
        try:
            name = parse_trace_name(path)
        except ValueError:
            continue
        if filters.matches(name):
            pids.add(name.pid)
    return sorted(pids)


def print_columns(rows: Sequence[Sequence[str]], right: Container[int]) -> None:
    """``rows`` as aligned columns two spaces apart, the columns in ``right`` (numbers)
    right-aligned; no line ends with spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        sys.stdout.write("  ".join(cells).rstrip() + "\n")


def add_straggler_argument(parser: argparse.ArgumentParser) -> None:
    """``--straggler-ratio X``: the rule ``summarize``, its findings and ``report`` share."""
    from ..traces.analysis.summarize import DEFAULT_STRAGGLER_RATIO

    parser.add_argument(
        "--straggler-ratio",
        type=_ratio,
        default=DEFAULT_STRAGGLER_RATIO,
        metavar="X",
        help="a rank over X times its group's median (and 5 ms over it) is a straggler "
        f"(default {DEFAULT_STRAGGLER_RATIO})",
    )


def _ratio(text: str) -> float:
    value = float(text)
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {text})")
    return value


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer >= ``minimum`` (``--top``, ``--occurrence``)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} (got {value})")
        return value

    parse.__name__ = "integer"  # argparse names the type in its error: "invalid integer value"
    return parse
