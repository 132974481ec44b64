"""examples/train_loop.py end to end: a nanoGPT-style ``while`` loop from iteration 0 marked with
``begin_step``, two micro-batches per step; its files, their occurrences, and the command line
reading them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trace_helpers import check_trace_file, load_trace, trace_files

from torchstep_prof import parse_trace_name

REPO = Path(__file__).resolve().parents[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env.update(PYTHONPATH=str(REPO), COLUMNS="120")
    return env


def test_the_train_loop_example_profiles_step_zero_and_each_micro_batch(tmp_path):
    out = tmp_path / "profile"
    run = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_loop.py"), "--max-iters", "2", "--save-path", str(out)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert [line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("iter ")] == [
        "iter 0", "iter 1", "iter 2",
    ]  # fmt: skip

    occurrences: dict[tuple[str, int], list[int]] = {}
    for path in trace_files(out):
        check_trace_file(path)
        name = parse_trace_name(path)
        meta = load_trace(path)["torchstep_prof"]
        occurrences.setdefault((name.stage, name.step), []).append(meta["occurrence"])
    # Iterations 0 and 2 are profiled (the default --profile-steps 0 2); iteration 0 is step 0.
    assert {key: sorted(value) for key, value in occurrences.items()} == {
        ("forward", 0): [1, 2],
        ("backward", 0): [1, 2],
        ("optimizer-step", 0): [1],
        ("forward", 2): [1, 2],
        ("backward", 2): [1, 2],
        ("optimizer-step", 2): [1],
    }

    listed = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "ls", str(out)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert sum(path.name in listed.stdout for path in trace_files(out)) == 10

    summary = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", str(out), "--json"],
        env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    groups = json.loads(summary.stdout)["groups"]
    assert {(g["stage"], g["step"]) for g in groups} == set(occurrences)

    table = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", str(out)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert table.returncode == 0, table.stderr
    assert "trainer/forward" in table.stdout
