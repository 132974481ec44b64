"""``torchstep-prof run``: what a step's trace holds (the script's own ranges around each iteration
whole, the data loader, zero_grad, the update) and what ends a step (``--step-on``), through real
subprocesses on tests/scripts/train_ranges.py, single process and under torchrun."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dist_helpers import LAUNCH_TIMEOUT_S, worker_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
RANGES = SCRIPTS / "train_ranges.py"
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def tsp_run(options: list[str], script_args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torchstep_prof", "run", *options, "--", str(RANGES), *script_args]
    return subprocess.run(cmd, cwd=cwd, env=worker_env({"COLUMNS": "200"}), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S)  # fmt: skip


def step_traces(folder: Path) -> dict[int, dict]:
    """``{step: trace JSON}`` of the traces in ``folder``."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        trace = json.loads(path.read_text())
        number = trace["torchstep_prof"]["step"]
        assert number not in found, f"two traces of step {number}"
        found[number] = trace
    return found


def complete(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def named(trace: dict, prefix: str) -> list[dict]:
    return [e for e in complete(trace) if e["name"].startswith(prefix)]


def exactly(trace: dict, name: str) -> list[dict]:
    return [e for e in complete(trace) if e["name"] == name]


def inside(outer: dict, inner: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def assert_holds_its_iteration(trace: dict, number: int) -> None:
    """The step-``number`` trace holds ``script/iter<number>`` whole, and no other iteration."""
    iters = named(trace, "script/iter")
    assert [e["name"] for e in iters] == [f"script/iter{number}"], [e["name"] for e in iters]
    (it,) = iters
    (step,) = named(trace, f"ProfilerStep#{number}")
    assert inside(step, it)
    # What runs inside the iteration's range before the forward is there too.
    (batch,) = named(trace, LOADER)
    assert inside(it, batch)


def test_a_steps_trace_holds_its_iteration_whole_from_the_data_loader_on(tmp_path):
    done = tsp_run(["--steps", "1,3,4"], ["--iters", "5"], tmp_path)
    assert done.returncode == 0, done.stderr
    found = step_traces(tmp_path / "outputs" / "profile")
    assert sorted(found) == [1, 3, 4]
    for number in (3, 4):
        trace = found[number]
        assert_holds_its_iteration(trace, number)
        (it,) = named(trace, "script/iter")
        (update,) = named(trace, "Optimizer.step#SGD.step")
        (zero,) = named(trace, "Optimizer.zero_grad#SGD.zero_grad")
        assert inside(it, update) and inside(it, zero)
        assert len(exactly(trace, "aten::mse_loss")) == 1
    # Step 1 begins with the script: the model's construction is in it.
    assert [e["name"] for e in named(found[1], "script/")] == ["script/setup", "script/iter1"]
    assert "a step ended at each Optimizer.step call" in done.stdout


def test_consecutive_selected_steps_with_ranges_around_the_update_never_crash(tmp_path):
    """The script's range around each iteration encloses the optimizer step: a profiler started
    inside it (or inside torch's Optimizer.step range) crashes torch. Repeated: a crash is
    likely, not certain, in one run."""

    def one(index: int) -> tuple[subprocess.CompletedProcess, Path]:
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        update = ["sgd", "lbfgs", "manual"][index % 3]
        step_on = ["--step-on", "backward"] if update == "manual" else []
        return tsp_run(["--steps", "2-5", *step_on], ["--iters", "6", "--update", update], folder), folder

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, range(8)))
    for done, folder in results:
        assert done.returncode == 0, done.stderr[-3000:]
        found = step_traces(folder / "outputs" / "profile")
        assert sorted(found) == [2, 3, 4, 5]
        for number, trace in found.items():
            assert_holds_its_iteration(trace, number)


def test_a_range_around_the_loop_opened_in_a_profiled_step_stops_profiling_until_it_closes(tmp_path):
    # Step 1 begins with the script, so it opens script/epoch: no trace may start inside it.
    done = tsp_run(["--steps", "1,2,3"], ["--iters", "4", "--epoch-range"], tmp_path)
    assert done.returncode == 0, done.stderr
    found = step_traces(tmp_path / "outputs" / "profile")
    assert sorted(found) == [1]
    # Step 1 ended when iteration 2's range opened: iteration 1 is whole in it.
    assert [e["name"] for e in named(found[1], "script/iter")] == ["script/iter1"]
    for number in (2, 3):
        assert f"step {number} not profiled: the range 'script/epoch', opened in a profiled step, was still open" \
            in done.stdout, done.stdout


def test_a_range_around_the_loop_opened_before_profiling_is_no_obstacle(tmp_path):
    done = tsp_run(["--steps", "3,4"], ["--iters", "5", "--epoch-range"], tmp_path)
    assert done.returncode == 0, done.stderr
    found = step_traces(tmp_path / "outputs" / "profile")
    assert sorted(found) == [3, 4]
    for number, trace in found.items():
        assert_holds_its_iteration(trace, number)


