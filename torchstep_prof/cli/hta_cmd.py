"""``torchstep-prof hta``: the folder layout HolisticTraceAnalysis reads, one trace per rank.

``torchstep-prof hta DIR --role R --stage S --step N [--occurrence K] -o OUT``.

Occurrence K (default 1) of the region is taken; other occurrences are named as left out, never
linked as if they were ranks. Fused traces of the step are found by any role they hold
(``--role trainer --stage train`` finds rank 0's ``eval-trainer`` trace too). Of several runs in
the folder, the newest of each rank is used unless ``--pid`` chooses.

HTA lists the ``.json`` / ``.gz`` files at the top of a folder and takes each file's rank from the
first ``"rank": <n>`` it finds in the text (``distributedInfo``), silently keeping one file per
rank and calling a file without one rank 0. So OUT gets exactly one trace per rank of the chosen
region and step, linked (copied where links fail); a file in which HTA would read the wrong rank
is copied with ``distributedInfo`` set first.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
from typing import TYPE_CHECKING

from . import _tracedir
from .._shared_files import replace_exclusively

if TYPE_CHECKING:
    from ..traces.reading.files import TraceInfo

HELP = "link one trace per rank of a region and step into OUT, the layout HTA reads"

_HTA_RANK = re.compile(r'"rank":\s+(\d+)')  # the pattern HTA itself searches line by line
_HTA_SUFFIXES = (".json", ".gz")  # what HTA lists in a folder


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("hta", help=HELP, description=HELP + ".")
    _tracedir.add_folder_argument(parser)
    parser.add_argument("--role", required=True)
    parser.add_argument("--stage", required=True)
    parser.add_argument("--step", required=True, type=int, metavar="N")
    parser.add_argument(
        "--occurrence",
        type=_tracedir.int_at_least(1),
        default=1,
        metavar="K",
        help="the region's K-th entry in the step (default 1; >= 2 with gradient accumulation)",
    )
    _tracedir.add_pid_argument(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="folder to fill")
    parser.add_argument("--copy", action="store_true", help="copy the files instead of linking")
    parser.add_argument(
        "--force",
        action="store_true",
        help="remove the .json/.gz files OUT already holds (otherwise such a folder is refused)",
    )
    parser.set_defaults(func=lambda args: run(parser, args))


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from ..traces.reading.files import TraceFilter, started_at

    try:
        filters = TraceFilter(roles=[args.role], stages=[args.stage], steps=[args.step], pids=args.pid)
    except ValueError as exc:
        parser.error(str(exc))
    infos = _tracedir.usable_traces(args, filters)
    if isinstance(infos, int):
        return infos
    left_out = sorted({(i.occurrence, i.rank) for i in infos if i.occurrence != args.occurrence})
    infos = [i for i in infos if i.occurrence == args.occurrence]
    occurrences = ", ".join(map(str, sorted({occ for occ, _ in left_out})))
    if not infos:  # said once: not "linking occurrence K" first and then that there is none
        _tracedir.error(
            f"no trace of occurrence {args.occurrence} of {args.role}/{args.stage} "
            f"step {args.step} in {args.directory}; occurrence(s) here: {occurrences} "
            "(--occurrence K chooses)"
        )
        return _tracedir.EXIT_NO_TRACE
    if left_out:
        print(
            f"left out occurrence(s) {occurrences} of "
            f"{args.role}/{args.stage} step {args.step} (ranks "
            f"{', '.join(map(str, sorted({rank for _, rank in left_out})))}); "
            f"linking occurrence {args.occurrence} (--occurrence K chooses)"
        )

    by_rank: dict[int, list[TraceInfo]] = {}
    for info in infos:
        by_rank.setdefault(info.rank, []).append(info)
    chosen: dict[int, TraceInfo] = {}
    for rank, candidates in sorted(by_rank.items()):
        candidates.sort(key=started_at, reverse=True)
        chosen[rank] = candidates[0]
        if len(candidates) > 1:
            ignored = ", ".join(c.path for c in candidates[1:])
            print(
                f"rank {rank}: {len(candidates)} traces; keeping the newest, {candidates[0].path} (ignoring {ignored})"
            )

    out = args.output
    problem = _prepare_output(out, args.directory, force=args.force)
    if problem:
        _tracedir.error(problem)
        return _tracedir.EXIT_USAGE
    for rank, info in chosen.items():
        try:
            how, dest = _place(info, out, copy=args.copy)
        except OSError as exc:
            _tracedir.error(f"cannot write into {out}: {exc}")
            return _tracedir.EXIT_FAILED
        print(f"rank {rank}: {how} {dest}")
    world = max(info.world_size for info in chosen.values())
    missing = sorted(set(range(world)) - set(chosen))
    if missing:
        occurrence = f" #{args.occurrence}" if args.occurrence > 1 else ""
        _tracedir.error(
            f"warning: no trace for rank(s) {', '.join(map(str, missing))} of {world} "
            f"({args.role}/{args.stage} step {args.step}{occurrence})"
        )
    return _tracedir.EXIT_OK


def _prepare_output(out: str, source: str, *, force: bool) -> str | None:
    """Create OUT, or empty it of trace files with ``force``; returns a problem, or None."""
    if os.path.exists(out) and os.path.samefile(out, source):
        return f"OUT must differ from DIR ({out}): HTA would read every trace in it"
    try:
        os.makedirs(out, exist_ok=True)
        existing = sorted(
            entry.path
            for entry in os.scandir(out)
            if entry.name.endswith(_HTA_SUFFIXES) and not entry.is_dir(follow_symlinks=False)
        )
        if existing and not force:
            return (
                f"{out} already holds {len(existing)} trace file(s) that HTA would also read "
                f"(e.g. {existing[0]}); use an empty folder, or --force to remove them"
            )
        for path in existing:
            os.unlink(path)
    except OSError as exc:
        return f"cannot prepare {out}: {exc}"
    return None


def _place(info: TraceInfo, out: str, *, copy: bool) -> tuple[str, str]:
    """Put ``info``'s file into OUT; returns how ('linked', 'copied', ...) and where."""
    dest = os.path.join(out, os.path.basename(info.path))
    if _rank_hta_reads(info.path) != info.rank:
        _write_with_rank(info, dest)
        return f"copied (distributedInfo.rank set to {info.rank} for HTA)", dest
    if not copy:
        try:
            os.symlink(os.path.abspath(info.path), dest)
            return "linked", dest
        except OSError:
            pass  # a filesystem without symlinks: a copy reads the same
    shutil.copy2(info.path, dest)
    return "copied", dest


def _rank_hta_reads(path: str) -> int | None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            match = _HTA_RANK.search(line)
            if match:
                return int(match[1])
    return None


def _write_with_rank(info: TraceInfo, dest: str) -> None:
    from ..traces.reading.files import load_trace

    trace = load_trace(info.path)
    dist = trace.pop("distributedInfo", None)
    dist = dict(dist) if isinstance(dist, dict) else {}
    dist.update(rank=info.rank, world_size=info.world_size)
    # distributedInfo first, and json's default ": " separator: HTA's pattern needs the space.
    text = json.dumps({"distributedInfo": dist, **trace})
    data = text.encode("utf-8")
    # A new temporary name and a rename: never through a link planted in a shared OUT.
    replace_exclusively(dest, gzip.compress(data) if dest.endswith(".gz") else data)
