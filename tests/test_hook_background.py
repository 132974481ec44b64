"""The finish hook out of training's way: in the background by default, waited for at exit,
fed every trace of the process (docs/finish-hook.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import torchstep_prof as tsp
from torchstep_prof.hook.command import HookContext, run_hook
from torchstep_prof.config.model import FinishHookConfig

from dist_helpers import WORKERS, read_json, run_torchrun
from script_helpers import run_script

REPO = Path(__file__).resolve().parents[1]


def one_step(n: int) -> None:
    with tsp.step(n), tsp.profile_region("actor", "update"):
        pass


def test_the_hook_runs_in_the_background_and_training_goes_on(save_dir, tmp_path):
    gate, marker = tmp_path / "gate", tmp_path / "hook-ran"
    # The hook waits for a file the training loop writes only after the triggering step has
    # returned: if the hook ran in the training thread, it would never see it (timeout).
    hook = f'while [ ! -e "{gate}" ]; do sleep 0.05; done; touch "{marker}"'
    with tsp.schedule(steps=[1]), tsp.on_finish(hook, timeout_s=30):
        one_step(1)
        assert not marker.exists()
        gate.touch()  # training goes on while the hook runs
        one_step(2)
    assert tsp.flush(timeout=30)
    assert marker.exists()
    assert [h.outcome for h in tsp.records().hooks] == ["ok"]


def test_wait_true_makes_the_triggering_block_wait(save_dir, tmp_path):
    marker = tmp_path / "hook-ran"
    with tsp.schedule(steps=[1]), tsp.on_finish(f'sleep 0.3; touch "{marker}"', wait=True):
        one_step(1)
        assert marker.exists()  # the step's exit returned only once the command had ended


def test_wait_is_a_config_field(tmp_path):
    cfg = tsp.apply_overrides(tsp.ProfilerConfig(), ["finish_hook.cmd=true", "finish_hook.wait=true"])
    assert cfg.finish_hook.wait is True
    assert tsp.from_dict(tsp.to_dict(cfg)) == cfg


def test_at_exit_the_process_waits_for_a_running_hook_and_says_so(tmp_path):
    marker = tmp_path / "hook-ran"
    code = f"""
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.on_finish('sleep 1; touch "{marker}"'):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                pass
        print("training done", flush=True)
    """
    done = run_script(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.exists()  # the interpreter waited for it
    assert "torchstep_prof: waiting for finish hook on rank 0 (sleep 1; touch" in done.stderr
    assert "hook on rank 0: ok, exit code 0" in done.stdout  # the summary, after the wait
    duration = float(done.stdout.split("hook on rank 0: ok, exit code 0, ")[1].split(" s")[0])
    assert duration >= 1.0  # the hook's true duration, not the time the step waited


def test_ctrl_c_during_the_exit_wait_kills_the_hook_process_group(tmp_path):
    pid_file = tmp_path / "hook-pid"
    write_pid_cmd = write_pid(pid_file)
    code = f"""
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.on_finish('{write_pid_cmd}; sleep 60 & wait'):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                pass
    """
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    err_file = tmp_path / "stderr"
    with open(err_file, "w") as err:
        process = subprocess.Popen(
            [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=err,
            text=True, env={**env, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            # Ctrl-C once the process is in its exit wait (the main script has ended).
            while "waiting for finish hook" not in err_file.read_text() or not pid_file.exists():
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
            process.send_signal(signal.SIGINT)
            stdout, _ = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    stderr = err_file.read_text()
    hook_group = int(pid_file.read_text())
    assert live_members(hook_group) == []  # its whole process group (the background sleep too) is gone
    assert "interrupted; killed 1 finish hook process group(s)" in stderr
    assert "hook on rank 0: failed" in stdout and "SIGKILL" in stdout, stdout + stderr


def test_ctrl_c_while_training_waits_for_the_hook_kills_it_and_records_it(tmp_path):
    pid_file = tmp_path / "hook-pid"
    write_pid_cmd = write_pid(pid_file)
    code = f"""
        import json, os, signal, threading, time
        import torchstep_prof as tsp

        def interrupt_once_the_hook_runs():
            while not os.path.exists("{pid_file}"):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_the_hook_runs, daemon=True).start()
        caught = False
        with tsp.configure(summary=False), tsp.schedule(steps=[1]), \\
                tsp.on_finish('{write_pid_cmd}; sleep 60 & wait', wait=True):
            try:
                with tsp.step(1), tsp.profile_region("actor", "update"):
                    pass
            except KeyboardInterrupt:
                caught = True
        hooks = [[h.outcome, h.message] for h in tsp.records().hooks]
        print(json.dumps({{"caught": caught, "hooks": hooks}}))
    """
    result = run_script(code, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["caught"]  # the Ctrl-C reached the training loop
    # killed with its whole group, recorded and warned about, and run once only
    assert outcome["hooks"] == [["failed", "interrupted (Ctrl-C while training waited for it); its process group was killed"]]
    assert "interrupted (Ctrl-C while training waited for it)" in result.stderr
    assert live_members(int(pid_file.read_text())) == []


def write_pid(pid_file: Path) -> str:
    """Shell code writing the hook shell's pid to ``pid_file``, which appears with the pid in it
    (renamed into place): a test acting once the file exists never reads it empty, even when the
    shell is descheduled between creating the file and writing the pid and then killed."""
    return f'echo $$ > "{pid_file}.tmp" && mv "{pid_file}.tmp" "{pid_file}"'


def live_members(group: int) -> list[int]:
    """Processes of ``group`` still running (zombies awaiting a reaper do not count)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state != "Z":
            members.append(int(entry))
    return members


