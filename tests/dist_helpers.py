"""Launching real multi-process jobs for the distributed tests: torchrun, or plain processes
with an environment of our own per rank (to simulate several nodes on one host).

Workers are plain scripts in ``tests/workers/``. They import the same ``torchstep_prof`` the
tests import (its folder is put first on ``PYTHONPATH``), and their output goes to files, never
to pipes, so a chatty rank can never block on a full pipe while another one is waited for.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import attrs

import torchstep_prof

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = Path(__file__).resolve().parents[1]
PACKAGE_ROOT = Path(torchstep_prof.__file__).resolve().parents[1]

# Generous: a loaded 2-core machine runs 4 ranks that each import torch (~2 s alone).
LAUNCH_TIMEOUT_S = 120.0

# Variables that would change what the workers do if they leaked in from the test's own run.
_SCRUBBED = ("TORCHSTEP_PROF_CONFIG", "TORCHSTEP_PROF_OVERRIDES", "TORCHSTEP_PROF_SUMMARY")
_TORCHRUN_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
)  # fmt: skip


@attrs.frozen
class Launch:
    """What a finished job left: each process's exit code and output."""

    returncodes: tuple[int, ...]
    output: str

    @property
    def ok(self) -> bool:
        return all(code == 0 for code in self.returncodes)

    def check(self) -> Launch:
        """Fail the test with every process's output when any of them failed."""
        if not self.ok:
            raise AssertionError(f"exit codes {self.returncodes}; output:\n{self.output}")
        return self


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The test's environment, minus torchstep_prof's and torchrun's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED + _TORCHRUN_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_torchrun(
    script: Path,
    nproc: int,
    args: Sequence[str] = (),
    *,
    log_dir: Path,
    env: Optional[Mapping[str, str]] = None,
    timeout_s: float = LAUNCH_TIMEOUT_S,
) -> Launch:
    """``torchrun --standalone --nproc_per_node=<nproc> <script> <args>`` (torchrun picks a free
    rendezvous port itself)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(script), *args,
    ]  # fmt: skip
    log = log_dir / "torchrun.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=worker_env(env), cwd=log_dir, start_new_session=True
        )
        code = _wait([process], timeout_s)[0]
    return Launch(returncodes=(code,), output=log.read_text(errors="replace"))


def run_ranks(
    script: Path,
    world_size: int,
    args: Sequence[str] = (),
    *,
    log_dir: Path,
    env_for_rank: Callable[[int], Mapping[str, str]] = lambda rank: {},
    timeout_s: float = LAUNCH_TIMEOUT_S,
) -> Launch:
    """Start ``world_size`` processes of ``script`` with ``RANK`` / ``WORLD_SIZE`` /
    ``MASTER_ADDR`` / ``MASTER_PORT`` set (``env://`` rendezvous), plus ``env_for_rank(rank)``."""
    port = str(free_port())
    processes, logs = [], []
    try:
        for rank in range(world_size):
            env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"}
            env["MASTER_PORT"] = port
            env.update(env_for_rank(rank))
            log = log_dir / f"rank{rank}.log"
            logs.append(log)
            with open(log, "wb") as out:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(script), *args],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=worker_env(env),
                        cwd=log_dir,
                        start_new_session=True,
                    )
                )
        codes = _wait(processes, timeout_s)
    finally:
        _kill(processes)
    output = "\n".join(f"----- rank {r} -----\n{log.read_text(errors='replace')}" for r, log in enumerate(logs))
    return Launch(returncodes=tuple(codes), output=output)


def read_json(path: Path) -> dict:
    with open(path) as handle:
        return json.load(handle)


def _wait(processes: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    try:
        for process in processes:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill(processes)
        raise AssertionError(f"the job did not end within {timeout_s:g} s") from None
    return [process.returncode for process in processes]


def _kill(processes: list[subprocess.Popen[bytes]]) -> None:
    # Each launch runs in a session of its own: signal the whole group (hook commands included),
    # never anything by name. SIGTERM first: torchrun forwards it to its workers, which it
    # starts in sessions of their own.
    alive = [p for p in processes if p.poll() is None]
    for process in alive:
        _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15.0
    for process in alive:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass
