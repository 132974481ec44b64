"""``torchstep-prof run``: an unmodified training script (tests/scripts/train_tiny.py) profiled
through real subprocesses, single process and under torchrun with 2 gloo ranks."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from dist_helpers import LAUNCH_TIMEOUT_S, worker_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = SCRIPTS / "train_tiny.py"


def tsp_run(options: list[str], script_args: list[str], cwd: Path, env: Optional[dict] = None,
            script: Path = TRAIN) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m torchstep_prof run OPTIONS -- SCRIPT ARGS`` in ``cwd``."""
    cmd = [sys.executable, "-m", "torchstep_prof", "run", *options, "--", str(script), *script_args]
    return subprocess.run(cmd, cwd=cwd, env=worker_env({"COLUMNS": "200", **(env or {})}), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


def traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json")) if folder.exists() else []


def events(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def names(path: Path) -> collections.Counter:
    return collections.Counter(e["name"] for e in events(path))


def span(event: dict) -> tuple[float, float]:
    return event["ts"], event["ts"] + event["dur"]


def inside(outer: dict, inner: dict) -> bool:
    (a, b), (c, d) = span(outer), span(inner)
    return a <= c and d <= b


def frames(stderr: str) -> list[str]:
    return re.findall(r'File "([^"]+)", line \d+', stderr)


# --- single process ------------------------------------------------------------------------


def test_the_script_sees_what_python_gives_it_and_its_step_is_traced(tmp_path):
    plain = subprocess.run([sys.executable, str(TRAIN), "--report", "plain.json", "--exit-code", "3", "--lr", "0.1"],
                           cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    done = tsp_run(["--steps", "2"], ["--report", "run.json", "--exit-code", "3", "--lr", "0.1"], tmp_path)
    assert plain.returncode == 3, plain.stderr
    assert done.returncode == 3, done.stderr
    as_python = json.loads((tmp_path / "plain.json").read_text())
    as_run = json.loads((tmp_path / "run.json").read_text())
    as_python["argv"][2] = as_run["argv"][2] = "<report>"
    assert as_run == as_python
    assert as_run["argv"][0] == str(TRAIN) and as_run["name"] == "__main__" and as_run["spec"] is None
    assert as_run["path0"] == str(SCRIPTS) and as_run["main_is_me"]
    assert as_run["cached"] is None  # python sets __cached__ = None for a script

    (trace,) = traces(tmp_path / "outputs" / "profile")
    assert trace.name.startswith("main_train_step2_rank0-of-1_")
    counts = names(trace)
    # Step 2's own forward, backward and optimizer step, and nothing of steps 1 or 3.
    assert counts["ProfilerStep#2"] == 1
    assert counts["Optimizer.step#SGD.step"] == 1
    assert counts["aten::mse_loss"] == 1
    assert counts["autograd::engine::evaluate_function: MseLossBackward0"] == 1
    assert json.loads(trace.read_text())["torchstep_prof"]["step"] == 2
    assert "1 trace(s) written" in done.stdout


LOOP_FROM_0 = """
import os
import torch
import torchstep_prof as tsp
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scope = tsp.configure(discrete=False, schedule={"steps": [2]}) if os.environ.get("INSTRUMENTED") else tsp.configure()
with scope:
    for iter_num in range(5):  # nanoGPT's loop: iterations count from 0
        if os.environ.get("INSTRUMENTED"):
            tsp.begin_step(iter_num)
        with torch.profiler.record_function(f"iteration{iter_num}"):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
"""


def test_step_numbers_say_which_iteration_they_were_under_run_and_in_code(tmp_path):
    """The same loop counting from 0: `run --steps 2` traces iteration 1 (the second
    Optimizer.step call), `schedule(steps=[2])` with `begin_step(iter_num)` (fused) iteration 2. Both
    files say step2; their metadata and the exit summary say which iteration that was."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP_FROM_0)
    under_run = tsp_run(["--steps", "2", "--save-path", "run"], [], tmp_path, script=script)
    assert under_run.returncode == 0, under_run.stderr
    in_code = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                             env=worker_env({"INSTRUMENTED": "1", "COLUMNS": "200"}), timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    assert in_code.returncode == 0, in_code.stderr
    (run_trace,) = traces(tmp_path / "run")
    (code_trace,) = traces(tmp_path / "outputs" / "profile")
    assert "_step2_" in run_trace.name and "_step2_" in code_trace.name
    assert [n for n in names(run_trace) if n.startswith("iteration")] == ["iteration1"]
    assert [n for n in names(code_trace) if n.startswith("iteration")] == ["iteration2"]
    run_meta = json.loads(run_trace.read_text())["torchstep_prof"]
    code_meta = json.loads(code_trace.read_text())["torchstep_prof"]
    assert run_meta["step_counted_by"] == "run" and run_meta["iterations"] == [1, 1]
    said = "step 2 = Optimizer.step call 2 of the run: iteration 1 of a loop counting from 0 (begin_step(1) in code)"
    assert run_meta["step_means"] == said
    assert said in under_run.stdout
    assert code_meta["step_counted_by"] == "code" and "iterations" not in code_meta
    assert "begin_step(2)" in code_meta["step_means"]


def test_exit_codes_and_tracebacks_are_the_scripts(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        message = pool.submit(tsp_run, ["--steps", "1000"], ["--steps", "1", "--exit-message", "bye now"], tmp_path)
        raised = pool.submit(tsp_run, ["--steps", "1000"], ["--steps", "1", "--raise", "boom"], tmp_path)
        plain = pool.submit(subprocess.run, [sys.executable, str(TRAIN), "--steps", "1", "--raise", "boom"],
                            cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)  # fmt: skip
    message, raised, plain = message.result(), raised.result(), plain.result()
    assert message.returncode == 1 and "bye now" in message.stderr, message.stderr
    assert raised.returncode == 1
    assert "RuntimeError: boom" in raised.stderr
    # The frames python itself shows: the script's, none of the command line's or runpy's.
    assert frames(raised.stderr) == frames(plain.stderr) == [str(TRAIN)] * 3, raised.stderr


def python_and_run(tmp_path: Path, target: list[str]) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """``python TARGET`` and ``python -m torchstep_prof run --steps 1 TARGET``, side by side in ``tmp_path``."""
    def one(cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT_S)  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plain = pool.submit(one, [sys.executable, *target])
        done = pool.submit(one, [sys.executable, "-m", "torchstep_prof", "run", "--steps", "1", *target])
    return plain.result(), done.result()


def test_a_syntax_error_is_reported_as_python_reports_it(tmp_path):
    (tmp_path / "syn.py").write_text("import torch\nx = (1,\n")
    plain, done = python_and_run(tmp_path, ["syn.py"])
    assert plain.returncode == done.returncode == 1
    assert "SyntaxError: '(' was never closed" in done.stderr
    # The script's error block alone: no "Traceback" and no frame of ours.
    assert done.stderr == plain.stderr, done.stderr


def test_a_module_traceback_is_python_ms(tmp_path):
    (tmp_path / "modboom.py").write_text('def f():\n    raise ValueError("mod boom")\nf()\n')
    plain, done = python_and_run(tmp_path, ["-m", "modboom"])
    assert plain.returncode == done.returncode == 1
    # runpy's two frames (_run_module_as_main, _run_code) then the module's, as python -m shows.
    assert done.stderr == plain.stderr, done.stderr
    assert frames(done.stderr) == ["<frozen runpy>"] * 2 + [str(tmp_path / "modboom.py")] * 2


@pytest.mark.parametrize("target", [["-m", "pkg"], ["folder"]])
def test_a_package_or_folder_without_main_exits_1_as_python_does(tmp_path, target):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "folder").mkdir()
    plain, done = python_and_run(tmp_path, target)
    assert plain.returncode == done.returncode == 1
    # One line: "python: No module named pkg.__main__; 'pkg' is a package and cannot be directly
    # executed" / "python: can't find '__main__' module in '.../folder'".
    assert done.stderr == plain.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_regions_nest_inside_the_fused_trace_and_step_every_groups_optimizer_steps(tmp_path):
    options = ["--steps", "2", "--step-every", "2", "--region", "Encoder=enc/fwd", "--region", "Head",
               "--region", "Missing"]  # fmt: skip
    done = tsp_run(options, ["--steps", "6"], tmp_path)
    assert done.returncode == 0, done.stderr
    (trace,) = traces(tmp_path / "outputs" / "profile")
    # Regions' roles name the fused trace, in order of first entry.
    assert trace.name.startswith("enc-Head_train_step2_rank0-of-1_")
    counts = names(trace)
    # Step 2 = the 3rd and 4th optimizer steps: two forwards, two updates.
    assert counts["Optimizer.step#SGD.step"] == 2
    assert counts["enc/fwd"] == 2 and counts["Head/forward"] == 2
    assert counts["aten::mse_loss"] == 2
    (step_event,) = [e for e in events(trace) if e["name"] == "ProfilerStep#2"]
    ranges = [e for e in events(trace) if e["name"] in ("enc/fwd", "Head/forward")]
    assert all(inside(step_event, r) for r in ranges)
    linears = [e for e in events(trace) if e["name"] == "aten::linear"]
    enc = [r for r in ranges if r["name"] == "enc/fwd"]
    # The encoder's two Linear layers run inside its range.
    assert sum(any(inside(r, op) for r in enc) for op in linears) == 4
    assert "--region Missing" in done.stdout and "Encoder" not in done.stdout.split("--region", 1)[1]


def test_discrete_writes_one_trace_per_region(tmp_path):
    done = tsp_run(["--steps", "3", "--discrete", "--region", "Encoder=enc/fwd"], ["--steps", "4"], tmp_path)
    assert done.returncode == 0, done.stderr
    (trace,) = traces(tmp_path / "outputs" / "profile")
    assert trace.name.startswith("enc_fwd_step3_rank0-of-1_")
    assert json.loads(trace.read_text())["torchstep_prof"]["discrete"] is True


@pytest.mark.parametrize("steps", [[], ["--steps", "2"]], ids=["spans-only", "one-step-traced"])
def test_with_spans_every_steps_region_forwards_are_in_the_span_file(tmp_path, steps):
    from torchstep_prof.timeline.reading import read_span_folder

    options = ["--spans", "spans", *steps, "--region", "Encoder=enc/fwd", "--region", "Head"]
    done = tsp_run(options, ["--steps", "4", "--eval-after"], tmp_path)
    assert done.returncode == 0, done.stderr
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    # The step blocks are the optimizer's steps; step 5 (the evaluation's forward) never ended.
    assert [b.number for b in process.steps] == [1, 2, 3, 4]
    labels = collections.Counter((s.role, s.stage) for s in process.spans)
    assert labels == {("enc", "fwd"): 5, ("Head", "forward"): 5}  # 4 steps, then the evaluation
    for block in process.steps:
        inside_step = [(s.role, s.stage) for s in process.spans if block.start <= s.start and s.end <= block.end]
        assert sorted(inside_step) == [("Head", "forward"), ("enc", "fwd")], block
    if steps:  # the traced step holds its forwards as ranges, as without spans
        (trace,) = traces(tmp_path / "outputs" / "profile")
        assert "_step2_" in trace.name
        assert names(trace)["enc/fwd"] == 1 and names(trace)["Head/forward"] == 1


def test_a_script_without_an_optimizer_writes_nothing_and_says_so(tmp_path):
    done = tsp_run(["--steps", "1"], ["--no-optimizer"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert traces(tmp_path / "outputs" / "profile") == []
    assert "no step boundary was seen" in done.stdout


def test_a_step_no_optimizer_step_ended_is_dropped(tmp_path):
    # Step 5 is armed after the 4th optimizer step and begins at the evaluation's forward.
    done = tsp_run(["--steps", "4,5"], ["--steps", "4", "--eval-after"], tmp_path)
    assert done.returncode == 0, done.stderr
    (trace,) = traces(tmp_path / "outputs" / "profile")
    assert "_step4_" in trace.name
    assert "step 5 began but no boundary (each Optimizer.step call) ended it" in done.stdout


def test_config_file_then_command_line_then_environment(tmp_path):
    (tmp_path / "profile.yaml").write_text("schedule:\n  steps: [1]\nsave_path: from-file\ngzip: false\n")
    options = ["--config", "profile.yaml", "--save-path", "from-cli", "--set", "process_role=learner",
               "--on-finish", 'echo "hook saw $TORCHSTEP_PROF_TRACES"']  # fmt: skip
    done = tsp_run(options, ["--steps", "4"], tmp_path, env={"TORCHSTEP_PROF_OVERRIDES": "schedule.steps=[3]"})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "from-file").exists()
    (trace,) = traces(tmp_path / "from-cli")
    assert trace.name.startswith("learner_train_step3_rank0-of-1_")
    assert re.search(rf"\[rank 0\] hook saw \S*{re.escape(trace.name)}", done.stdout), done.stdout


@pytest.mark.parametrize(
    "options, says",
    [
        (["--steps", "two"], "--steps: 'two' is not an integer"),
        (["--steps", "1", "--set", "schedule.wait=-1"], "schedule.wait: must be >= 0 (got -1)"),
        (["--steps", "1", "--contents", "gpu"], "'gpu' is not one of"),
        (["--steps", "1", "--wait", "1"], "use one"),
        (["--steps", "1", "--region", "not a class"], "is not a class name"),
        (["--steps", "1", "--discrete"], "--region"),
        ([], "no step is selected"),
        (["--steps", "1", "--bogus"], "unrecognized arguments: --bogus"),
        (["--stpes", "3"], "torchstep-prof run: error: unrecognized arguments: --stpes (did you mean --steps?)"),
        (["--steps", "3-2"], "--steps: the range '3-2' is reversed (write 2-3"),
        (["--steps", "0,2"], "step 0 never runs under run"),
        (["--set", "schedule.steps=[0]"], "step 0 never runs under run"),
    ],
)
def test_bad_options_are_usage_errors_before_the_script_runs(tmp_path, options, says):
    cmd = [sys.executable, "-m", "torchstep_prof", "run", *options, str(TRAIN), "--touch", "ran"]
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "usage:" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_an_environment_file_without_a_schedule_is_named_as_why_no_step_is_selected(tmp_path):
    (tmp_path / "env.yaml").write_text("save_path: envdir\n")
    cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "2", str(TRAIN), "--touch", "ran"]
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env({"TORCHSTEP_PROF_CONFIG": "env.yaml"}),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    # The file replaces the whole configuration, --steps included: it is the reason, not --steps.
    assert "no step is selected: TORCHSTEP_PROF_CONFIG=env.yaml replaces" in done.stderr, done.stderr
    assert "pass --steps" not in done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("target, says", [(["missing.py"], "missing.py"), (["-m", "no_such_module_x"], "no_such_module_x")])
def test_a_missing_script_or_module_exits_2_naming_it(tmp_path, target, says):
    cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "1", *target]
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_module_runs_as_python_m_runs_it(tmp_path):
    (tmp_path / "train_mod.py").write_text(TRAIN.read_text())
    cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "2", "-m", "train_mod", "--report", "r.json",
           "--exit-code", "4"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 4, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["argv"][0] == str(tmp_path / "train_mod.py") and report["spec"] == "train_mod"
    assert report["path0"] == str(tmp_path) and report["name"] == "__main__"
    assert report["cached"] == str(tmp_path / "__pycache__" / f"train_mod.{sys.implementation.cache_tag}.pyc")
    (trace,) = traces(tmp_path / "outputs" / "profile")
    assert trace.name.startswith("main_train_step2_")


def test_consecutive_selected_steps_never_crash(tmp_path):
    """Ending one trace and starting the next around an optimizer step crashed about half the
    time when the start ran inside torch's Optimizer.step range: 10 runs of steps 2,3,4, half of
    them with a --region."""

    def one(index: int) -> tuple[int, list[str], str]:
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        regions = ["--region", "Encoder"] if index % 2 else []  # module hooks on and off too
        done = tsp_run(["--steps", "2,3,4", *regions], ["--steps", "5"], folder)
        return done.returncode, [p.name.split("_")[2] for p in traces(folder / "outputs" / "profile")], done.stderr

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, range(10)))
    for code, steps, stderr in results:
        assert code == 0, stderr[-2000:]
        assert sorted(steps) == ["step2", "step3", "step4"]


# --- torchrun ------------------------------------------------------------------------------


@pytest.mark.distributed
def test_every_rank_profiles_under_torchrun(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "torchstep_prof", "run", "--steps", "2", "--all-ranks",
        "--on-finish", 'echo "hook rank $TORCHSTEP_PROF_RANK"', str(TRAIN), "--dist", "--steps", "3",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                          start_new_session=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = traces(tmp_path / "outputs" / "profile")
    assert sorted(re.search(r"rank\d-of-\d", p.name).group(0) for p in found) == ["rank0-of-2", "rank1-of-2"]
    for path in found:
        trace = json.loads(path.read_text())
        assert trace["torchstep_prof"]["step"] == 2
        assert names(path)["Optimizer.step#SGD.step"] == 1
    assert "hook rank 0" in done.stdout and "hook rank 1" in done.stdout


def test_a_script_ended_by_ctrl_c_exits_by_sigint_as_under_python(tmp_path):
    (tmp_path / "kbd.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.ones(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "raise KeyboardInterrupt\n"
    )
    plain, done = python_and_run(tmp_path, ["kbd.py"])
    assert plain.returncode == -2  # python ends an unhandled KeyboardInterrupt by SIGINT
    assert done.returncode == plain.returncode, done.stderr
    assert list((tmp_path / "outputs" / "profile").glob("*step1*.json"))
