"""``torchstep-prof config``: print the effective configuration, or check a config file.

torchstep-prof config                 # the default, with the environment's layer applied
torchstep-prof config --file x.yaml   # that file's config, defaults filled in
torchstep-prof config --check x.toml  # every problem, exit 1; or "OK: x.toml", exit 0
"""

from __future__ import annotations

import argparse
import sys

from ..errors import ConfigError

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="print the effective config as YAML, or check a config file",
        description=(
            "Print the effective configuration as YAML: the defaults with TORCHSTEP_PROF_CONFIG "
            "and TORCHSTEP_PROF_OVERRIDES applied, or a file's. With --check, validate a file."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--file", metavar="FILE", help="print this config file's configuration")
    source.add_argument("--check", metavar="FILE", help="validate FILE: print every problem, or OK")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..config.model import ProfilerConfig
    from ..config.files import format_config, load_config
    from ..config.environment import read_environment

    path = args.check if args.check is not None else args.file
    try:
        cfg = read_environment().apply(ProfilerConfig()) if path is None else load_config(path)
    except ConfigError as exc:
        # One line per problem, each naming the file it is in (a problem with the whole file,
        # or one from the environment, names its source already).
        out = sys.stdout if args.check is not None else sys.stderr
        for problem in exc.problems:
            print(f"{path}: {problem}" if path and problem.path else str(problem), file=out)
        return 1
    if args.check is not None:
        print(f"OK: {args.check}")
        return 0
    sys.stdout.write(format_config(cfg, "yaml"))
    return 0