def test_step_on_backward_ends_a_step_at_each_top_level_backward(tmp_path):
    # A gradient penalty: torch.autograd.grad(create_graph=True) then backward through it; the
    # grad call ends nothing, the backward (double backward inside) ends one step.
    done = tsp_run(["--steps", "2,4", "--step-on", "backward"], ["--iters", "4", "--update", "manual", "--penalty"],
                   tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = step_traces(tmp_path / "outputs" / "profile")
    assert sorted(found) == [2, 4]
    for number, trace in found.items():
        assert_holds_its_iteration(trace, number)
        (it,) = named(trace, "script/iter")
        # The hand-written update after the backward stays in the iteration's range, so in its step.
        adds = [e for e in exactly(trace, "aten::add_") if inside(it, e)]
        assert len(adds) >= 4
    assert "a step ended at each top-level autograd backward" in done.stdout
    assert "never ran" not in done.stdout


def test_step_every_groups_backwards(tmp_path):
    done = tsp_run(["--steps", "2", "--step-on", "backward", "--step-every", "2"], ["--iters", "4", "--update", "manual"],
                   tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (trace,) = step_traces(tmp_path / "outputs" / "profile").values()
    assert [e["name"] for e in named(trace, "script/iter")] == ["script/iter3", "script/iter4"]


@pytest.mark.parametrize("module", ["train_ranges", "__main__"])
def test_step_on_a_function_of_the_script(tmp_path, module):
    done = tsp_run(["--steps", "2,3", "--step-on", f"{module}:sgd_update"], ["--iters", "4", "--update", "function"],
                   tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = step_traces(tmp_path / "outputs" / "profile")
    assert sorted(found) == [2, 3]
    for number, trace in found.items():
        assert_holds_its_iteration(trace, number)
    assert f"a step ended at each return of {module}:sgd_update" in done.stdout


def test_step_on_a_function_of_an_imported_module(tmp_path):
    (tmp_path / "helpers_mod.py").write_text(
        "import torch\n"
        "def update(model):\n"
        "    with torch.no_grad():\n"
        "        for p in model.parameters():\n"
        "            p.add_(p.grad, alpha=-0.1)\n"
        "            p.grad = None\n"
    )
    (tmp_path / "main_script.py").write_text(
        "import torch\n"
        "from torch.profiler import record_function\n"
        "from helpers_mod import update\n"
        "model = torch.nn.Linear(4, 1)\n"
        "for i in range(1, 5):\n"
        "    with record_function(f'script/iter{i}'):\n"
        "        model(torch.ones(2, 4)).sum().backward()\n"
        "        update(model)\n"
    )
    cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "3", "--step-on", "helpers_mod:update",
           "main_script.py"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    (trace,) = step_traces(tmp_path / "outputs" / "profile").values()
    assert trace["torchstep_prof"]["step"] == 3
    assert [e["name"] for e in named(trace, "script/iter")] == ["script/iter3"]


def test_lbfgs_keeps_its_closure_in_its_step(tmp_path):
    done = tsp_run(["--steps", "2"], ["--iters", "3", "--update", "lbfgs"], tmp_path)
    assert done.returncode == 0, done.stderr
    (trace,) = step_traces(tmp_path / "outputs" / "profile").values()
    assert_holds_its_iteration(trace, 2)
    (update,) = named(trace, "Optimizer.step#LBFGS.step")
    forwards = exactly(trace, "aten::mse_loss")
    assert len(forwards) >= 2 and all(inside(update, f) for f in forwards)


@pytest.mark.parametrize(
    "value, says",
    [
        ("bogus", "--step-on: 'bogus' is not allowed: use 'optimizer' (the default), 'backward' or MODULE:QUALNAME"),
        ("train:main.<locals>.f", "is not allowed"),
        ("train_ranges:no_such_function", "defines no no_such_function at module level"),
    ],
)
def test_a_bad_step_on_is_a_usage_error(tmp_path, value, says):
    cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "1", "--step-on", value, str(RANGES)]
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "usage:" in done.stderr, done.stderr
    assert not (tmp_path / "outputs").exists()


def test_a_function_never_called_ends_no_step_and_the_summary_says_so(tmp_path):
    done = tsp_run(["--steps", "1", "--step-on", "train_ranges:sgd_update"], ["--iters", "2"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "outputs" / "profile").glob("*.json"))
    assert "no step boundary was seen (no return of train_ranges:sgd_update)" in done.stdout


@pytest.mark.distributed
def test_every_rank_holds_its_iteration_under_torchrun(tmp_path):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "torchstep_prof", "run", "--steps", "2,3", "--all-ranks", str(RANGES), "--dist", "--iters", "4",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                          start_new_session=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    paths = sorted((tmp_path / "outputs" / "profile").glob("*.json"))
    seen = collections.Counter()
    for path in paths:
        trace = json.loads(path.read_text())
        rank = re.search(r"rank(\d)-of-2", path.name).group(1)
        number = trace["torchstep_prof"]["step"]
        seen[(rank, number)] += 1
        assert_holds_its_iteration(trace, number)
    assert seen == {("0", 2): 1, ("0", 3): 1, ("1", 2): 1, ("1", 3): 1}
