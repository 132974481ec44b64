"""``torchstep-prof merge``: the selected traces as one Chrome trace.

``torchstep-prof merge DIR -o OUT`` writes one process track per file, aligned on wall-clock
time."""

from __future__ import annotations

import argparse
import sys

from . import _tracedir

HELP = "merge the traces in DIR into one Chrome trace, one track per file, on one timeline"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "merge",
        help=HELP,
        description=HELP + ". Tracks are named '<role>/<stage> rank <r> step <n>', with ' #k' "
        "for a region's k-th occurrence in its step (k >= 2). By default the newest run of each "
        "rank is merged; --pid chooses.",
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
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.analysis.merge import merge_traces
    from ..traces.reading.files import TraceReadError

    filters = _tracedir.filters_from_args(parser, args)
    infos = _tracedir.usable_traces(args, filters)
    if isinstance(infos, int):
        return infos
    try:
        result = merge_traces(infos, args.output, skip_bad=True)
    except ValueError as exc:  # every input changed since it was scanned
        _tracedir.error(f"merge failed: {exc}")
        return _tracedir.EXIT_NO_TRACE
    except TraceReadError as exc:  # pragma: no cover - skip_bad names such inputs instead
        _tracedir.error(f"merge failed: {exc}")
        return _tracedir.EXIT_FAILED
    except OSError as exc:
        _tracedir.error(f"cannot write {args.output}: {exc.strerror or exc}")
        return _tracedir.EXIT_FAILED
    for path, reason in result.skipped:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    print(f"merged {len(result.tracks)} trace(s), {result.events} events, into {result.path}")
    return _tracedir.EXIT_OK
