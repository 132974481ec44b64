"""On-demand traces of a running job (docs/on-demand.md): real jobs
(a 2-rank torchrun, a ``torchstep-prof run``), real ``torchstep-prof trigger`` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from dist_helpers import WORKERS, _kill, worker_env
from torchstep_prof import parse_trace_name

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WAIT_S = 240.0  # generous: a loaded 2-core machine


def start(cmd: list[str], log: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=worker_env(env), cwd=log.parent,
                                start_new_session=True)


def statuses(od: Path) -> dict[int, dict]:
    found = {}
    for path in od.glob("status-rank*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # never half-written (a rename), but be patient with a vanished one
        found[data["rank"]] = data
    return found


def wait_for(what: str, ready: Callable[[], bool], job: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if job.poll() is not None and not ready():
            raise AssertionError(f"the job ended (exit {job.returncode}) before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            _kill([job])
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")
        time.sleep(0.05)


def trigger(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchstep_prof", "trigger", *args], capture_output=True,
                          text=True, env=worker_env(), timeout=120)


def served(od: Path, request_id: str, ranks: int) -> bool:
    """Every rank has finished serving the request (its outcome is no longer pending)."""
    found = statuses(od)
    outcomes = [e["outcome"] for s in found.values() for e in s["served"] if e["id"] == request_id]
    return len(found) == ranks and len(outcomes) == ranks and "pending" not in outcomes


def steps_by_rank(folder: Path) -> dict[int, list[int]]:
    """Each rank's traced steps, from the file names, checked against the trace's own metadata."""
    found: dict[int, list[int]] = {}
    for path in sorted(folder.glob("*.json")):
        name = parse_trace_name(path)
        meta = json.loads(path.read_text())["torchstep_prof"]
        assert (meta["step"], meta["rank"]) == (name.step, name.rank), path
        found.setdefault(name.rank, []).append(name.step)
    return {rank: sorted(steps) for rank, steps in found.items()}


def request_of(result: subprocess.CompletedProcess[str], od: Path) -> dict:
    assert result.returncode == 0, result.stderr
    request = json.loads((od / "request.json").read_text())
    assert request["id"] in result.stdout
    return request


@pytest.mark.parametrize("loop", ["step", "begin"])
def test_two_ranks_profile_the_same_triggered_steps_and_only_the_chosen_ranks(tmp_path, loop):
    od = tmp_path / "od"
    log = tmp_path / "torchrun.log"
    job = start([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 str(WORKERS / "on_demand_worker.py"), str(tmp_path), "100", loop], log)
    try:
        wait_for("both ranks at step 15", lambda: all(
            (s.get("step") or 0) >= 15 for s in statuses(od).values()) and len(statuses(od)) == 2, job, log)
        first = request_of(trigger(str(od), "--next", "2", "--align", "10"), od)
        s1 = first["steps"][0]
        assert first["steps"] == [s1, s1 + 1] and s1 % 10 == 0 and s1 > 15
        wait_for(f"both ranks served {first['id']}", lambda: served(od, first["id"], 2), job, log)

        # --align 20: the job ran its finish hooks just before, and speeds up again meanwhile.
        second = request_of(trigger(str(od), "--next", "2", "--align", "20", "--ranks", "1"), od)
        s2 = second["steps"][0]
        assert s2 % 20 == 0 and s2 > s1 + 1
        wait_for(f"both ranks served {second['id']}", lambda: served(od, second["id"], 2), job, log)
        shown = trigger(str(od), "--status")
        job.wait(timeout=WAIT_S)
    finally:
        _kill([job])
    assert job.returncode == 0, log.read_text()
    assert steps_by_rank(tmp_path / "traces") == {0: [s1, s1 + 1], 1: [s1, s1 + 1, s2, s2 + 1]}
    outcomes = {rank: {e["id"]: e["outcome"] for e in s["served"]} for rank, s in statuses(od).items()}
    assert outcomes[0] == {first["id"]: f"profiled {s1}-{s1 + 1}", second["id"]: "not selected (--ranks)"}
    assert outcomes[1] == {first["id"]: f"profiled {s1}-{s1 + 1}", second["id"]: f"profiled {s2}-{s2 + 1}"}
    # --status: each rank's step and the requests it served, while the job ran.
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{od}: 2 rank(s)"
    for rank in (0, 1):
        row = next(line for line in lines if line.split()[:1] == [str(rank)])
        assert int(row.split()[1]) >= s2 and first["id"] in row and second["id"] in row
    # The configured finish hook ran after each request's steps, on the ranks that profiled,
    # handed that request's traces (as a schedule's hook is).
    # It never runs again at the scope's exit with an empty list.
    runs = [line for line in (tmp_path / "hook_runs.txt").read_text().split("\n") if line.strip()]
    assert all(line.split(" ")[1:] != [""] for line in runs), runs
    handed = [(int(line.split(" ")[0]), tuple(parse_trace_name(t).step for t in line.split(" ")[1].split(",")))
              for line in runs]
    assert sorted(handed) == sorted([(0, (s1, s1 + 1)), (1, (s1, s1 + 1)), (1, (s2, s2 + 1))])


def test_torchstep_prof_run_serves_a_request_at_optimizer_steps(tmp_path):
    od = tmp_path / "od"
    log = tmp_path / "run.log"
    job = start([sys.executable, "-m", "torchstep_prof", "run", "--on-demand", str(od), "--set", "on_demand.poll_s=0.2",
                 "--save-path", str(tmp_path / "traces"), str(SCRIPTS / "optimizer_loop.py"), "80"], log)
    try:
        wait_for("step 10", lambda: (statuses(od).get(0, {}).get("step") or 0) >= 10, job, log)
        request = request_of(trigger(str(od), "--next", "2", "--align", "5"), od)
        wait_for(f"{request['id']} served", lambda: served(od, request["id"], 1), job, log)
        job.wait(timeout=WAIT_S)
    finally:
        _kill([job])
    assert job.returncode == 0, log.read_text()
    s = request["steps"][0]
    assert s % 5 == 0
    assert steps_by_rank(tmp_path / "traces") == {0: [s, s + 1]}
    # A fused trace of an optimizer step holds that step's forward, backward and update.
    names = {e.get("name", "") for e in json.loads(next((tmp_path / "traces").glob("*.json")).read_text())["traceEvents"]}
    assert any(n.startswith("Optimizer.step") for n in names)


def test_missed_served_once_malformed_and_status(tmp_path):
    """One job (a single process, 120 steps): a malformed request is a warning naming the file
    and key and training goes on; a request for steps already past is reported as missed (summary,
    warning), not moved; a request is served once, even by a poll thread started again."""
    od = tmp_path / "od"
    log = tmp_path / "job.log"
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, time\nimport torchstep_prof as tsp\n"
        f"for phase in (1, 2):\n"
        f"    with tsp.configure(save_path={str(tmp_path / 'traces')!r}), tsp.on_demand({str(od)!r}, poll_s=0.1):\n"
        "        for n in range(1, 61):\n"
        "            with tsp.step(n):\n"
        "                time.sleep(0.03)\n"
        "    print('phase', phase, 'done', flush=True)\n"
    )
    job = start([sys.executable, str(script)], log)
    try:
        wait_for("step 10", lambda: (statuses(od).get(0, {}).get("step") or 0) >= 10, job, log)
        (od / "request.json").write_text(json.dumps({"id": "bad1", "steps": [40, "x"], "rank": [0]}))
        # Read before the next request replaces it (a loaded machine may poll late).
        wait_for("the malformed request read", lambda: "is malformed" in log.read_text(), job, log)
        missed = request_of(trigger(str(od), "--at", "2", "--next", "2"), od)
        wait_for("the missed request served", lambda: served(od, missed["id"], 1), job, log)
        wait_for("phase 1 over", lambda: "phase 1 done" in log.read_text(), job, log)
        job.wait(timeout=WAIT_S)
    finally:
        _kill([job])
    output = log.read_text()
    assert job.returncode == 0, output
    assert f"{od / 'request.json'} is malformed (steps[1]: must be an integer from 0 to 9007199254740992 (got 'x'); rank: unknown key" in output
    served_list = statuses(od)[0]["served"]
    # Served once: phase 2's poll thread found the request file still there and left it alone.
    assert [(e["id"], e["outcome"]) for e in served_list] == [(missed["id"], "missed 2-3")]
    line = f"on-demand request {missed['id']}: step(s) 2-3 not profiled (this rank was at step"
    assert f"torchstep_prof: {line}" in output  # the warning
    assert output.count(line) == 2  # and the summary's line at exit
    assert not (tmp_path / "traces").exists() or not list((tmp_path / "traces").glob("*.json"))
    shown = trigger(str(od), "--status")
    assert shown.returncode == 0
    assert f"{missed['id']} steps 2-3: missed 2-3" in shown.stdout and "stopped" in shown.stdout


def test_trigger_without_a_job_and_bad_options(tmp_path):
    result = trigger(str(tmp_path), "--next", "2")
    assert result.returncode == 1
    assert "no rank polls it (no status-rank*.json)" in result.stderr
    assert not (tmp_path / "request.json").exists()
    for args, message in ((["--next", "0"], "--next: must be from 1 to 100 steps (got 0)"),
                          (["--contents", "cpu,gpu"], "--contents: 'gpu' not among"),
                          (["--ranks", "1", "--all-ranks"], "not allowed with argument")):
        result = trigger(str(tmp_path), *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    written = trigger(str(tmp_path), "--at", "7", "--next", "3", "--ranks", "0,2", "--contents", "cpu,shapes", "--discrete")
    assert written.returncode == 0, written.stderr
    request = json.loads((tmp_path / "request.json").read_text())
    assert (request["steps"], request["ranks"], request["all_ranks"], request["contents"], request["discrete"]) == (
        [7, 8, 9], [0, 2], False, ["cpu", "shapes"], True)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]  # write + rename left nothing


def test_the_trigger_command_never_imports_torch(tmp_path):
    code = ("import sys; from torchstep_prof.cli import main; "
            f"main(['trigger', {str(tmp_path)!r}, '--at', '3']); main(['trigger', {str(tmp_path)!r}, '--status']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=worker_env(), timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_lightning_callback_serves_a_request(tmp_path):
    pytest.importorskip("lightning.pytorch", reason="lightning is not installed (pip install torchstep_prof[lightning])")
    od = tmp_path / "od"
    # Written before the job starts (--at needs no running rank): read at the poll thread's first poll.
    request = request_of(trigger(str(od), "--at", "8", "--next", "2"), od)
    script = tmp_path / "fit.py"
    script.write_text(
        "import time, torch\nimport lightning.pytorch as pl\n"
        "from torchstep_prof.integrations.lightning import TorchstepProfCallback\n"
        "class Tiny(pl.LightningModule):\n"
        "    def __init__(self):\n        super().__init__()\n        self.layer = torch.nn.Linear(8, 1)\n"
        "    def training_step(self, batch, batch_idx):\n        time.sleep(0.05)\n"
        "        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])\n"
        "    def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.01)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
        f"callback = TorchstepProfCallback(save_path={str(tmp_path / 'traces')!r}, "
        f"on_demand={{'dir': {str(od)!r}, 'poll_s': 0.05}})\n"
        "trainer = pl.Trainer(max_steps=14, accelerator='cpu', devices=1, logger=False, enable_checkpointing=False,\n"
        "                     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])\n"
        "trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=worker_env(),
                          cwd=tmp_path, timeout=WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_by_rank(tmp_path / "traces") == {0: [8, 9]}, done.stderr
    assert [e["outcome"] for e in statuses(od)[0]["served"] if e["id"] == request["id"]] == ["profiled 8-9"]


def test_the_environment_opts_in_and_a_request_sets_discrete_and_contents(tmp_path):
    """TORCHSTEP_PROF_OVERRIDES='on_demand.dir=...' and a loop with no scope at all; the request
    asks for one trace per region, with shapes, on rank 0."""
    od = tmp_path / "od"
    request = request_of(trigger(str(od), "--at", "12", "--discrete", "--contents", "cpu,shapes", "--ranks", "0"), od)
    script = tmp_path / "loop.py"
    script.write_text(
        "import time, torch\nimport torchstep_prof as tsp\nx = torch.randn(16, 16)\n"
        "for n in range(1, 41):\n"
        "    with tsp.step(n):\n"
        "        with tsp.profile_region('actor', 'forward'):\n            y = x @ x\n"
        "        with tsp.profile_region('critic', 'update'):\n            y = torch.tanh(x)\n"
        "        time.sleep(0.04)\n"
    )
    env = worker_env({"TORCHSTEP_PROF_OVERRIDES": f"on_demand.dir={od} on_demand.poll_s=0.05 "
                                                  f"save_path={tmp_path / 'traces'}"})
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    names = sorted((parse_trace_name(p).role, parse_trace_name(p).stage, parse_trace_name(p).step)
                   for p in (tmp_path / "traces").glob("*.json"))
    assert names == [("actor", "forward", 12), ("critic", "update", 12)], done.stderr
    trace = json.loads(next((tmp_path / "traces").glob("actor_forward_*.json")).read_text())
    assert trace["torchstep_prof"]["discrete"] is True
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"] if str(e.get("name", "")).startswith("aten::"))
    assert [e["outcome"] for e in statuses(od)[0]["served"] if e["id"] == request["id"]] == ["profiled 12"]


def test_bad_on_demand_settings_are_config_errors():
    import torchstep_prof as tsp

    with pytest.raises(tsp.ConfigError) as caught:
        tsp.on_demand("", poll_s=-1)
    assert str(caught.value).splitlines()[1:] == [
        "  on_demand.dir: must be a non-empty string (got '')",
        "  on_demand.poll_s: must be > 0 (got -1)",
    ]
    with pytest.raises(tsp.ConfigError, match=r"on_demand\.poll_s: must be a number of seconds \(got 'fast'\)"):
        tsp.configure(on_demand={"dir": "/tmp/x", "poll_s": "fast"})
    # A finite number the poll thread's wait cannot take (it once killed the thread).
    with pytest.raises(tsp.ConfigError, match=r"on_demand\.poll_s: must be at most 3600 seconds \(got 1e\+300\)"):
        tsp.on_demand("/tmp/x", poll_s=1e300)


def test_the_hugging_face_callback_serves_a_request(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install torchstep_prof[transformers])")
    od = tmp_path / "od"
    request = request_of(trigger(str(od), "--at", "8", "--next", "2"), od)
    script = tmp_path / "train.py"
    script.write_text(
        "import time, torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments\n"
        "from torchstep_prof.integrations.transformers import TorchstepProfCallback\n"
        "class Tokens(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 64\n"
        "    def __getitem__(self, i):\n        ids = torch.arange(8) + i\n"
        "        return {'input_ids': ids % 50, 'labels': ids % 50}\n"
        "class Slow(TrainerCallback):\n"
        "    def on_step_end(self, *args, **kwargs):\n        time.sleep(0.05)\n"
        "model = GPT2LMHeadModel(GPT2Config(vocab_size=50, bos_token_id=0, eos_token_id=0, n_positions=16, "
        "n_embd=16, n_layer=1, n_head=2))\n"
        f"args = TrainingArguments(output_dir={str(tmp_path / 'hf')!r}, per_device_train_batch_size=2, max_steps=14,\n"
        "    logging_strategy='no', save_strategy='no', report_to=[], use_cpu=True, dataloader_num_workers=0,\n"
        "    disable_tqdm=True)\n"
        f"callback = TorchstepProfCallback(save_path={str(tmp_path / 'traces')!r}, "
        f"on_demand={{'dir': {str(od)!r}, 'poll_s': 0.05}})\n"
        "Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback, Slow()]).train()\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=worker_env(),
                          cwd=tmp_path, timeout=WAIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert steps_by_rank(tmp_path / "traces") == {0: [8, 9]}, done.stderr
    assert [e["outcome"] for e in statuses(od)[0]["served"] if e["id"] == request["id"]] == ["profiled 8-9"]


def test_a_stale_or_stopped_status_is_left_out(tmp_path):
    """A rank that died without saying so (its status not written for minutes) would push the
    request far ahead (rate x age): it is left out; stopped ranks too."""
    now = time.time()
    fresh = {"rank": 0, "step": 40, "time": now, "rate": 10.0, "poll_s": 1.0, "served": [], "running": True}
    dead = dict(fresh, rank=1, step=30, time=now - 3600)
    stopped = dict(fresh, rank=2, step=9000, running=False)
    for data in (fresh, dead, stopped):
        (tmp_path / f"status-rank{data['rank']}.json").write_text(json.dumps(data))
    result = trigger(str(tmp_path), "--next", "2", "--align", "10")
    request = request_of(result, tmp_path)
    # rank 0: 40 + ceil(10 steps/s x (age ~0 + 2 polls of 1 s)) = 60 at least: the next multiple of 10
    assert request["steps"][0] in (70, 80) and request["steps"] == [request["steps"][0], request["steps"][0] + 1]
    assert f"ignored {tmp_path / 'status-rank1.json'}: not written for 3600 s" in result.stderr
    shown = trigger(str(tmp_path), "--status").stdout
    assert [line.split()[:2] + line.split()[4:5] for line in shown.splitlines()[2:5]] == [
        ["0", "40", "running"], ["1", "30", "stale"], ["2", "9000", "stopped"]]
    assert f"latest request: {request['id']}" in shown and "not read yet by rank(s) 0\n" in shown
    again = trigger(str(tmp_path), "--at", "200")
    assert again.returncode == 0
    assert f"replacing request {request['id']}, which rank(s) 0 had not read yet" in again.stderr


def test_no_step_rate_yet_writes_nothing(tmp_path):
    """The rule needs a step rate: a job whose ranks report none yet (their first polls) is
    waited for a few polls, then the command says so and writes nothing."""
    status = {"rank": 0, "step": 3, "time": time.time(), "rate": None, "poll_s": 0.1, "served": [], "running": True}
    (tmp_path / "status-rank0.json").write_text(json.dumps(status))
    result = trigger(str(tmp_path), "--next", "2")
    assert result.returncode == 1
    assert "no rank has reported its step rate yet" in result.stderr and "--at STEP" in result.stderr
    assert not (tmp_path / "request.json").exists()
