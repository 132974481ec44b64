"""``torchstep-prof run``: profile chosen steps of a script nobody edited.

    torchstep-prof run --steps 3,5 --ranks 0 -- train.py --lr 3e-4
    torchstep-prof run --steps 2 --step-every 16 --region Sequential=agent/forward -m ppo --env-id x

The configuration is the ``--config`` file's (or the defaults), then the options here, then the
environment (``TORCHSTEP_PROF_CONFIG``, ``TORCHSTEP_PROF_OVERRIDES``), all checked before the
script starts: a bad one is a usage error (exit 2). Only this subcommand imports torch, and only
once the options are good.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Optional

from ..errors import ConfigError

__all__ = ["register"]

_EPILOG = """\
Each Optimizer.step call ends a step (or what --step-on names; every K-th with --step-every K);
steps count from 1, step 1 begins with the script. A step's trace ends, and the next one's
begins, once the boundary has returned and the record_function ranges the step opened have
closed. Precedence: --config, then these options and --set, then the environment
(TORCHSTEP_PROF_CONFIG, TORCHSTEP_PROF_OVERRIDES).
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="profile chosen steps of an unmodified script (python SCRIPT / -m MODULE)",
        usage="%(prog)s [OPTIONS] [--] SCRIPT [ARGS...]  |  %(prog)s [OPTIONS] -m MODULE [ARGS...]",
        description="Run a training script as `python SCRIPT ARGS` would, profiling chosen steps.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    which = parser.add_argument_group("which steps (an explicit list, or torch.profiler's cycle)")
    which.add_argument("--steps", metavar="LIST", type=_int_list("--steps"), help="steps to profile: 3,5 or 2-4")
    for name in ("skip-first", "wait", "warmup", "active", "repeat"):
        which.add_argument(
            f"--{name}", metavar="N", type=_number("--" + name), help=f"schedule.{name.replace('-', '_')}"
        )
    which.add_argument(
        "--on-demand", metavar="DIR", help="also serve `torchstep-prof trigger DIR` requests (no --steps needed)"
    )
    which.add_argument(
        "--auto-trace",
        action="store_true",
        help="trace slow steps by themselves (auto_trace, docs/auto-trace.md; needs --on-demand DIR, turns metrics on)",
    )
    which.add_argument(
        "--stall-after",
        metavar="S",
        type=_number("--stall-after", float, "a number of seconds"),
        help="keep each rank's live status (`torchstep-prof status`) and report a rank with no new step "
        "for S seconds (docs/stall.md; no --steps needed)",
    )
    which.add_argument(
        "--step-every",
        metavar="K",
        type=_number("--step-every"),
        default=1,
        help="K optimizer steps make one step (gradient accumulation, several optimizers)",
    )
    which.add_argument(
        "--step-on",
        metavar="WHAT",
        default="optimizer",
        help="what ends a step: optimizer (each Optimizer.step, the default), backward (each "
        "top-level autograd backward) or MODULE:QUALNAME (each return of that function)",
    )
    where = parser.add_argument_group("where and what")
    where.add_argument(
        "--ranks", metavar="LIST", type=_int_list("--ranks"), help="global ranks that profile (default 0)"
    )
    where.add_argument("--all-ranks", action="store_true", help="every rank profiles")
    where.add_argument(
        "--contents", metavar="LIST", help="cpu,cuda,memory,shapes,stack,flops,modules,nvtx,memory_snapshot"
    )
    where.add_argument(
        "--region",
        metavar="CLASS[=ROLE[/STAGE]]",
        action="append",
        default=[],
        help="forwards of nn.Modules of this class are regions (repeatable)",
    )
    where.add_argument("--discrete", action="store_true", help="one trace per region instead of one per step")
    out = parser.add_argument_group("output")
    out.add_argument("--save-path", metavar="DIR", help="where traces go (default outputs/profile)")
    out.add_argument("--gzip", action="store_true", help="write .json.gz")
    out.add_argument("--on-finish", metavar="CMD", help="run CMD (through /bin/sh) once profiling is finished")
    out.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_number("--metrics-port"),
        help="serve region and step metrics for Prometheus on PORT + LOCAL_RANK (metrics.port)",
    )
    out.add_argument(
        "--spans",
        metavar="DIR",
        help="log every step and its regions (each --region forward, in every step) to DIR for "
        "`torchstep-prof timeline DIR` (spans.dir; no --steps needed)",
    )
    conf = parser.add_argument_group("configuration")
    conf.add_argument("--config", metavar="FILE", help="a config file (.yaml, .json, .toml) to start from")
    conf.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one field, as in TORCHSTEP_PROF_OVERRIDES (repeatable)",
    )
    parser.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        nargs=argparse.REMAINDER,
        help="run a module, as python -m does; what follows is its arguments",
    )
    parser.add_argument("target", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=run, run_parser=parser)


