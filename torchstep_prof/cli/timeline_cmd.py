"""``torchstep-prof timeline DIR``: each step across every process of a job, from its span files or traces.

Reads the span log (``tsp.spans``, ``run --spans``), or else the spans written traces carry
(the traced steps only): per step, each process's busy and idle
time, what each idle gap waited for, the critical path, the long tail, the idle share per role,
with a verdict first; ``--json`` for machines (docs/timeline.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import _tracedir

HELP = (
    "each step across every process from span files (tsp.spans) or traces: idle time, what it waited for, critical path"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("timeline", help=HELP, description=HELP + ".")
    parser.add_argument("directory", metavar="DIR", help="folder of span files (spans.dir) or of traces")
    parser.add_argument(
        "--step",
        metavar="N",
        type=_tracedir.int_at_least(0),
        action="append",
        help="show step N in detail (repeatable; default: the slowest step)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..rendering import safe_text
    from ..timeline.ledger import build_ledger
    from ..timeline.sources import read_timeline_folder
    from ..timeline.output import ledger_lines, ledger_to_dict

    folder = args.directory
    if not os.path.isdir(folder):
        parser.error(f"{safe_text(folder)}: not a folder")
    spans = read_timeline_folder(folder)
    ledger = build_ledger(spans)
    if args.json:
        doc = {"source": spans.source, "note": spans.note, **ledger_to_dict(ledger, folder)}
        json.dump(doc, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
    else:
        if spans.note is not None:
            print(safe_text(f"note: {spans.note}"))
        elif spans.source == "traces" and ledger.processes:
            print(safe_text(f"read from the spans the traces in {folder} carry: the traced steps only"))
        for line in ledger_lines(ledger, folder, args.step):
            print(line)
    if not ledger.processes:
        print(
            safe_text(f"{_tracedir.PROG} timeline: no span file, and no trace carrying spans, in {folder}"),
            file=sys.stderr,
        )
        return _tracedir.EXIT_NO_TRACE
    return _tracedir.EXIT_OK
