"""A stalled rank's report: its status and stack in ``stall-rank<R>.txt``, a warning, and the optional command.

The status thread calls :func:`fire` once per process, the first time the rank has made no
step progress for longer than its threshold. The file is written as every file in the shared
folder is (a new file and a rename); the command runs on a thread of its own, through the
finish hook's runner (hook/process.py: its own process group, a time limit kept by a watchdog
even if the job dies), so neither can hold up the status thread or the job. Nothing here
kills, signals or slows the training process.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import attrs

from .._shared_files import replace_exclusively
from ..config.model import StallConfig
from ..errors import TorchstepProfWarning, warn
from ..rendering import safe_text
from ..topology import Topology

__all__ = [
    "ENV_STALL_FILE", "ENV_STALL_QUIET_S", "ENV_STALL_STEP", "ENV_STATUS_DIR", "StallReport", "fire", "stall_text",
]  # fmt: skip

ENV_STALL_FILE = "TORCHSTEP_PROF_STALL_FILE"
"""The stall command's variable naming this rank's ``stall-rank<R>.txt``."""
ENV_STALL_STEP = "TORCHSTEP_PROF_STALL_STEP"
"""The step the rank is stuck in ('' before its first step)."""
ENV_STALL_QUIET_S = "TORCHSTEP_PROF_STALL_SECONDS"
"""Seconds without step progress when the rank was found stalled."""
ENV_STATUS_DIR = "TORCHSTEP_PROF_STATUS_DIR"
"""The live status folder (``torchstep-prof status "$TORCHSTEP_PROF_STATUS_DIR"`` shows every rank)."""


@attrs.frozen(kw_only=True)
class StallReport:
    """One rank found stalled: where it wrote, and what it saw."""

    path: str
    folder: str
    rank: int
    role: Optional[str]
    step: Optional[int]
    quiet_s: float
    threshold_s: float
    status: dict[str, Any] = attrs.field(eq=False, repr=False)


def stall_text(report: StallReport) -> str:
    """The stall file: one line of verdict, the open regions, the collective, the stack."""
    status = report.status
    name = f"rank {report.rank}" + (f" ({report.role})" if report.role else "")
    step = "before its first step" if report.step is None else f"at step {report.step}"
    lines = [
        f"{name}: no step progress for {_seconds(report.quiet_s)} {step} (threshold {report.threshold_s:g} s)",
        f"pid {status.get('pid')} on {safe_text(status.get('host'))}, "
        f"written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(status['time']))} UTC",
    ]
    now = status["time"]
    regions = status.get("regions") or []
    if regions:
        lines.append("open regions (outermost first):")
        lines += [
            f"  {safe_text(r['role'])}/{safe_text(r['stage'])}  for {_seconds(now - r['since'])}" for r in regions
        ]
    else:
        lines.append("open regions: none")
    if status.get("collective"):
        ordinal = f" #{status['ordinal']}" if status.get("ordinal") is not None else ""
        lines.append(f"in collective: {status['collective']}{ordinal}")
    else:
        lines.append("in collective: no")
    if status.get("where"):
        lines.append(f"at: {safe_text(status['where'])}")
    lines.append("Python stack of the training thread (most recent call last):")
    for frame in status.get("stack") or []:
        lines.append(f'  File "{safe_text(frame["file"])}", line {frame["line"]}, in {safe_text(frame["function"])}')
        if frame.get("code"):
            lines.append(f"    {safe_text(frame['code'])}")
    return "\n".join(lines) + "\n"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def fire(report: StallReport, rule: Optional[StallConfig], save_path: str, topology: Topology) -> StallReport:
    """Write the stall file, warn, and start the rule's command (if any) on its own thread."""
    try:
        replace_exclusively(report.path, stall_text(report).encode("utf-8"))
        written = f"its status and stack are in {report.path}"
    except OSError as exc:
        written = f"its stall file {report.path} cannot be written ({exc})"
    step = "before its first step" if report.step is None else f"in step {report.step}"
    warn(
        f"torchstep_prof: rank {report.rank} has made no step progress for {_seconds(report.quiet_s)} {step}; "
        f"{written} (`torchstep-prof status {report.folder}` shows every rank)",
        TorchstepProfWarning,
    )
    if rule is not None and rule.cmd is not None:
        threading.Thread(
            target=_run_command, args=(report, rule, save_path, topology), name="torchstep_prof-stall-cmd", daemon=True
        ).start()
    return report


def _run_command(report: StallReport, rule: StallConfig, save_path: str, topology: Topology) -> None:
    from ..hook.command import HookContext, hook_environment
    from ..hook.process import display, run_command, warn_hook
    from ..summary.records import HOOK_OK

    if rule.cmd is None:
        return
    context = HookContext(
        save_path=save_path, rank=topology.rank, world_size=topology.world_size, local_rank=topology.local_rank
    )
    env = hook_environment(context)
    env.update(
        {
            ENV_STALL_FILE: report.path,
            ENV_STALL_STEP: "" if report.step is None else str(report.step),
            ENV_STALL_QUIET_S: f"{report.quiet_s:.0f}",
            ENV_STATUS_DIR: report.folder,
        }
    )
    try:
        outcome, _code, message = run_command(
            rule.cmd, env, timeout_s=rule.timeout_s, prefix=f"[torchstep_prof stall rank {topology.rank}] "
        )
    except Exception as exc:  # the job goes on, whatever the command does
        outcome, message = "failed", repr(exc)
    if outcome != HOOK_OK:
        warn_hook(f"torchstep_prof: stall command {display(rule.cmd)!r} on rank {topology.rank}: {outcome}: {message}")
