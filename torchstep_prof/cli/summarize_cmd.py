"""``torchstep-prof summarize``: wall time per rank of each region and step, as a table or JSON.

``torchstep-prof summarize DIR``: wall time per rank of each region and step, stragglers
flagged, top operators by self time; ``--json`` for machines."""

from __future__ import annotations

import argparse
import json
import sys

from . import _tracedir

HELP = "table of the traces in DIR by role/stage/step: wall time per rank, stragglers, top ops"


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
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.findings import FINDINGS_DEPTH, find_findings, findings_to_dicts
    from ..traces.summarize import default_title, render_summary, summarize, summary_to_dict

    filters = _tracedir.filters_from_args(parser, args)
    # --json's findings compare ranks operator by operator: read deeper lists than --top shows.
    depth = max(args.top, FINDINGS_DEPTH) if args.json else args.top
    scanned = _tracedir.scan_folder(args, filters, top=depth)
    if isinstance(scanned, int):
        return scanned
    infos, unreadable = scanned
    infos, other_runs = _tracedir.newest_runs(infos)
    summary = summarize(
        infos,
        unreadable,
        straggler_ratio=args.straggler_ratio,
        top=args.top,
        other_runs=other_runs,
    )
    if args.json:
        doc = summary_to_dict(summary)
        deep = summarize(infos, unreadable, straggler_ratio=args.straggler_ratio, top=depth)
        doc["findings"] = findings_to_dicts(find_findings(deep))
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        _tracedir.report_unreadable(unreadable)
    else:
        title = default_title(args.directory, summary)
        render_summary(summary, _tracedir.output_console(), title=title)
    if not infos:
        return _tracedir.nothing_found(args, filters, unreadable)
    return _tracedir.EXIT_OK
