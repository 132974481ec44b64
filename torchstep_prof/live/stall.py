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

from .._shared_files import replace_exclusively
from ..config.model import StallConfig
from ..errors import TorchstepProfWarning, warn
from ..rendering import safe_text
from ..topology import Topology
from .verdict import _seconds

__all__ = [
    "ENV_STALL_FILE", "ENV_STALL_QUIET_S", "ENV_STALL_STEP", "ENV_STATUS_DIR", "fire", "stall_text",
]  # fmt: skip

ENV_STALL_FILE = "TORCHSTEP_PROF_STALL_FILE"
"""The stall command's variable naming this rank's ``stall-rank<R>.txt``."""
ENV_STALL_STEP = "TORCHSTEP_PROF_STALL_STEP"
"""The step the rank is stuck in ('' before its first step)."""
ENV_STALL_QUIET_S = "TORCHSTEP_PROF_STALL_SECONDS"
"""Seconds without step progress when the rank was found stalled."""
ENV_STATUS_DIR = "TORCHSTEP_PROF_STATUS_DIR"
"""The live status folder (``torchstep-prof status "$TORCHSTEP_PROF_STATUS_DIR"`` shows every rank)."""


def stall_text(status: dict[str, Any], quiet_s: float) -> str:
    """The stall file: one line of verdict, the open regions, the collective, the stack."""
    name = f"rank {status['rank']}" + (f" ({status['role']})" if status["role"] else "")
    step = "before its first step" if status["step"] is None else f"at step {status['step']}"
    lines = [
        f"{name}: no step progress for {_seconds(quiet_s)} {step} (threshold {status['threshold_s']:g} s)",
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


def fire(
    path: str, folder: str, status: dict[str, Any], quiet_s: float, rule: Optional[StallConfig], save_path: str,
    topology: Topology,
) -> None:  # fmt: skip
    """Write the stall file ``path`` of a rank found stalled (its ``status`` just written in ``folder``),
    warn, and start the rule's command (if any) on its own thread."""
    try:
        replace_exclusively(path, stall_text(status, quiet_s).encode("utf-8"))
        written = f"its status and stack are in {path}"
    except OSError as exc:
        written = f"its stall file {path} cannot be written ({exc})"
    step = "before its first step" if status["step"] is None else f"in step {status['step']}"
    warn(
        f"torchstep_prof: rank {topology.rank} has made no step progress for {_seconds(quiet_s)} {step}; "
        f"{written} (`torchstep-prof status {folder}` shows every rank)",
        TorchstepProfWarning,
    )
    if rule is not None and rule.cmd is not None:
        threading.Thread(
            target=_run_command,
            args=(path, folder, status["step"], quiet_s, rule, save_path, topology),
            name="torchstep_prof-stall-cmd",
            daemon=True,
        ).start()


def _run_command(
    path: str, folder: str, step: Optional[int], quiet_s: float, rule: StallConfig, save_path: str, topology: Topology
) -> None:
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
            ENV_STALL_FILE: path,
            ENV_STALL_STEP: "" if step is None else str(step),
            ENV_STALL_QUIET_S: f"{quiet_s:.0f}",
            ENV_STATUS_DIR: folder,
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
