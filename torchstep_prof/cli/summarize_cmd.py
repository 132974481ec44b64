"""``torchstep-prof summarize``: wall time per rank of each region and step, as a table or JSON.

Stragglers are flagged and the top operators listed by self time; when the traces carry spans
(or the folder holds span files) each step's timeline verdict follows; ``--json`` for machines."""

from __future__ import annotations

import argparse
import sys

from . import _tracedir
from ..rendering import print_stripped, safe_text

HELP = (
    "table of the traces in DIR by role/stage/step: wall time per rank, stragglers, top ops, collective waits, memory"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("summarize", help=HELP, description=HELP + ".")
    _tracedir.add_folder_argument(parser)
    _tracedir.add_filter_arguments(parser)
    parser.add_argument(
        "--top",
        type=_tracedir.int_at_least(0),
        default=5,
        metavar="N",
        help="operators to list by self time (default 5; 0 reads faster)",
    )
    _tracedir.add_straggler_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _tracedir.add_scale_arguments(parser)
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.analysis.collectives import find_waits, waits_to_dicts
    from ..traces.analysis.findings import FINDINGS_DEPTH, find_findings, findings_to_dicts
    from ..traces.analysis.memory import find_memory, memory_to_dicts
    from ..traces.analysis.timeline_section import find_timeline, render_timeline, timeline_to_dict
    from ..traces.analysis.summarize import (
        default_title,
        render_summary,
        summarize,
        summary_to_dict,
        trim_summary,
    )

    filters = _tracedir.filters_from_args(parser, args)
    # Findings and the late rank of collectives compare ranks operator by operator: read deeper
    # lists than --top shows (--top 0 reads no operator at all: faster).
    depth = max(args.top, FINDINGS_DEPTH) if args.json or args.top else 0
    scanned = _tracedir.scan_folder(args, filters, top=depth)
    if isinstance(scanned, int):
        return scanned
    infos, unreadable = scanned
    infos, other_runs = _tracedir.newest_runs(infos)
    deep = summarize(infos, unreadable, straggler_ratio=args.straggler_ratio, top=depth, other_runs=other_runs)
    summary = trim_summary(deep, args.top)
    waits, memory = find_waits(deep), find_memory(deep)
    pids = {info.pid for info in infos if info.pid is not None}
    timeline = find_timeline(args.directory, pids) if infos else None
    if args.json:
        doc = summary_to_dict(summary)
        doc["findings"] = findings_to_dicts(find_findings(deep))
        doc["collectives"] = waits_to_dicts(waits)
        doc["memory"] = memory_to_dicts(memory)
        if timeline is not None:
            doc["timeline"] = timeline_to_dict(timeline)
        from ..traces.reading._json import dumps_indented

        sys.stdout.write(dumps_indented(doc) + "\n")
        _tracedir.report_unreadable(unreadable)
    else:
        title = default_title(args.directory, summary)
        from rich.console import Console

        # The terminal's width, else COLUMNS, else 80 (rich's rules); colours on a terminal only.
        console = Console(file=sys.stdout)
        render_summary(summary, console, title=title)
        _render_diagnosis(console, waits, memory)
        if timeline is not None:
            render_timeline(timeline, console)
    if not infos:
        return _tracedir.nothing_found(args, filters, unreadable)
    return _tracedir.EXIT_OK


def _render_diagnosis(console, waits, memory) -> None:
    """The collective waits and the memory per region, one paragraph each, under the table."""
    from rich.text import Text

    from ..traces.analysis.collectives import describe_waits
    from ..traces.analysis.memory import describe_memory

    sections = (
        ("Collective waits (a rank's duration minus the shortest across ranks):", waits, describe_waits),
        ("Memory per region (peak above the region's start, net growth):", memory, describe_memory),
    )
    for heading, items, describe in sections:
        if items:
            print_stripped(console, Text(heading))
            for item in items:
                print_stripped(console, Text("  " + safe_text(describe(item))))
