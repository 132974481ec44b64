"""``torchstep-prof ls DIR``: one line per trace with its fields, sorted by role, stage, step
and rank."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from . import _tracedir

HELP = "one line per trace in DIR: role, stage, step, rank, world size, wall time, size, path"

_COLUMNS = ("role", "stage", "step", "rank", "world", "wall_ms", "size", "path")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ls", help=HELP, description=HELP + ".")
    _tracedir.add_folder_argument(parser)
    _tracedir.add_filter_arguments(parser)
    parser.add_argument(
        "--json", action="store_true", help="one JSON object per line instead of columns"
    )
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    infos = _tracedir.usable_traces(args, _tracedir.filters_from_args(parser, args))
    if isinstance(infos, int):
        return infos
    rows = [
        {
            "role": i.role,
            "stage": i.stage,
            "step": i.step,
            "rank": i.rank,
            "world": i.world_size,
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
    cells = [list(_COLUMNS)] + [
        [
            row["role"],
            row["stage"],
            str(row["step"]),
            str(row["rank"]),
            str(row["world"]),
            f"{row['wall_ms']:.1f}",
            _size_text(row["size"]),
            row["path"],
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS) - 1)]
    right = {2, 3, 4, 5, 6}  # numbers
    for line in cells:
        padded = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        ]
        sys.stdout.write("  ".join(padded + [line[-1]]) + "\n")


def _size_text(size: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if size < 1024 or unit == "MiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover
