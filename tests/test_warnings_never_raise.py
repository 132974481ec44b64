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
