"""Child processes of a profiled process: forked children write nothing and exit with their own
status; children never profile, run hooks or print a summary because of inherited configuration.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from trace_helpers import check_trace_file, trace_files

from torchstep_prof import parse_trace_name

WORKERS = Path(__file__).resolve().parent / "workers"


def test_a_child_forked_inside_a_region_writes_no_trace_and_exits_with_its_status(tmp_path):
    """Five rounds: a child forked inside the parent's recording region, one forked after the
    trace was written; each enters a region and calls sys.exit(3). Every child exits 3 (no hang,
    no abort in Kineto's destructors); only the parent's pid is in any file name."""
    folder = tmp_path / "profile"
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "fork_child.py"), str(folder), "5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = re.findall(r"^child (\d+) status (\S+)$", proc.stdout, re.MULTILINE)
    assert len(statuses) == 10, proc.stdout
    assert [status for _, status in statuses] == ["3"] * 10, proc.stdout
    children = {int(pid) for pid, _ in statuses}
    files = trace_files(folder)
    assert sorted(parse_trace_name(p).step for p in files) == [1, 2, 3, 4, 5]
    for path in files:
        assert parse_trace_name(path).pid not in children
        check_trace_file(path)


def test_children_ignore_the_configuration_they_inherit(tmp_path):
    """Profiling switched on by TORCHSTEP_PROF_OVERRIDES belongs to the process that read it:
    DataLoader workers (spawn, forkserver), a multiprocessing spawn child and the finish hook's
    own Python command (which imports a profiled helper) write no file, run no hook and print no
    summary. The parent writes its one trace, runs the hook once, prints one summary."""
    folder, hook_log = tmp_path / "profile", tmp_path / "hook.log"
    hook = [sys.executable, str(WORKERS / "profiled_helper.py"), str(hook_log)]
    env = dict(os.environ)
    env.pop("TORCHSTEP_PROF_OWNER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKERS), env.get("PYTHONPATH", "")]))
    env["TORCHSTEP_PROF_OVERRIDES"] = f"schedule.steps=[2] save_path={folder} 'finish_hook.cmd={json.dumps(hook)}'"
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "env_children.py")], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    files = trace_files(folder)
    assert [(parse_trace_name(p).role, parse_trace_name(p).step) for p in files] == [("train", 2)], [p.name for p in files]
    check_trace_file(files[0])
    assert hook_log.read_text().splitlines() == ["hook ran"]
    assert output.count("profiling cost") == 1, output[-3000:]  # one summary: the parent's
    assert not list(tmp_path.glob("outputs"))  # nobody wrote to the default save_path either


def test_children_profile_with_what_they_inherit_when_asked(tmp_path):
    """TORCHSTEP_PROF_CHILDREN=1: the same children use the inherited configuration (the
    spawned child's third region is step 2 of its own counter, a file of its own pid)."""
    folder = tmp_path / "profile"
    env = dict(os.environ)
    env.pop("TORCHSTEP_PROF_OWNER", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKERS), env.get("PYTHONPATH", "")]))
    env["TORCHSTEP_PROF_OVERRIDES"] = f"schedule.steps=[2] save_path={folder} summary=false"
    env["TORCHSTEP_PROF_CHILDREN"] = "1"
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "env_children.py")], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    names = [parse_trace_name(p) for p in trace_files(folder)]
    parent = {n.pid for n in names if n.role == "train"}
    assert len(parent) == 1
    children = [n for n in names if n.role == "child"]
    assert [(n.stage, n.step) for n in children] == [("work", 2)]
    assert children[0].pid not in parent
