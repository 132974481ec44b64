"""Blocks still open at interpreter exit (docs/scopes-and-regions.md,
"Reliability"): a generator left suspended inside a region or a step, a ``begin_step`` never
ended. Each is stopped and its trace written at exit, the exit code is the script's own, and
nothing crashes. Run in subprocesses: interpreter exit is what is tested."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from trace_helpers import check_trace_file, load_trace, range_names, trace_files

from torchstep_prof import parse_trace_name
from script_helpers import run_script

REPO = Path(__file__).resolve().parents[1]


def assert_quiet_exit(result: subprocess.CompletedProcess[str]) -> None:
    assert "Exception ignored" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr or "RuntimeError: loss diverged" in result.stderr, result.stderr
    assert "Segmentation fault" not in result.stderr


SUSPENDED_IN_A_REGION = """
    import sys
    import torch
    import torchstep_prof as tsp

    def batches():
        with tsp.profile_region("data", "load"):          # owns step 1's trace
            with tsp.profile_region("data", "decode"):    # a range still open at exit too
                torch.ones(8, 8).mm(torch.ones(8, 8))
                yield torch.ones(2)

    loader = batches()
    with tsp.configure(save_path="profile"), tsp.schedule(steps=[1]):
        with tsp.step(1):
            next(loader)                                   # suspended inside both regions
    print("script done", flush=True)
    sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_a_generator_suspended_inside_a_region_writes_its_trace_at_exit(tmp_path, code):
    result = run_script(SUSPENDED_IN_A_REGION, tmp_path, str(code))
    assert result.returncode == code, result.stderr
    assert "script done" in result.stdout
    assert_quiet_exit(result)
    [path] = trace_files(tmp_path / "profile")
    check_trace_file(path)
    names = range_names(load_trace(path))
    assert "data/load" in names and "data/decode" in names
    assert "aten::mm" in [e.get("name") for e in load_trace(path)["traceEvents"]]
    # The summary says the region outlived its step, naming the file.
    assert "stayed open after its step" in result.stdout and path.name in result.stdout.replace("\n", "")


A_DAEMON_THREAD_INSIDE_A_REGION = """
    import sys
    import threading
    import time
    import torch
    import torchstep_prof as tsp

    inside = threading.Event()

    def worker():
        with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("rollout", "gen"):
            torch.ones(3).sum()
            inside.set()
            time.sleep(1000)                               # still recording when the script ends

    with tsp.configure(save_path="profile"):
        threading.Thread(target=worker, name="rollout-worker", daemon=True).start()
        inside.wait()
    print("script done", flush=True)
    sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("run", range(3))
@pytest.mark.parametrize("code", [0, 3])
def test_a_trace_recording_in_another_thread_at_exit_is_reported_lost(tmp_path, code, run):
    """torch can stop a profiler only in the thread that started it (stopped from the exit
    thread, its session is not found and the export crashes): the trace owned by a daemon thread
    still inside its region is not written, but said so, in a warning and the summary."""
    result = run_script(A_DAEMON_THREAD_INSIDE_A_REGION, tmp_path, str(code))
    assert result.returncode == code, result.stderr
    assert "script done" in result.stdout
    assert_quiet_exit(result)
    assert trace_files(tmp_path / "profile") == []
    lost = "not written: still recording in thread 'rollout-worker' at interpreter exit"
    assert result.stderr.count("TraceWriteWarning") == 1 and lost in result.stderr, result.stderr
    summary = result.stdout.replace("\n", "")
    assert "NOT WRITTEN" in summary
    assert "rollout/gen step 1: still recording in thread 'rollout-worker'" in summary, result.stdout


SUSPENDED_IN_A_FUSED_STEP = """
    import sys
    import torch
    import torchstep_prof as tsp

    def steps():
        with tsp.step(2):                                  # a fused trace, never exited
            with tsp.profile_region("trainer", "forward"):
                torch.ones(4).sum()
            yield

    runner = steps()
    with tsp.configure(save_path="profile", discrete=False), tsp.schedule(steps=[2]):
        next(runner)
    sys.exit(3)
