"""A finish hook never outlives its ``timeout_s``, even when the training process is killed
(SIGKILL, or torchrun's SIGTERM to its workers): hook/_watchdog.py keeps the deadline. Real
processes: a training script, a real torchrun job, the hook's own ``sleep``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import torchstep_prof as tsp
from dist_helpers import worker_env

TIMEOUT_S = 3
# SIGTERM at the timeout (+1 s, the watchdog's margin), SIGKILL 2 s later, plus a slow machine.
GONE_WITHIN_S = TIMEOUT_S + 1 + 2 + 10

# Each rank's hook writes its pid to hook<rank>.pid and sleeps far past its timeout.
TRAINING = """
import os, sys, time
import torchstep_prof as tsp

rank = os.environ.get("RANK", "0")
hook = ["sh", "-c", f'echo $$ > hook{rank}.pid.tmp && mv hook{rank}.pid.tmp hook{rank}.pid && exec sleep 600']
with tsp.schedule(steps=[1]), tsp.ranks(all_ranks=True), tsp.on_finish(hook, timeout_s=TIMEOUT):
    with tsp.step(1), tsp.profile_region("actor", "update"):
        pass
while not os.path.exists(f"hook{rank}.pid"):
    time.sleep(0.05)
print("hook started", flush=True)
time.sleep(600)
"""


def _write_training(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINING).replace("TIMEOUT", str(TIMEOUT_S)))
    return script


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for_pids(tmp_path: Path, count: int, within_s: float = 120) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = sorted(tmp_path.glob("hook*.pid"))
        if len(found) == count:
            return [int(path.read_text()) for path in found]
        time.sleep(0.1)
    raise AssertionError(f"{count} hooks did not start within {within_s} s")


def _assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:  # leave no sleep behind, then fail
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"hook processes {alive} outlived their {TIMEOUT_S} s timeout"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to tell a zombie from a running hook")
def test_a_hook_never_outlives_its_timeout_when_training_is_killed(tmp_path: Path) -> None:
    training = subprocess.Popen(
        [sys.executable, str(_write_training(tmp_path))], cwd=tmp_path, env=worker_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = _wait_for_pids(tmp_path, 1)
        assert training.stdout is not None and training.stdout.readline() == "hook started\n"
        training.kill()  # SIGKILL: no atexit, no hook wait, nothing of ours runs any more
        training.wait(30)
        assert _alive(pids[0])  # the hook lives on for now (its own session)...
        _assert_gone(pids)  # ...until its timeout
    finally:
        training.kill()
        training.communicate(timeout=30)


@pytest.mark.distributed
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to tell a zombie from a running hook")
def test_torchrun_terminating_its_workers_leaves_no_hook_past_its_timeout(tmp_path: Path) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(_write_training(tmp_path))],
        cwd=tmp_path, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        pids = _wait_for_pids(tmp_path, 2)
        launcher.send_signal(signal.SIGTERM)  # torchrun then sends SIGTERM to its workers
        launcher.communicate(timeout=120)
        _assert_gone(pids)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=30)


def test_the_default_timeout_is_finite_and_null_is_refused() -> None:
    assert tsp.FinishHookConfig(cmd="upload").timeout_s == 600
    with pytest.raises(tsp.ConfigError) as caught:
        tsp.on_finish("upload", timeout_s=None)  # type: ignore[arg-type]
    assert str(caught.value).startswith("finish_hook.timeout_s: must be a number of seconds > 0 (got None;")
    with pytest.raises(tsp.ConfigError, match=r"finish_hook\.timeout_s"):
        tsp.apply_overrides(tsp.ProfilerConfig(), ["finish_hook.cmd=x", "finish_hook.timeout_s=null"])


def test_a_hook_starts_in_a_process_holding_more_than_1024_descriptors(tmp_path: Path) -> None:
    from script_helpers import run_script

    done = run_script(
        """
        import os, resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1500)]  # a busy DataLoader's worth
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.on_finish("echo uploaded", wait=True):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                pass
        print("hooks:", [h.outcome for h in tsp.records().hooks])
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "[rank 0] uploaded" in done.stdout
    assert "hooks: ['ok']" in done.stdout
