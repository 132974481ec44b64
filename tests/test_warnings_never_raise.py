"""Warnings never raise into training: under ``python -W error`` a profiling warning still reaches
stderr, training continues, and the user's own exception propagates as itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import trace_files

WORKER = Path(__file__).resolve().parent / "workers" / "warnings_error.py"


def run_under_w_error(case: str, save_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-W", "error", str(WORKER), case, str(save_path)],
        capture_output=True, text=True, timeout=240, env={**os.environ, **env},
    )  # fmt: skip


@pytest.fixture
def unwritable(tmp_path) -> Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    return blocker / "profile"  # cannot be created: its parent is a file


def test_a_failed_write_is_reported_on_stderr_and_training_continues(unwritable):
    proc = run_under_w_error("failed-write", unwritable)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training continues" in proc.stdout
    assert "TraceWriteWarning" in proc.stderr and "not written" in proc.stderr


def test_a_failed_hook_is_reported_on_stderr_and_training_continues(tmp_path):
    proc = run_under_w_error("failed-hook", tmp_path / "profile")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training continues" in proc.stdout
    assert "FinishHookWarning" in proc.stderr
    assert len(trace_files(tmp_path / "profile")) == 1


def test_a_bad_rank_is_reported_on_stderr_and_the_trace_is_rank_0_of_1(tmp_path):
    proc = run_under_w_error("bad-rank", tmp_path / "profile", RANK="abc")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training continues" in proc.stdout
    assert "abc" in proc.stderr and "Warning" in proc.stderr
    (path,) = trace_files(tmp_path / "profile")
    assert "_rank0-of-1_" in path.name


def test_the_users_exception_propagates_as_itself(unwritable):
    """The trace of the failing region cannot be written either: its warning goes to stderr,
    and the traceback ends with the user's ValueError, not a warning turned exception."""
    proc = run_under_w_error("user-exception", unwritable)
    assert proc.returncode == 1
    assert "training continues" not in proc.stdout
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line == "ValueError: the user's own error", proc.stderr[-3000:]
    assert "TraceWriteWarning" in proc.stderr
    assert "Traceback" in proc.stderr and "Warning:" not in proc.stderr.split("Traceback")[1].splitlines()[-1]


def test_warnings_point_at_the_users_line(tmp_path):
    """A warning names the user's line that led to it (the region, the optimizer step under
    `run`), never the package's (`frames.py:252 ... _ROOT.resolve()`), and escapes what it
    quotes."""
    import os

    from script_helpers import REPO

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "import torchstep_prof as tsp\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "with tsp.profile_region('actor', 'update'):\n"
        "    model(torch.ones(1, 2)).sum().backward()\n"
        "opt.step()  # line 7\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "abc\x1b[2J", "TORCHSTEP_PROF_OVERRIDES": "schedule.steps=[1]"}
    plain = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=240)  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    warning = next(line for line in plain.stderr.splitlines() if "Warning:" in line)
    # The environment's schedule is read at the import (torch came first): that is the line.
    assert warning.startswith(f"{script}:2: TorchstepProfWarning"), plain.stderr
    assert "\x1b" not in plain.stderr and "abc\\x1b[2J" in warning
    env.pop("TORCHSTEP_PROF_OVERRIDES")
    under_run = subprocess.run([sys.executable, "-m", "torchstep_prof", "run", "--steps", "1", str(script)],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert under_run.returncode == 0, under_run.stderr
    # Read before the script starts: no line of the user's is running, and none of ours is named.
    (warning,) = [line for line in under_run.stderr.splitlines() if "Warning:" in line]
    assert warning.startswith("torchstep_prof:0: TorchstepProfWarning: torchstep_prof: ignoring a rank"), warning


def test_a_warning_from_a_region_points_at_its_with_line(tmp_path):
    from script_helpers import run_script

    code = """
        import torch
        import torchstep_prof as tsp
        with torch.profiler.profile():
            with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("actor", "update"):
                pass
    """
    done = run_script(code, tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "Warning:" in line]
    assert warning.startswith(f"{tmp_path / 'job.py'}:5: ForeignProfilerWarning"), done.stderr


def test_warn_once_says_each_key_once_and_past_its_limit_only_the_notice_once():
    import warnings

    from torchstep_prof.errors import warn_once

    def said(limit: int | None, past_limit: str | None) -> list[str]:
        warned: set[int] = set()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for key in (1, 1, 2, 3, 4, 2):
                warn_once(warned, key, f"w{key}", limit=limit, past_limit=past_limit)
        return [str(w.message) for w in caught]

    assert said(None, None) == ["w1", "w2", "w3", "w4"]
    assert said(2, None) == ["w1", "w2"]  # the live status: silent past its limit
    assert said(2, "later ones are not shown") == ["w1", "w2", "later ones are not shown"]  # on-demand