"""


def test_a_generator_suspended_inside_a_fused_step_writes_its_trace_at_exit(tmp_path):
    result = run_script(SUSPENDED_IN_A_FUSED_STEP, tmp_path)
    assert result.returncode == 3, result.stderr
    assert_quiet_exit(result)
    [path] = trace_files(tmp_path / "profile")
    check_trace_file(path)
    assert (parse_trace_name(path).role, parse_trace_name(path).step) == ("trainer", 2)
    assert "trainer/forward" in range_names(load_trace(path))


BEGUN_AND_NEVER_ENDED = """
    import torch
    import torchstep_prof as tsp

    iter_num = 0
    while True:
        tsp.begin_step(iter_num)
        with tsp.profile_region("trainer", "forward"):
            torch.ones(4).sum()
        if iter_num == 1:
            raise RuntimeError("loss diverged")           # leaves the script with step 1 open
        iter_num += 1
"""


def test_a_step_begun_and_never_ended_is_written_at_exit_whatever_ended_the_script(tmp_path):
    # Profiling switched on by the environment: no scope in the code ends the step.
    result = run_script(
        BEGUN_AND_NEVER_ENDED,
        tmp_path,
        TORCHSTEP_PROF_OVERRIDES="schedule.steps=[0,1] discrete=false save_path=profile",
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.rstrip().endswith("RuntimeError: loss diverged")  # the user's own error
    assert_quiet_exit(result)
    files = trace_files(tmp_path / "profile")
    assert sorted(parse_trace_name(p).step for p in files) == [0, 1]
    for path in files:
        check_trace_file(path)
        assert "trainer/forward" in range_names(load_trace(path))


FORKED_WHILE_A_STEP_IS_BEGUN = """
    import os
    import torch
    import torchstep_prof as tsp

    with tsp.configure(save_path="profile", discrete=False, summary=False), tsp.schedule(steps=[1]):
        tsp.begin_step(1)
        with tsp.profile_region("trainer", "forward"):
            torch.ones(4).sum()
        pid = os.fork()
        if pid == 0:  # the child would end the inherited step at its next begin_step
            tsp.begin_step(2)
            tsp.end_step()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status), "parent", os.getpid(), flush=True)
        tsp.begin_step(2)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_ends_a_step_its_parent_began(tmp_path):
    result = run_script(FORKED_WHILE_A_STEP_IS_BEGUN, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "child exit 0" in result.stdout
    [path] = trace_files(tmp_path / "profile")  # the parent's step 1 only
    name = parse_trace_name(path)
    assert (name.step, name.pid) == (1, int(result.stdout.split("parent")[1].split()[0]))
    assert "trainer/forward" in range_names(check_trace_file(path))


def test_a_script_ended_by_ctrl_c_exits_as_python_does_after_profiling(tmp_path):
    # CPython exits by SIGINT (the shell's 130) when the script ends on an unhandled
    # KeyboardInterrupt; an import inside our at-exit summary used to make that exit 1.
    code = """
        import sys
        import torch
        import torchstep_prof as tsp

        if sys.argv[1] == "profiled":
            with tsp.schedule(steps=[1]), tsp.on_finish("true"):
                with tsp.step(1), tsp.profile_region("actor", "update"):
                    torch.ones(3).sum()
        raise KeyboardInterrupt
    """
    plain = run_script(code, tmp_path, "plain")
    profiled = run_script(code, tmp_path, "profiled")
    assert plain.returncode == -2  # killed by SIGINT, as python does
    assert profiled.returncode == plain.returncode, profiled.stderr
    assert "KeyboardInterrupt" in profiled.stderr
    assert len(trace_files(tmp_path / "outputs" / "profile")) == 1
