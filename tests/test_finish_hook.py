"""The finish hook runs real commands: environment, shells, failures, timeouts, output."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from torchstep_prof.config.model import FinishHookConfig
from torchstep_prof.errors import FinishHookWarning
from torchstep_prof.hook.command import (
    ENV_LOCAL_RANK,
    ENV_PID,
    ENV_RANK,
    ENV_ROLES,
    ENV_SAVE_PATH,
    ENV_TRACES,
    ENV_TRACES_FILE,
    ENV_WORLD_SIZE,
    HookContext,
    hook_environment,
    run_hook,
)
from torchstep_prof.summary.records import STORE

# Dumps the hook's environment and its own pid as JSON to the file named by its first argument.
_DUMP_ENV = "import json, os, sys; json.dump({'env': dict(os.environ), 'pid': os.getpid()}, open(sys.argv[1], 'w'))"


@pytest.fixture(autouse=True)
def _fresh_records():
    STORE.clear()
    yield
    STORE.clear()


def _context(tmp_path: Path, **overrides) -> HookContext:
    fields = dict(save_path=str(tmp_path / "profile"), rank=0, world_size=1, local_rank=0)
    fields.update(overrides)
    return HookContext(**fields)


def _is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waits for its (new) parent to reap it, but runs nothing any more
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _wait_until_gone(pid: int, within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while not _is_gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("form", ["string", "list"])
def test_environment_holds_every_variable_and_the_callers_own(tmp_path, monkeypatch, form):
    monkeypatch.setenv("TSP_TEST_EXPORTED", "from-the-test")
    dump = tmp_path / "env.json"
    argv = [sys.executable, "-c", _DUMP_ENV, str(dump)]
    cmd = shlex.join(argv) if form == "string" else argv
    traces = (str(tmp_path / "profile" / "a.json"), str(tmp_path / "profile" / "b.json.gz"))
    context = _context(
        tmp_path, rank=3, world_size=8, local_rank=1, roles=("actor", "compute_log_prob"), traces=traces
    )

    record = run_hook(FinishHookConfig(cmd=cmd, timeout_s=30), context)

    assert record.outcome == "ok" and record.exit_code == 0
    dumped = json.loads(dump.read_text())
    env = dumped["env"]
    assert env["TSP_TEST_EXPORTED"] == "from-the-test"
    assert env[ENV_SAVE_PATH] == str(tmp_path / "profile")
    assert env[ENV_RANK] == "3"
    assert env[ENV_WORLD_SIZE] == "8"
    assert env[ENV_LOCAL_RANK] == "1"
    assert env[ENV_PID] == str(os.getpid()) != str(dumped["pid"])  # the training process, not the hook
    assert env[ENV_ROLES] == "actor,compute-log-prob"
    assert env[ENV_TRACES].split(os.pathsep) == list(traces)
    assert os.path.isdir(context.save_path)  # created before the command starts


def test_hook_environment_adds_the_variables_to_a_copy():
    base = {"KEEP": "1"}
    context = HookContext(save_path="out", rank=0, world_size=2, local_rank=0, pid=7, roles=("a", "b", "a"))
    env = hook_environment(context, base_environ=base, traces_file="/tmp/list.txt")
    assert base == {"KEEP": "1"}
    assert env["KEEP"] == "1"
    names = {ENV_SAVE_PATH, ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK, ENV_PID, ENV_ROLES, ENV_TRACES, ENV_TRACES_FILE}
    assert names <= set(env)
    assert env[ENV_ROLES] == "a,b" and env[ENV_TRACES] == "" and env[ENV_PID] == "7"
    assert names <= set(hook_environment(context, traces_file="x"))  # os.environ by default


def test_non_zero_exit_is_recorded_and_warned_never_raised(tmp_path, capfd):
    hook = FinishHookConfig(cmd="echo going wrong >&2; exit 3")
    with pytest.warns(FinishHookWarning, match="exit code 3"):
        record = run_hook(hook, _context(tmp_path, rank=2))
    assert (record.outcome, record.exit_code, record.ok) == ("failed", 3, False)
    assert "going wrong" in record.message
    assert STORE.snapshot().hooks == (record,)
    assert "[rank 2] going wrong\n" in capfd.readouterr().err


def test_command_killed_by_a_signal_is_a_failure(tmp_path):
    with pytest.warns(FinishHookWarning, match="SIGKILL"):
        record = run_hook(FinishHookConfig(cmd=["sh", "-c", "kill -9 $$"]), _context(tmp_path))
    assert (record.outcome, record.exit_code) == ("failed", -9)


def test_missing_executable_is_not_started(tmp_path):
    hook = FinishHookConfig(cmd=[str(tmp_path / "no-such-uploader"), "--now"])
    with pytest.warns(FinishHookWarning, match="could not start"):
        record = run_hook(hook, _context(tmp_path))
    assert (record.outcome, record.exit_code) == ("not-started", None)
    assert STORE.snapshot().hooks == (record,)


def test_missing_program_in_a_shell_string_is_exit_127(tmp_path):
    # The shell itself starts, so this is the shell's "not found" exit status.
    with pytest.warns(FinishHookWarning, match="could not find"):
        record = run_hook(FinishHookConfig(cmd="no-such-uploader-9f2c --now"), _context(tmp_path))
    assert (record.outcome, record.exit_code) == ("failed", 127)


def test_timeout_kills_the_whole_process_group(tmp_path):
    child_pid = tmp_path / "child.pid"
    grandchild_pid = tmp_path / "grandchild.pid"
    cmd = f"sleep 60 & echo $! > {shlex.quote(str(grandchild_pid))}; echo $$ > {shlex.quote(str(child_pid))}; sleep 60"
    started = time.monotonic()
    with pytest.warns(FinishHookWarning, match="timed out after 1 s"):
        record = run_hook(FinishHookConfig(cmd=cmd, timeout_s=1), _context(tmp_path))
    assert record.outcome == "timeout"
    assert time.monotonic() - started < 8
    for pid_file in (child_pid, grandchild_pid):
        assert _wait_until_gone(int(pid_file.read_text())), f"{pid_file.name} survived the timeout"


def test_background_process_holding_stdout_does_not_hang(tmp_path, capfd):
    background = tmp_path / "background.pid"
    cmd = f"sleep 30 & echo $! > {shlex.quote(str(background))}; echo started"
    started = time.monotonic()
    try:
        record = run_hook(FinishHookConfig(cmd=cmd), _context(tmp_path))
        assert time.monotonic() - started < 5
        assert record.outcome == "ok"
        assert "[rank 0] started\n" in capfd.readouterr().out
    finally:
        os.kill(int(background.read_text()), 9)


def test_labels_and_paths_reach_the_command_only_as_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("still here")
    save_path = tmp_path / "$(touch pwned-path); rm -rf x"
    roles = ("$(touch pwned)", "; rm -rf x", "`touch pwned-backtick`")
    # Unquoted expansions on purpose: word splitting and globbing, but never command substitution.
    hook = FinishHookConfig(
        cmd='echo $TORCHSTEP_PROF_ROLES $TORCHSTEP_PROF_SAVE_PATH; printf %s "$TORCHSTEP_PROF_SAVE_PATH" > got'
    )
    record = run_hook(hook, _context(tmp_path, save_path=str(save_path), roles=roles))

    assert record.outcome == "ok" and record.cmd == hook.cmd
    assert not list(tmp_path.rglob("pwned*"))
    assert (tmp_path / "x" / "keep").read_text() == "still here"
    assert (tmp_path / "got").read_text() == str(save_path)
    assert save_path.is_dir()


def test_output_is_streamed_with_a_rank_prefix(tmp_path, capfd):
    record = run_hook(
        FinishHookConfig(cmd="echo one; echo two >&2; echo three; printf 'no newline'"), _context(tmp_path, rank=5)
    )
    assert record.ok
    out, err = capfd.readouterr()
    assert "[rank 5] one\n[rank 5] three\n[rank 5] no newline\n" in out
    assert "[rank 5] two\n" in err


def test_relocate_runs_before_the_command(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "host.7.pt.trace.json").write_text("{}")
    listing = tmp_path / "listing"
    hook = FinishHookConfig(cmd=f'ls "$TORCHSTEP_PROF_SAVE_PATH" > {shlex.quote(str(listing))}', relocate=[str(engine)])
    record = run_hook(hook, _context(tmp_path, rank=1, world_size=2))
    assert record.ok
    assert listing.read_text().split() == ["relocated_rank1-of-2_host.7.pt.trace.json"]
    assert record.relocated == (str(tmp_path / "profile" / "relocated_rank1-of-2_host.7.pt.trace.json"),)


def test_missing_node_mates_are_warned_and_recorded(tmp_path):
    with pytest.warns(FinishHookWarning, match=r"local rank\(s\) 2, 3"):
        record = run_hook(FinishHookConfig(cmd="true"), _context(tmp_path), wait_s=0.5, missing_ranks=[2, 3])
    assert record.ok and record.missing_ranks == (2, 3) and record.wait_s == 0.5
