"""The ``torchstep-prof`` command line (also ``python -m torchstep_prof``).

Each subcommand lives in its own module exposing ``register(subparsers)``, which adds its parser
and sets ``func`` to a callable taking the parsed arguments and returning the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

# Imported lazily by name so `torchstep-prof ls` does not pay for rich or the merge code.
_SUBCOMMAND_MODULES = (
    "config_cmd",
    "summarize_cmd",
    "merge_cmd",
    "ls_cmd",
    "hta_cmd",
    "report_cmd",
    "run_cmd",
    "trigger_cmd",
    "status_cmd",
    "diff_cmd",
    "alerts_cmd",
    "timeline_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchstep-prof",
        description="Inspect torchstep_prof configs and trace folders; profile a script with `run`.",
    )
    from .. import __version__  # the package's __init__ imports no torch: names load lazily

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _reject_unknown(parser, args.command, unknown)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `torchstep-prof summarize DIR | head`: the reader left; say nothing more, as cat does.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


def _reject_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 with the subcommand's usage, naming what it does not know and the option meant
    (``--stpes``: did you mean ``--steps``?), where argparse would print the top-level usage."""
    import difflib

    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = subparsers.choices[command]
    known = [option for action in sub._actions for option in action.option_strings]
    words = []
    for word in unknown:
        close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1) if word.startswith("-") else []
        words.append(f"{word} (did you mean {close[0]}?)" if close else word)
    sub.error(f"unrecognized arguments: {', '.join(words)}")