def test_a_step_inside_a_profiled_region_starts_the_hook_once_its_trace_is_written(save_dir, tmp_path):
    listing, traces = tmp_path / "listing", tmp_path / "traces"
    hook = f'ls "$TORCHSTEP_PROF_SAVE_PATH" > "{listing}"; printf %s "$TORCHSTEP_PROF_TRACES" > "{traces}"'

    @tsp.profiled(role="trainer")
    def train_step(n: int) -> None:
        with tsp.step(n):  # the last selected step ends here, inside the recording region
            pass

    with tsp.schedule(steps=[1]), tsp.on_finish(hook, wait=True):
        train_step(1)
    files = listing.read_text().split()
    assert len(files) == 1 and files[0].startswith("trainer_train-step_step1_")
    assert Path(traces.read_text()) == (save_dir / files[0]).resolve()


@pytest.mark.parametrize("order", ["hook-outside", "hook-inside"])
def test_which_ranks_run_the_hook_does_not_depend_on_scope_order(save_dir, tmp_path, monkeypatch, order):
    from torchstep_prof import topology

    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    topology.forget_topology()
    marker = tmp_path / "hook-ran"
    hook = tsp.on_finish(f'touch "{marker}"', wait=True)
    if order == "hook-outside":
        scopes = [hook, tsp.ranks(0, 2), tsp.schedule(steps=[1])]
    else:
        scopes = [tsp.ranks(0, 2), tsp.schedule(steps=[1]), hook]
    with scopes[0], scopes[1], scopes[2]:
        one_step(1)
    assert len(tsp.records().traces) == 1  # rank 2 profiled
    assert marker.exists()  # so it runs the hook, whichever scope was written first


def test_a_rank_that_is_not_profiled_runs_no_hook(save_dir, tmp_path, monkeypatch):
    from torchstep_prof import topology

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    topology.forget_topology()
    marker = tmp_path / "hook-ran"
    with tsp.on_finish(f'touch "{marker}"', wait=True), tsp.ranks(0, 2), tsp.schedule(steps=[1]):
        one_step(1)
    assert not marker.exists() and not tsp.records().hooks


@pytest.mark.parametrize("where", ["before", "around"])
def test_the_environments_hook_runs_once_after_the_traces_it_covers(tmp_path, where):
    listing = tmp_path / "listing"
    if where == "before":
        code = """
            import torchstep_prof as tsp
            with tsp.on_finish("echo prep-done"):   # unrelated to profiling
                pass
            for n in range(1, 5):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
        """
    else:
        code = """
            import torchstep_prof as tsp
            with tsp.on_finish("echo code-hook"):
                for n in range(1, 5):
                    with tsp.step(n), tsp.profile_region("actor", "update"):
                        pass
        """
    hook = f'basename "$TORCHSTEP_PROF_TRACES" >> {listing}'
    overrides = f"schedule.steps=[3] save_path=profile '{'finish_hook.cmd=' + hook}'"
    done = run_script(code, tmp_path, TORCHSTEP_PROF_OVERRIDES=overrides)
    assert done.returncode == 0, done.stderr
    lines = listing.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("actor_update_step3_")  # once, with the trace
    assert "prep-done" not in done.stdout and "code-hook" not in done.stdout  # the environment's word wins


