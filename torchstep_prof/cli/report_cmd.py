"""``torchstep-prof report``: one self-contained HTML page of charts.

``torchstep-prof report DIR [-o report.html]`` shows what stands out, each group's wall time
per rank, each step's timeline and each region's top operators; with the job's span files
(``--spans``, else DIR or DIR/spans when they hold some) a Gantt of every process per step
(docs/timeline.md). Needs the ``[report]`` extra (plotly)."""

from __future__ import annotations

import argparse
import os

from . import _spans, _tracedir
from ..rendering import safe_text
from .._shared_files import replace_exclusively

HELP = "one HTML page of charts of the traces in DIR: stragglers, collective waits, memory, timelines, top operators"
DEFAULT_OUTPUT = "report.html"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help=HELP, description=HELP + ".")
    _tracedir.add_folder_argument(parser)
    _tracedir.add_filter_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        default=DEFAULT_OUTPUT,
        metavar="FILE",
        help=f"the page to write (default {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--top", type=_tracedir.int_at_least(1), default=10, metavar="N", help="operators per region (default 10)"
    )
    _tracedir.add_straggler_argument(parser)
    parser.add_argument(
        "--baseline",
        metavar="BASE",
        help="a folder of earlier traces: adds a section of what changed from them (as `diff`)",
    )
    _tracedir.add_scale_arguments(parser)
    _spans.add_spans_argument(parser)
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.report.page import PlotlyMissing, load_plotlyjs, render_page

    try:
        plotlyjs = load_plotlyjs()  # before reading: a missing extra is said at once
    except PlotlyMissing as exc:
        _tracedir.error(f"report: {exc}")
        return _tracedir.EXIT_USAGE

    from ..traces.analysis.findings import FINDINGS_DEPTH
    from ..traces.report.content import build_report

    filters = _tracedir.filters_from_args(parser, args)
    scanned = _tracedir.scan_folder(args, filters, top=max(args.top, FINDINGS_DEPTH))
    if isinstance(scanned, int):
        return scanned
    infos, unreadable = scanned
    _tracedir.report_unreadable(unreadable)
    infos, other_runs = _tracedir.newest_runs(infos)
    if not infos:
        return _tracedir.nothing_found(args, filters, unreadable)
    spans = _spans.load_ledger(args)
    if isinstance(spans, int):
        return spans
    spans_warning = _spans.warn_if_foreign(spans, infos) if spans is not None else None
    diff = None
    if args.baseline is not None:
        from ..traces.analysis.diff import diff_traces

        base_args = argparse.Namespace(**{**vars(args), "directory": args.baseline})
        base = _tracedir.usable_traces(base_args, filters)
        if isinstance(base, int):
            return base
        diff = diff_traces(base, infos, base_label=args.baseline, test_label=args.directory)
        _tracedir.report_unreadable(diff.skipped)
    report = build_report(
        args.directory,
        infos,
        unreadable,
        straggler_ratio=args.straggler_ratio,
        top=args.top,
        filters=_filter_words(args),
        other_runs=other_runs,
        diff=diff,
        spans=spans[0] if spans is not None else None,
        timeline=spans[1] if spans is not None else None,
        spans_warning=spans_warning,
    )
    try:
        # Under a new temporary name, then renamed: a reader never sees half a page, and a link
        # planted in the (maybe shared) trace folder is never written through.
        replace_exclusively(os.path.abspath(args.output), render_page(report, plotlyjs).encode("utf-8"))
    except OSError as exc:
        _tracedir.error(f"cannot write {args.output}: {exc.strerror or exc}")
        return _tracedir.EXIT_FAILED
    print(
        f"wrote {args.output}: {report.traces} trace(s), {len(report.summary.groups)} group(s), "
        f"{len(report.findings)} straggler(s), {len(unreadable)} file(s) skipped"
        + (
            f"; the timeline of {len(spans[1].processes)} process(es) from {safe_text(spans[0])}"
            if spans is not None
            else ""
        )
    )
    return _tracedir.EXIT_OK


def _filter_words(args: argparse.Namespace) -> list[str]:
    words = []
    for name in ("role", "stage", "step", "rank", "pid"):
        for value in getattr(args, name):
            words.append(f"--{name} {value}")
    return words
