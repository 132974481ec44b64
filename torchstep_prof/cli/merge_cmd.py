"""``torchstep-prof merge``: the selected traces as one Chrome trace.

``torchstep-prof merge DIR -o OUT`` writes one process track per file, aligned on wall-clock
time, or on one clock estimated from the job's span files when there are some (``--spans``,
docs/timeline.md)."""

from __future__ import annotations

import argparse
import sys

from . import _spans, _tracedir
from ..rendering import safe_text

HELP = "merge the traces in DIR into one Chrome trace, one track per file, on one timeline"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help=HELP,
        description=HELP + ". Tracks are named '<role>/<stage> rank <r> step <n>', with ' #k' "
        "for a region's k-th occurrence in its step (k >= 2). By default the newest run of each "
        "rank is merged; --pid chooses. With the job's span files (tsp.spans), each trace is moved "
        "by its process's clock offset estimated from clock anchors.",
    )
    _tracedir.add_folder_argument(parser)
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="the merged trace (.json, or .json.gz to compress it)",
    )
    _tracedir.add_filter_arguments(parser)
    _spans.add_spans_argument(parser)
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.analysis.merge import merge_traces
    from ..traces.analysis.span_clocks import JobClocks, describe_clocks

    filters = _tracedir.filters_from_args(parser, args)
    infos = _tracedir.usable_traces(args, filters)
    if isinstance(infos, int):
        return infos
    spans = _spans.load_ledger(args)
    if isinstance(spans, int):
        return spans
    clocks = None
    if spans is not None:
        folder, ledger = spans
        _spans.warn_if_foreign(spans, infos)
        clocks = JobClocks(folder=folder, reference=ledger.reference, processes=ledger.processes)
    try:
        result = merge_traces(infos, args.output, clocks=clocks)
    except ValueError as exc:  # every input changed since it was scanned
        _tracedir.error(f"merge failed: {exc}")
        return _tracedir.EXIT_NO_TRACE
    except OSError as exc:
        _tracedir.error(f"cannot write {args.output}: {exc.strerror or exc}")
        return _tracedir.EXIT_FAILED
    for path, reason in result.skipped:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    print(f"merged {len(result.tracks)} trace(s), {result.events} events, into {result.path}")
    if clocks is not None:
        print(safe_text(describe_clocks(result.clocks, clocks.folder)))
    return _tracedir.EXIT_OK