def test_traces_reach_the_hook_as_a_file_of_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = "prof:with:colons"  # a save_path with os.pathsep cannot be split from TRACES
    dump = tmp_path / "dump"
    hook = f'cat "$TORCHSTEP_PROF_TRACES_FILE" > "{dump}"; echo "traces set: ${{TORCHSTEP_PROF_TRACES+yes}}" >> "{dump}"'
    with tsp.configure(save_path=folder, summary=False), tsp.schedule(steps=[1, 2]), tsp.on_finish(hook, wait=True):
        for n in (1, 2):
            one_step(n)
    lines = dump.read_text().splitlines()
    written = sorted(str(Path(t.path).resolve()) for t in tsp.records().traces)
    assert sorted(lines[:-1]) == written and all(os.path.isabs(p) for p in lines[:-1])
    assert lines[-1] == "traces set: "  # not set: a path holds ':'


def test_thousands_of_traces_do_not_keep_the_hook_from_starting(tmp_path):
    long_folder = tmp_path / ("x" * 150)
    traces = tuple(str(long_folder / f"actor_update_step{n}_rank0-of-1_pid1_20260101000000000.json") for n in range(5000))
    out = tmp_path / "out"
    hook = FinishHookConfig(
        cmd=f'wc -l < "$TORCHSTEP_PROF_TRACES_FILE" > "{out}"; echo "${{TORCHSTEP_PROF_TRACES+set}}" >> "{out}"',
        timeout_s=60,
    )
    context = HookContext(save_path=str(long_folder), rank=0, world_size=1, local_rank=0, traces=traces)
    record = run_hook(hook, context)
    assert record.ok, record.message
    count, traces_set = out.read_text().split("\n")[:2]
    assert int(count) == 5000 and traces_set == ""  # too long for the variable: the file only
    small = HookContext(save_path=str(tmp_path / "small"), rank=0, world_size=1, local_rank=0, traces=traces[:3])
    out.unlink()
    assert run_hook(hook, small).ok
    assert out.read_text().split("\n")[:2] == ["3", "set"]


def test_5000_traces_reach_the_hook_through_the_public_api_in_the_file_only(tmp_path):
    # 5000 selected steps of one cheap region each (~15 s here): their paths joined are ~1 MB, far
    # over the 32 KiB the variable may hold (exec fails on a string past 128 KiB), so only the
    # file lists them. (test_thousands_of_traces... checks the same on the hook runner alone.)
    folder = tmp_path / ("p" * 100)
    listing, flag = tmp_path / "listing", tmp_path / "flag"
    hook = f'cp "$TORCHSTEP_PROF_TRACES_FILE" "{listing}"; echo "traces set: ${{TORCHSTEP_PROF_TRACES+yes}}" > "{flag}"'
    steps = range(1, 5001)
    with tsp.configure(save_path=str(folder), summary=False), tsp.schedule(steps=list(steps)), \
            tsp.on_finish(hook, wait=True, timeout_s=120):
        for n in steps:
            with tsp.step(n), tsp.profile_region("a", "b"):
                pass
    traces = tsp.records().traces
    assert len(traces) == 5000 and all(t.ok for t in traces)
    written = sorted(str(Path(t.path).resolve()) for t in traces)
    listed = listing.read_text().splitlines()
    assert sorted(listed) == written  # every path, each once, absolute
    assert all(os.path.isfile(p) for p in listed)
    assert flag.read_text().strip() == "traces set:"  # unset: too long for the variable
    [run] = tsp.records().hooks
    assert run.ok, run.message


def test_a_step_entered_again_after_the_hook_ran_is_pointed_out(save_dir, tmp_path):
    listing = tmp_path / "listing"
    with tsp.schedule(steps=[1]), tsp.on_finish(f'cat "$TORCHSTEP_PROF_TRACES_FILE" > "{listing}"', wait=True):
        one_step(1)
        one_step(1)  # numbering restarted (a new epoch): a second step-1 trace
    written = [t.path for t in tsp.records().traces]
    assert len(written) == 2
    assert listing.read_text().splitlines() == [str(Path(written[0]).resolve())]  # the list stays honest
    attention = tsp.records().attention
    assert any("written after its finish hook ran" in line and Path(written[1]).name in line for line in attention)


@pytest.mark.distributed
def test_a_slow_hook_on_one_rank_does_not_time_out_another_ranks_collective(tmp_path):
    run_torchrun(WORKERS / "slow_hook_worker.py", 2, [str(tmp_path)], log_dir=tmp_path).check()
    results = [read_json(tmp_path / f"result_rank{rank}.json") for rank in (0, 1)]
    assert [r["sum"] for r in results] == [2.0, 2.0]  # every all-reduce went through (15 s timeout)
    assert results[0]["hook_done_before_exit"] is False  # the 30 s hook was still running
    assert (tmp_path / "hook-done-rank0").exists()  # and rank 0 waited for it before leaving
    assert not (tmp_path / "hook-done-rank1").exists()