def _number(option: str, kind: type = int, what: str = "an integer") -> Any:
    """An argparse ``type`` reading ``kind``; a bad value names the option: ``--wait: 'x' is not an integer``."""

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: {text!r} is not {what}") from None

    return parse


def _int_list(option: str) -> Any:
    def parse(text: str) -> list[int]:
        numbers: list[int] = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            low, dash, high = item.partition("-")
            try:
                first, last = (int(low), int(high)) if dash and low else (int(item), int(item))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{option}: {item!r} is not an integer or a range like 2-4 (in {text!r})"
                ) from None
            if last < first:
                raise argparse.ArgumentTypeError(
                    f"{option}: the range {item!r} is reversed (write {last}-{first}; in {text!r})"
                )
            numbers.extend(range(first, last + 1))
        if not numbers:
            raise argparse.ArgumentTypeError(f"{option}: name at least one number (got {text!r})")
        return numbers

    return parse


def build_config(args: argparse.Namespace) -> Any:
    """The config file's configuration (or the defaults) with this command line applied on top.

    Raises ``ConfigError`` listing every bad value.
    """
    from ..config.model import ProfilerConfig
    from ..config.files import load_config
    from ..config.overrides import Override, apply_overrides

    base = load_config(args.config) if args.config else ProfilerConfig()

    def field(key: str, value: Any) -> Override:
        return Override(text=f"{key}={value}", path=tuple(key.split(".")), value=value)

    # A run's traces are fused (one per step) unless --discrete or an override says otherwise.
    chosen = [field("discrete", bool(args.discrete))]
    if args.steps is not None:
        chosen.append(field("schedule.steps", args.steps))
    cycle = {"skip_first": args.skip_first, "wait": args.wait, "warmup": args.warmup,
             "active": args.active, "repeat": args.repeat}  # fmt: skip
    if any(v is not None for v in cycle.values()):
        chosen.append(field("schedule.steps", None))
        chosen += [field(f"schedule.{k}", v) for k, v in cycle.items() if v is not None]
    contents = None if args.contents is None else [c.strip() for c in args.contents.split(",") if c.strip()]
    given = {  # the options that set one field to their value (None: not given)
        "ranks": args.ranks,
        "all_ranks": args.all_ranks or None,
        "contents": contents,
        "save_path": args.save_path,
        "gzip": args.gzip or None,
        "finish_hook.cmd": args.on_finish,
        "on_demand.dir": args.on_demand,
        "stall.after_s": args.stall_after,
        "metrics.port": args.metrics_port,
        "spans.dir": args.spans,
    }
    chosen += [field(key, value) for key, value in given.items() if value is not None]
    if args.auto_trace:
        chosen.append(field("auto_trace.on", "step"))
        if base.metrics is None and args.metrics_port is None:
            chosen.append(field("metrics.enable", True))  # it reads the metrics' step times
    return apply_overrides(base, [*chosen, *args.overrides])


