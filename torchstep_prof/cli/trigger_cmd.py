"""``torchstep-prof trigger``: ask a running job for traces of its next steps, or show its status.

    torchstep-prof trigger /shared/job7/od --next 2 --align 10
    torchstep-prof trigger /shared/job7/od --next 1 --ranks 1 --contents cpu,shapes
    torchstep-prof trigger /shared/job7/od --status

The job must poll DIR (``on_demand: {dir: DIR}``, ``tsp.on_demand(DIR)``, ``torchstep-prof run
--on-demand DIR``). The steps are chosen here, from the ranks' status files, and written into
the request as absolute step numbers, so every rank profiles the same ones. No torch here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..errors import ConfigError
from ..rendering import safe_text
from ..triggers.status import is_stale

__all__ = ["register"]

_EPILOG = """\
The first step is the first multiple of --align past the highest step any rank can reach
before it reads the request (its last reported step plus its step rate times the age of its
status file and two of its polls); --at STEP names the first step instead. A status not
written for over a minute (and 10 polls) is left out; a rank with no step rate yet is
waited for (three of its polls at most). A request names at most 100 steps (--next).
Exit codes: 0 the request was written (or the status shown), 1 DIR does not exist (--at
alone makes it) or no running rank polls it, 2 a usage error.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    from .run_cmd import _int_list, _number

    parser = subparsers.add_parser(
        "trigger",
        help="ask a running job (on_demand.dir=DIR) for traces of its next steps; --status shows its ranks",
        description="Write an on-demand request into DIR: every rank of the job profiles the same steps.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", metavar="DIR", help="the job's on_demand.dir")
    parser.add_argument("--status", action="store_true", help="show each rank's step and the requests it served")
    parser.add_argument("--next", metavar="N", type=_number("--next"), default=1, help="how many steps (default 1)")
    parser.add_argument(
        "--align", metavar="K", type=_number("--align"), default=1, help="the first step is a multiple of K (default 1)"
    )
    parser.add_argument("--at", metavar="STEP", type=_number("--at"), help="the first step, instead of the rule")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--ranks", metavar="LIST", type=_int_list("--ranks"), help="global ranks that profile")
    who.add_argument("--all-ranks", action="store_true", help="every rank profiles (the default)")
    parser.add_argument(
        "--contents",
        metavar="LIST",
        help="cpu,cuda,memory,shapes,stack,flops,modules,nvtx,memory_snapshot (default: the job's)",
    )
    parser.add_argument("--discrete", action="store_true", help="one trace per region instead of one per step")
    parser.set_defaults(func=trigger, trigger_parser=parser)


_MAX_ALIGN = 1_000_000


def _error(text: str) -> None:
    print(f"torchstep-prof trigger: {text}", file=sys.stderr)


