"""``torchstep-prof status``: where each rank of a running job is, with a verdict first.

    torchstep-prof status /shared/job7/status            # the verdict, then one line per rank
    torchstep-prof status /shared/job7/status --stacks   # each rank's Python stack too
    torchstep-prof status /shared/job7/status --json     # for scripts

Reads the ``live-rank*.json`` files the job's ranks write (a ``stall`` section or an
``on_demand`` folder: docs/stall.md). Exit codes: 0 shown, 1 DIR does not exist or holds no
live status, 2 a usage error. The command never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..rendering import safe_text

__all__ = ["register", "status"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="where each rank of a running job is (step, region, collective), the rank holding the others first",
        description="Show the live status the ranks of a job write into DIR (its stall.dir or on_demand.dir).",
    )
    parser.add_argument("dir", metavar="DIR", help="the job's status folder (stall.dir, or its on_demand.dir)")
    parser.add_argument("--stacks", action="store_true", help="each rank's Python stack of its training thread")
    parser.add_argument("--json", action="store_true", help="print JSON: the verdict and every rank")
    parser.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    from ..live.status import read_lives
    from ..live.verdict import as_json, verdict, view

    folder = os.path.abspath(args.dir)
    if not os.path.isdir(folder):
        _error(f"{folder} does not exist (no job keeps its status there)")
        return 1
    statuses, bad = read_lives(folder)
    now = time.time()
    views = view(statuses, now)
    lines = verdict(views, now)
    if args.json:
        data: dict[str, Any] = {
            "folder": folder, "time": now, "verdict": lines, "ranks": as_json(views, now, args.stacks),
            "unreadable": bad,
        }  # fmt: skip
        print(json.dumps(data, indent=1))
        return 0 if statuses else 1
    for line in bad:
        _error(line)
    if not statuses:
        _error(f"{folder}: no rank keeps its live status here (no live-rank*.json)")
        return 1
    for line in lines:
        print(safe_text(line, 400))
    print()
    _table(views, now)
    if args.stacks:
        _stacks(views)
    return 0


def _error(text: str) -> None:
    print(safe_text(f"torchstep-prof status: {text}"), file=sys.stderr)


def _table(views: list[Any], now: float) -> None:
    rows = [("rank", "state", "step", "region (innermost)", "in it", "collective", "where")]
    for v in views:
        s = v.status
        region = s.regions[-1] if s.regions else None
        rows.append(
            (
                safe_text(s.name, 40), v.state + (f" ({v.age_s:.0f} s ago)" if v.state == "stale" else ""),
                "-" if s.step is None else str(s.step),
                safe_text(f"{region.role}/{region.stage}", 60) if region else "-",
                f"{max(0.0, now - region.since):.1f} s" if region else "-",
                safe_text(v.collective_text(), 40) if s.collective else "-",
                safe_text(s.where or "-", 120),
            )
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def _stacks(views: list[Any]) -> None:
    for v in views:
        s = v.status
        print()
        print(safe_text(f"{s.name}, pid {s.pid} on {s.host}: the training thread's stack (most recent call last)", 400))
        if not s.stack:
            print("  (none recorded)")
        for frame in s.stack:
            print(safe_text(f'  File "{frame["file"]}", line {frame["line"]}, in {frame["function"]}', 400))
            if frame["code"]:
                print(safe_text(f"    {frame['code']}", 400))