def run(args: argparse.Namespace) -> int:
    """Carry out ``run``: check everything, then run the script under the profiling scopes.

    Returns only when the script returns normally (exit code 0); its ``SystemExit`` and
    exceptions propagate unchanged.
    """
    parser: argparse.ArgumentParser = args.run_parser
    if args.module is not None:
        if not args.module:
            parser.error("-m needs a MODULE to run")
        module: Optional[str] = args.module[0]
        target_args = args.module[1:]
        script = None
    else:
        target = list(args.target)
        if target[:1] == ["--"]:
            target = target[1:]
        if not target:
            parser.error("name the SCRIPT to run (or -m MODULE)")
        module, script, target_args = None, target[0], target[1:]
    if args.steps is not None and any(
        getattr(args, name) is not None for name in ("skip_first", "wait", "warmup", "active", "repeat")
    ):
        parser.error("--steps and --skip-first/--wait/--warmup/--active/--repeat are two ways to choose steps: use one")
    if args.step_every < 1:
        parser.error(f"--step-every: must be >= 1 (got {args.step_every})")
    from ..zero_code.step_on import check_defined_in, parse_step_on

    try:
        step_on = parse_step_on(args.step_on)
    except ValueError as exc:
        parser.error(str(exc))
    main_names = ("__main__", module if module is not None else _script_module(script or ""))

    from ..zero_code.script_runner import ScriptNotFound, check_module, check_script, run_module, run_script
    from ..config.environment import ENV_CONFIG, ENV_OVERRIDES, read_environment

    try:
        config = build_config(args)
        environment = read_environment()
        effective = environment.apply(config)
    except ConfigError as exc:
        parser.error(str(exc))
    try:
        from ..zero_code.boundaries import parse_region

        regions = [parse_region(text) for text in args.region]
    except ValueError as exc:
        parser.error(str(exc))
    if effective.enable and effective.auto_trace is not None and effective.on_demand is None:
        parser.error("--auto-trace (auto_trace) needs --on-demand DIR: its peers and its budget are kept there")
    if (
        effective.enable
        and effective.schedule is None
        and effective.on_demand is None
        and effective.stall is None
        and effective.spans is None
    ):
        if environment.config is not None:
            # The environment's file replaces the whole configuration, this command line's too.
            parser.error(
                f"no step is selected: {ENV_CONFIG}={environment.config_path} replaces this "
                "command line's configuration (--steps and --config included) and has no "
                f"schedule: add one to it, set {ENV_OVERRIDES}='schedule.steps=[...]', or unset {ENV_CONFIG}"
            )
        parser.error(
            "no step is selected: pass --steps LIST (or --wait/--warmup/--active/--repeat), "
            "a --config file with a schedule, --set schedule.steps=[...], --on-demand DIR, --stall-after S or --spans DIR"
        )
    steps = effective.schedule.steps if effective.enable and effective.schedule is not None else None
    if steps and 0 in steps:
        # begin_step(iter_num) counts from the loop's 0; a run counts boundaries from 1.
        parser.error(
            f"step 0 never runs under run (in --steps, --config or --set): steps count from 1, "
            f"{step_on.describe()} ending one; the first ends step 1, which is iteration 0 of a "
            "loop that counts from 0"
        )
    if effective.enable and effective.discrete and not regions:
        parser.error("--discrete writes one trace per region: name at least one --region CLASS")
    try:
        check_module(module) if module is not None else check_script(script or "")
    except ScriptNotFound as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    if step_on.kind == "function" and step_on.module in main_names:
        try:
            check_defined_in(step_on, script if module is None else _module_file(module))
        except ValueError as exc:
            parser.error(str(exc))

    def launch() -> None:
        if module is not None:
            run_module(module, target_args)
        else:
            run_script(script or "", target_args)

    if not effective.enable:
        launch()
        return 0
    import torchstep_prof as tsp

    from ..selection.frames import current_frame
    from ..zero_code.boundaries import StepDriver

    from ..engine import ENGINE

    # The profiler's warm-up waits for the step before the first selected one (StepDriver): a
    # run that profiles no step leaves the process as `python SCRIPT` would have it.
    ENGINE.warm_up_deferred = True
    with contextlib.ExitStack() as scopes:
        scopes.enter_context(tsp.configure(config))
        driver = StepDriver(current_frame(), step_every=args.step_every, regions=regions, step_on=step_on,
                            main_names=main_names)  # fmt: skip
        driver.install()
        scopes.callback(driver.close)  # before the scope exits: its hook sees every trace
        launch()
    return 0


def _script_module(path: str) -> str:
    """The name ``--step-on MODULE:...`` may give the script itself (``train`` for train.py)."""
    import os

    return os.path.splitext(os.path.basename(path.rstrip(os.sep)))[0] or "__main__"


def _module_file(name: str) -> Optional[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return getattr(spec, "origin", None)