def _check_bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The bounds of a request (docs/on-demand.md), as usage errors: exit 2, nothing written."""
    from ..triggers.request import MAX_STEP, MAX_STEPS

    if not 1 <= args.next <= MAX_STEPS:
        parser.error(f"--next: must be from 1 to {MAX_STEPS} steps (got {args.next}); each one is a profiled step")
    if not 1 <= args.align <= _MAX_ALIGN:
        parser.error(f"--align: must be from 1 to {_MAX_ALIGN} (got {args.align})")
    if args.at is not None and not 0 <= args.at <= MAX_STEP - args.next:
        parser.error(f"--at: must be from 0 to {MAX_STEP - args.next} (got {args.at})")
    if args.ranks is not None and any(not 0 <= rank <= MAX_STEP for rank in args.ranks):
        parser.error(f"--ranks: must be from 0 to {MAX_STEP}")


def trigger(args: argparse.Namespace) -> int:
    from ..triggers.status import read_statuses

    parser: argparse.ArgumentParser = args.trigger_parser
    folder = os.path.abspath(args.dir)
    if not args.status:
        _check_bounds(parser, args)
    if not os.path.isdir(folder) and (args.at is None or os.path.lexists(folder)):
        # A typo must not look like a job that has not started. (--at may write a request
        # before the job starts: the folder is made then.)
        what = "is not a folder" if os.path.lexists(folder) else "does not exist"
        _error(f"{folder} {what}: no job polls it (the job's on_demand.dir, made when its on_demand scope is entered)")
        return 1
    statuses, bad = read_statuses(folder)
    for line in bad:
        _error(f"skipped {safe_text(line)}")
    if args.status:
        _show_status(folder, statuses)
        if not statuses:
            _error(f"{folder}: no rank polls it (no status-rank*.json)")
            return 1
        return 0
    contents = None
    if args.contents is not None:
        from ..config.model import CONTENT_NAMES

        contents = [c.strip() for c in args.contents.split(",") if c.strip()]
        wrong = [c for c in contents if c not in CONTENT_NAMES]
        if wrong:
            parser.error(f"--contents: {', '.join(map(repr, wrong))} not among {', '.join(CONTENT_NAMES)}")
    now = time.time()
    running = [s for s in statuses if s.running and not is_stale(s, now)]
    for s in statuses:
        if s.running and is_stale(s, now):
            _error(
                f"ignored {s.path}: not written for {now - s.time:.0f} s "
                "(a rank that died, or a job that ended without saying so)"
            )
    if not running and args.at is None:
        what = "no running rank polls it" if statuses else "no rank polls it (no status-rank*.json)"
        _error(
            f"{folder}: {what}; start the job with on_demand.dir={folder} (or pass --at STEP to write a request anyway)"
        )
        return 1
    if args.at is None:
        running = _with_rates(folder, running)
        if not any(s.rate is not None for s in running):
            _error(
                f"{folder}: no rank has reported its step rate yet (it takes two "
                "polls after its first step); try again, or pass --at STEP"
            )
            return 1
    return _write(args, folder, running, contents)


def _with_rates(folder: str, running: list[Any]) -> list[Any]:
    """The running ranks' statuses once each reports a step rate (the rule needs it), waiting
    up to three of their polls for it; a rank still without one is then taken to be as fast
    as the fastest (planning.py)."""
    from ..triggers.status import read_statuses

    deadline = time.monotonic() + min(3 * max(s.poll_s for s in running) + 1.0, _MAX_RATE_WAIT_S)
    while any(s.rate is None for s in running) and time.monotonic() < deadline:
        time.sleep(0.1)
        now = time.time()
        running = [s for s in read_statuses(folder)[0] if s.running and not is_stale(s, now)] or running
    return running


def _write(args: argparse.Namespace, folder: str, running: list[Any], contents: Any) -> int:
    from ..triggers.planning import choose_steps
    from ..triggers.request import Request, new_id, parse_request, write_request

    rule: dict[str, Any]
    if args.at is not None:
        steps = tuple(range(args.at, args.at + args.next))
        rule = {"at": args.at}
    else:
        steps, rule = choose_steps(running, time.time(), args.next, args.align)
    rule.update(next=args.next, align=args.align)
    request = Request(
        id=new_id(),
        steps=steps,
        ranks=tuple(args.ranks) if args.ranks is not None else None,
        all_ranks=args.ranks is None,
        contents=tuple(contents) if contents is not None else None,
        discrete=True if args.discrete else None,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        rule=rule,
    )
    try:  # the steps a status file pushed out of bounds (a rank reporting step 2**60, say)
        parse_request(request.to_json())
    except ConfigError as exc:
        _error(f"no request written: {safe_text(exc, 400)}")
        return 1
    _note_unread(folder, running)
    path = write_request(folder, request)
    shown = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    who = "every rank" if args.ranks is None else "rank(s) " + ",".join(map(str, args.ranks))
    print(f"request {request.id}: step(s) {shown} on {who}; written to {path}")
    if "highest_reachable_step" in rule:
        print(
            f"  (highest step a rank can reach before it reads it: {rule['highest_reachable_step']}; "
            f"fastest rank {rule['fastest_steps_per_s']:g} steps/s)"
        )
    return 0


def _note_unread(folder: str, running: list[Any]) -> None:
    """Say so when the request being replaced was never read by some running rank."""
    from ..triggers.request import REQUEST_FILE, read_request

    try:
        previous = read_request(os.path.join(folder, REQUEST_FILE))
    except (ConfigError, OSError):
        return
    unread = [str(s.rank) for s in running if previous.id not in s.served_ids()]
    if unread:
        _error(
            f"replacing request {previous.id}, which rank(s) {','.join(unread)} "
            "had not read yet (they will not serve it)"
        )


_MAX_RATE_WAIT_S = 30.0  # however long the ranks say they poll: the command stays interactive


def _show_status(folder: str, statuses: list[Any]) -> None:
    from ..triggers.request import REQUEST_FILE, read_request

    now = time.time()
    print(safe_text(f"{folder}: {len(statuses)} rank(s)"))
    if statuses:
        print(f"{'rank':<6}{'step':>8}{'age s':>8}{'steps/s':>9}  {'state':<8}requests served")
    for s in statuses:
        rank = f"{s.rank}" + (f" {safe_text(s.role, 80)}" if s.role else "")
        step = "-" if s.step is None else str(s.step)
        rate = "-" if s.rate is None else f"{s.rate:.1f}"
        served = (
            "; ".join(
                f"{safe_text(e.get('id'), 80)} {_steps(e.get('steps'))}: {safe_text(e.get('outcome'), 200)}"
                for e in s.served[-5:]
            )
            or "none"
        )
        more = f" (+{len(s.served) - 5} earlier)" if len(s.served) > 5 else ""
        state = ("stale" if is_stale(s, now) else "running") if s.running else "stopped"
        print(safe_text(f"{rank:<6}{step:>8}{max(0.0, now - s.time):>8.1f}{rate:>9}  {state:<8}{served}{more}"))
    path = os.path.join(folder, REQUEST_FILE)
    if os.path.exists(path):
        try:
            request = read_request(path)
        except (ConfigError, OSError) as exc:
            print(safe_text(f"request file {path}: malformed ({exc})"))
        else:
            waiting = [
                str(s.rank) for s in statuses if s.running and not is_stale(s, now) and request.id not in s.served_ids()
            ]
            tail = f"; not read yet by rank(s) {','.join(waiting)}" if waiting else ""
            print(safe_text(f"latest request: {request.id} {_steps(list(request.steps))}{tail}"))


def _steps(steps: Any) -> str:
    if not isinstance(steps, list) or not steps or not all(isinstance(n, int) for n in steps):
        return "steps ?"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if steps == list(range(steps[0], steps[0] + len(steps))):
        return f"steps {steps[0]}-{steps[-1]}"
    return safe_text(f"steps {steps}", 80)
