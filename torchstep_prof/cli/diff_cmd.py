"""``torchstep-prof diff``: what changed between two runs, or two steps of one run.

``torchstep-prof diff BASE TEST`` compares two trace folders; ``diff DIR --step A --step B``
two steps of one folder. Per region its mean wall time, per operator its mean self time and
calls per trace, largest change first; ``--json`` for machines."""

from __future__ import annotations

import argparse
import json
import sys

from . import _tracedir
from ..rendering import format_ms, safe_text

HELP = "what changed between two trace folders (or two steps): time and calls per region and op"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diff",
        help=HELP,
        description=HELP + ". Times and calls are means per trace, so runs of different step or "
        "rank counts compare; rows are sorted by the absolute time difference.",
    )
    parser.add_argument("directory", metavar="BASE", help="the folder of the base traces")
    parser.add_argument("test", metavar="TEST", nargs="?", help="the folder of the traces to compare")
    parser.add_argument("-r", "--recursive", action="store_true", help="also read the traces in subfolders")
    _tracedir.add_filter_arguments(parser)
    parser.add_argument(
        "--top", type=_tracedir.int_at_least(1), default=20, metavar="N",
        help="operator rows to show (default 20)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.analysis.diff import diff_to_dict, diff_traces

    if args.test is None and len(args.step) != 2:
        parser.error("give two folders (BASE TEST), or one folder and two steps (--step A --step B)")
    if args.test is None:  # two steps of one folder
        sides = [(args.directory, [step], f"{args.directory} step {step}") for step in args.step]
    else:
        sides = [(args.directory, args.step, args.directory), (args.test, args.step, args.test)]
    traces = []
    for folder, steps, _ in sides:
        side_args = argparse.Namespace(**{**vars(args), "directory": folder, "step": steps})
        infos = _tracedir.usable_traces(side_args, _tracedir.filters_from_args(parser, side_args))
        if isinstance(infos, int):
            return infos
        traces.append(infos)
    result = diff_traces(traces[0], traces[1], base_label=sides[0][2], test_label=sides[1][2])
    if args.json:
        json.dump(diff_to_dict(result, top=args.top), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_tables(result, args.top)
    _tracedir.report_unreadable(result.skipped)
    return _tracedir.EXIT_OK


def _print_tables(result, top: int) -> None:
    def opt(value: float | None) -> str:
        return "-" if value is None else format_ms(value)

    print(f"base: {safe_text(result.base)}\ntest: {safe_text(result.test)}\n")
    print("Regions (mean wall ms per trace), largest change first:")
    regions = [
        [
            safe_text(r.region),
            opt(r.base_ms),
            opt(r.test_ms),
            f"{r.delta_ms:+.1f}",
            f"{r.base_traces}/{r.test_traces}",
        ]
        for r in result.regions
    ]  # fmt: skip
    _tracedir.print_columns([["region", "base ms", "test ms", "delta ms", "traces"], *regions], right=range(1, 5))
    shown = result.ops[:top]
    print(f"\nOperators (mean self ms and calls per trace), {len(shown)} of {len(result.ops)}, largest change first:")
    ops = [
        [
            safe_text(o.region),
            safe_text(o.name),
            format_ms(o.base_ms),
            format_ms(o.test_ms),
            f"{o.delta_ms:+.2f}",
            f"{_count(o.base_count)} -> {_count(o.test_count)}",
            "" if o.status == "changed" else o.status,
        ]
        for o in shown
    ]  # fmt: skip
    header = ["region", "operator", "base ms", "test ms", "delta ms", "calls", ""]
    _tracedir.print_columns([header, *ops], right=range(2, 7))


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"
