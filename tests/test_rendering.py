"""Text from outside printed safely: control characters and escape sequences shown escaped by the
command line (summarize, ls, diff, trigger --status) and warnings (rendering.safe_text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchstep_prof.rendering import safe_text

REPO = Path(__file__).resolve().parents[1]
EVIL = "evil\x1b[2J\x1b]0;pwned\x07\nforged line"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "torchstep_prof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def assert_safe(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)
    assert not [line for line in text.splitlines() if line.startswith("forged line")], text


@pytest.mark.parametrize(
    "raw, shown",
    [("a\x1b[31mb", "a\\x1b[31mb"), ("x\ny\r\tz", "x\\ny\\r\\tz"), ("\x9b2J\u2028", "\\x9b2J\\u2028"),
     ("actor/update é", "actor/update é")],
)  # fmt: skip
def test_safe_text_escapes_control_characters_only(raw, shown):
    assert safe_text(raw) == shown


def _trace_with_an_evil_operator(folder: Path) -> Path:
    """A torchstep_prof trace whose operator name holds ESC sequences and a newline (a trace file
    can hold anything: torch, a user's merge script, or someone else wrote it)."""
    pid = 4242
    path = folder / f"actor_update_step1_rank0-of-1_pid{pid}_20261204100000000.json"
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 5000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "actor/update", "ts": 1, "dur": 4000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": f"aten::{EVIL}", "ts": 2, "dur": 3000, "pid": 1, "tid": 1},
    ]
    meta = {"role": "actor", "stage": "update", "step": 1, "rank": 0, "world_size": 1, "pid": pid, "discrete": True}
    path.write_text(json.dumps({"baseTimeNanoseconds": 1_790_000_000_000_000_000, "traceEvents": events,
                                "torchstep_prof": meta}))  # fmt: skip
    return path


def test_summarize_ls_and_diff_print_a_traces_escape_sequences_escaped(tmp_path):
    _trace_with_an_evil_operator(tmp_path)
    (tmp_path / f"{EVIL.replace(chr(10), '_')}.json").write_text("{not json")  # a skipped file, named badly
    for args in (["summarize", "."], ["ls", "."], ["diff", ".", "."], ["summarize", ".", "--role", "nobody"]):
        done = cli(*args, cwd=tmp_path)
        assert_safe(done.stdout + done.stderr)
    summarized = cli("summarize", ".", cwd=tmp_path)
    assert summarized.returncode == 0, summarized.stderr
    assert "aten::evil\\x1b[2J\\x1b]0;pwned\\x07\\nforged line" in summarized.stdout
    assert "evil\\x1b[2J" in summarized.stderr + summarized.stdout  # the skipped file, named escaped
    diffed = cli("diff", ".", ".", cwd=tmp_path)
    assert diffed.returncode == 0, diffed.stderr
    assert "aten::evil\\x1b[2J" in diffed.stdout


def test_trigger_status_prints_request_ids_and_roles_escaped(tmp_path):
    import time

    status = {
        "rank": 0, "role": "actor\x1b[2J", "pid": 1, "host": "h", "step": 7, "time": time.time(), "rate": 2.0,
        "poll_s": 1.0, "running": True, "served": [{"id": EVIL, "steps": [3, 4], "outcome": "traced\nforged line"}],
    }  # fmt: skip
    (tmp_path / "status-rank0.json").write_text(json.dumps(status))
    (tmp_path / "request.json").write_text(json.dumps({"id": EVIL, "steps": [9]}))
    shown = cli("trigger", ".", "--status", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert_safe(shown.stdout + shown.stderr)
    assert "evil\\x1b[2J" in shown.stdout and "actor\\x1b[2J" in shown.stdout
