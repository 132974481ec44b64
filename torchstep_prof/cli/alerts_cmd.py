"""``torchstep-prof alerts``: Prometheus alerting rules for this toolkit's metrics, printed as YAML.

Three rules (docs/auto-trace.md, "Alert rules"), their thresholds as options:

- ``TorchstepProfJobStuck``: no rank of a job ended a step for ``--stuck-after`` seconds
  (``torchstep_prof_last_step_timestamp_seconds``);
- ``TorchstepProfStragglerRank``: a rank's median step (or region, ``--straggler-on``) over
  ``--straggler-factor`` x its job's median for ``--straggler-for``;
- ``TorchstepProfRegionRegressed``: a region's mean time over the last ``--regression-window``
  above ``--regression-factor`` x its mean over the hour before.

No torch here: ``torchstep-prof alerts > rules.yml``, then ``promtool check rules rules.yml``.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

__all__ = ["build_rules", "register"]

HELP = "print Prometheus alerting rules for the metrics: a stuck job, a straggler rank, a region regressing"
_DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\\n]|\\.)*"\s*'
_SELECTOR = re.compile(rf"(?:{_MATCHER}(?:,{_MATCHER})*)?")
_REGION = re.compile(r"[^/{}\"\\\n]+/[^/{}\"\\\n]+")


def _duration(text: str) -> str:
    if not _DURATION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a Prometheus duration such as 30s, 5m, 1h30m (got {text!r})")
    return text


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 1 (got {text!r})")
    return value


def _seconds(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of seconds >= 1 (got {text!r})")
    return int(text)


def _selector(text: str) -> str:
    if not _SELECTOR.fullmatch(text):
        raise argparse.ArgumentTypeError(f'must be label matchers such as job="train",cluster=~"a.*" (got {text!r})')
    return text.strip()


def _watched(text: str) -> str:
    if text != "step" and not _REGION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be 'step' or a region as ROLE/STAGE (got {text!r})")
    return text


# The thresholds: option, parser, default, metavar, help (which says the default).
_OPTIONS = (
    ("--selector", _selector, "", "MATCHERS",
     'label matchers every series must match, e.g. job="train" (default: none)'),
    ("--stuck-after", _seconds, 600, "SECONDS", "a job with no step for this long is stuck (default 600)"),
    ("--stuck-for", _duration, "1m", "DURATION", "and stays so this long before the alert fires (default 1m)"),
    ("--straggler-on", _watched, "step", "step|ROLE/STAGE",
     "compare ranks' step times, or a region's (one that excludes waiting for the other ranks names the "
     "straggler in a synchronous job); default step"),
    ("--straggler-factor", _factor, 1.25, "X", "a rank whose median is over X times its job's median (default 1.25)"),
    ("--straggler-window", _duration, "5m", "DURATION", "medians over this window (default 5m)"),
    ("--straggler-for", _duration, "5m", "DURATION", "for this long (default 5m)"),
    ("--regression-factor", _factor, 1.5, "X",
     "a region whose mean time is over X times its mean of the hour before (default 1.5)"),
    ("--regression-window", _duration, "10m", "DURATION",
     "the recent window compared with the hour before it (default 10m)"),
    ("--regression-for", _duration, "10m", "DURATION", "for this long (default 10m)"),
)  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "alerts",
        help=HELP,
        description=HELP + ". Thresholds are options; the YAML goes to standard output, for Prometheus' "
        "rule_files (check it with `promtool check rules`).",
    )
    for flag, parse, default, metavar, text in _OPTIONS:
        parser.add_argument(flag, type=parse, default=default, metavar=metavar, help=text)
    parser.add_argument("--severity", default="warning", metavar="LABEL",
                        help="the severity label of every rule (default warning)")  # fmt: skip
    parser.set_defaults(func=run)


def build_rules(args: argparse.Namespace) -> dict[str, Any]:
    """The rule file's content for the parsed options (plain data, dumped as YAML by ``run``)."""
    sel = args.selector
    prefix = "torchstep_prof"

    def series(name: str, extra: str = "") -> str:
        matchers = ",".join(part for part in (extra, sel) if part)
        return f"{prefix}_{name}{{{matchers}}}" if matchers else f"{prefix}_{name}"

    if args.straggler_on == "step":
        buckets, what = series("step_seconds_bucket"), "step"
    else:
        role, stage = args.straggler_on.split("/", 1)
        buckets, what = series("region_seconds_bucket", f'role="{role}",stage="{stage}"'), f"{role}/{stage}"
    window = args.straggler_window
    rank_median = f"histogram_quantile(0.5, sum by (job, rank, le) (rate({buckets}[{window}])))"
    job_median = f"histogram_quantile(0.5, sum by (job, le) (rate({buckets}[{window}])))"

    def mean(window: str, offset: str = "") -> str:
        later = f" offset {offset}" if offset else ""
        return (
            f"sum by (job, role, stage) (rate({series('region_seconds_sum')}[{window}]{later})) / "
            f"sum by (job, role, stage) (rate({series('region_seconds_count')}[{window}]{later}))"
        )

    recent = args.regression_window
    return {
        "groups": [
            {
                "name": "torchstep_prof",
                "rules": [
                    {
                        "alert": "TorchstepProfJobStuck",
                        "expr": f"time() - max by (job) ({series('last_step_timestamp_seconds')}) > {args.stuck_after}",
                        "for": args.stuck_for,
                        "labels": {"severity": args.severity},
                        "annotations": {
                            "summary": "Job {{ $labels.job }}: no step for over " + f"{args.stuck_after} s",
                            "description": "No rank of {{ $labels.job }} ended a step for {{ $value | humanizeDuration }}.",
                        },
                    },
                    {
                        "alert": "TorchstepProfStragglerRank",
                        "expr": f"{rank_median} > on (job) group_left {args.straggler_factor:g} * {job_median}",
                        "for": args.straggler_for,
                        "labels": {"severity": args.severity},
                        "annotations": {
                            "summary": "Job {{ $labels.job }}: rank {{ $labels.rank }} is a straggler",
                            "description": f"Rank {{{{ $labels.rank }}}}'s median {what} time is over "
                            f"{args.straggler_factor:g}x its job's median (over {window}).",
                        },
                    },
                    {
                        "alert": "TorchstepProfRegionRegressed",
                        "expr": f"({mean(recent)}) > {args.regression_factor:g} * ({mean('1h', recent)})",
                        "for": args.regression_for,
                        "labels": {"severity": args.severity},
                        "annotations": {
                            "summary": "Job {{ $labels.job }}: region {{ $labels.role }}/{{ $labels.stage }} regressed",
                            "description": f"Its mean time over the last {recent} is over "
                            f"{args.regression_factor:g}x its mean over the hour before.",
                        },
                    },
                ],
            }
        ]
    }


def run(args: argparse.Namespace) -> int:
    import yaml

    text = yaml.safe_dump(build_rules(args), sort_keys=False, width=10_000, allow_unicode=False)
    sys.stdout.write(text)
    return 0
