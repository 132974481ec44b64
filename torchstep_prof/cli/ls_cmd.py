"""``torchstep-prof ls``: one line per trace with its fields.

Sorted by role, stage, step, occurrence and rank. Every run in the folder is listed (the pid column tells them apart);
``--pid`` filters."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import _tracedir
from ..rendering import format_ms, format_size, safe_text

HELP = "one line per trace in DIR: role, stage, step, occurrence, rank, world size, pid, wall time, size, path"

_COLUMNS = ("role", "stage", "step", "occ", "rank", "world", "pid", "wall_ms", "size", "path")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ls", help=HELP, description=HELP + ".")
    _tracedir.add_folder_argument(parser)
    _tracedir.add_filter_arguments(parser)
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of columns")
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    infos = _tracedir.usable_traces(args, _tracedir.filters_from_args(parser, args), one_run=False)
    if isinstance(infos, int):
        return infos
    rows = [
        {
            "role": i.role,
            "stage": i.stage,
            "step": i.step,
            "occurrence": i.occurrence,
            "rank": i.rank,
            "world": i.world_size,
            "pid": i.pid,
            "wall_ms": round(i.wall_ms, 3),
            "size": i.size_bytes,
            "path": i.path,
        }
        for i in infos
    ]
    if args.json:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
    else:
        _print_columns(rows)
    return _tracedir.EXIT_OK


def _print_columns(rows: Sequence[dict]) -> None:
    cells = [_COLUMNS] + [
        [
            safe_text(row["role"]),
            safe_text(row["stage"]),
            str(row["step"]),
            str(row["occurrence"]),
            str(row["rank"]),
            str(row["world"]),
            "-" if row["pid"] is None else str(row["pid"]),
            format_ms(row["wall_ms"]),
            format_size(row["size"]),
            safe_text(row["path"]),
        ]
        for row in rows
    ]
    _tracedir.print_columns(cells, right=range(2, 9))  # the numbers
