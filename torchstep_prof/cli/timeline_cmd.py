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
    from ..rendering import safe_text, step_ranges
    from ..timeline.ledger import build_ledger
    from ..timeline.output import ledger_lines, ledger_to_dict
    from ..timeline.sources import read_timeline_folder

    folder = args.directory
    if not os.path.isdir(folder):
        parser.error(f"{safe_text(folder)}: not a folder")
    spans = read_timeline_folder(folder)
    ledger = build_ledger(spans)
    if not ledger.processes:  # nothing to show: the reason alone, on stderr
        _tracedir.error(f"timeline: no span file, and no trace carrying spans, in {folder}")
        return _tracedir.EXIT_NO_TRACE
    if args.step:
        known = {s.number for s in ledger.steps}
        missing = [n for n in args.step if n not in known]
        if missing:
            numbers = ", ".join(str(n) for n in missing)
            listed = step_ranges(known) or "none"
            why = (
                f"not traced (traced: {listed})" if spans.source == "traces" else f"not in the spans (steps: {listed})"
            )
            _tracedir.error(f"timeline: --step {numbers}: {why}")
            return _tracedir.EXIT_NO_TRACE
    if args.json:
        doc = {"source": spans.source, "note": spans.note, **ledger_to_dict(ledger, folder)}
        if args.step:
            doc["steps"] = [s for s in doc["steps"] if s["number"] in args.step]
        text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    else:
        lines = []
        if spans.note is not None:
            lines.append(safe_text(f"note: {spans.note}"))
        elif spans.source == "traces":
            lines.append(safe_text(f"read from the spans the traces in {folder} carry: the traced steps only"))
        lines += ledger_lines(ledger, folder, args.step)
        text = "".join(line + "\n" for line in lines)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader left: cli.main ends quietly, as cat does
    except OSError as exc:  # a full disk, a closed stdout: say so, never a traceback
        _tracedir.error(f"timeline: cannot write the output ({exc.strerror or exc})")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the unwritten rest is not tried again at exit
        return _tracedir.EXIT_FAILED
    return _tracedir.EXIT_OK
