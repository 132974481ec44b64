"""Live status and the stall detector (docs/stall.md): a real 2-rank torchrun job one rank of
which hangs, real ``torchstep-prof status`` processes, jobs that are slow but progress, the
config's errors and hostile status folders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import pytest

import torchstep_prof as tsp
from dist_helpers import WORKERS, _kill, worker_env
from torchstep_prof import ConfigError

WAIT_S = 240.0  # generous: a loaded 2-core machine starting two ranks that import torch


def status_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchstep_prof", "status", *args], capture_output=True, text=True,
                          env=worker_env(), timeout=120)  # fmt: skip


def wait_for(what: str, ready: Callable[[], bool], job: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        if job.poll() is not None:
            raise AssertionError(f"the job ended (exit {job.returncode}) before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            _kill([job])
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()}")
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie not reaped yet has finished too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_rank_is_named_with_its_region_step_and_line_and_the_other_waits_in_all_reduce(tmp_path):
    folder = tmp_path / "status"
    log = tmp_path / "torchrun.log"
    after_s, poll_s, hang_step = 2.0, 0.25, 6
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(WORKERS / "stall_worker.py"), str(folder), str(after_s), str(poll_s), str(hang_step)]  # fmt: skip
    with open(log, "wb") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=worker_env(), cwd=tmp_path,
                               start_new_session=True)  # fmt: skip
    try:
        stall_files = [folder / "stall-rank0.txt", folder / "stall-rank1.txt"]
        commands = [folder / "cmd-rank0.txt", folder / "cmd-rank1.txt"]
        wait_for("both ranks' stall files and commands", lambda: all(p.exists() for p in stall_files + commands),
                 job, log)  # fmt: skip

        shown = status_cmd(str(folder), "--json")
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        ranks = {r["rank"]: r for r in data["ranks"]}
        hung, waiting = ranks[1], ranks[0]
        assert hung["step"] == hang_step and hung["collective"] is None
        assert [(r["role"], r["stage"]) for r in hung["regions"]] == [("actor", "update")]
        assert hung["where"].endswith("in update_policy") and "stall_worker.py:" in hung["where"]
        assert hung["state"] == waiting["state"] == "stalled"
        assert waiting["step"] == hang_step and waiting["collective"] == "all_reduce"
        assert waiting["regions"] == []  # actor/update ended before its all_reduce
        # Every step all-reduces once after init: the hung step's is the job's collective #hang_step.
        assert waiting["ordinal"] == hang_step
        first = data["verdict"][0]
        assert first.startswith("rank 1 has been in actor/update for ") and f"at step {hang_step}" in first
        assert "in update_policy" in first
        assert data["verdict"][1].startswith(f"rank 0 waits in all_reduce #{hang_step} (")
        assert data["verdict"][1].endswith(" for it")

        text = status_cmd(str(folder), "--stacks")
        assert text.returncode == 0, text.stderr
        top = text.stdout.splitlines()[0]
        assert top.startswith("rank 1 has been in actor/update for ") and f" at step {hang_step} (" in top
        assert top.endswith("in update_policy)")
        assert "in update_policy" in text.stdout and "time.sleep(3600)" in text.stdout
        assert "in all_reduce" in text.stdout  # rank 0's stack, inside torch's all_reduce

        hung_report, waiting_report = stall_files[1].read_text(), stall_files[0].read_text()
        for name in ("update_policy", "train_step", "actor/update"):
            assert name in hung_report
        assert "in collective: all_reduce" in waiting_report and "train_step" in waiting_report
        # Found stalled within after_s plus one poll (and a little slack for a loaded machine).
        quiet = float(hung_report.split("no step progress for ")[1].split(" s")[0])
        assert after_s <= quiet <= after_s + poll_s + 1.0
        for rank, path in enumerate(commands):
            assert path.read_text() == f"{stall_files[rank]} {hang_step}"
        pids = [r["pid"] for r in data["ranks"]]
    finally:
        _kill([job])
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "a rank outlived the job"
    leftovers = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(tmp_path) in (proc / "cmdline").read_text(errors="replace"):
                leftovers.append(proc.name)
        except OSError:
            continue
    assert not leftovers, f"processes of the job still running: {leftovers}"


def test_a_slow_job_that_progresses_raises_nothing_and_a_long_step_does(tmp_path):
    folder = tmp_path / "status"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tsp.stall(folder, after_s=1.0, poll_s=0.05):
            for n in range(1, 9):  # 2.4 s in all, each step well under after_s
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    time.sleep(0.3)
    assert not (folder / "stall-rank0.txt").exists()
    assert not [w for w in caught if "progress" in str(w.message)]
    final = json.loads((folder / "live-rank0.json").read_text())
    assert final["running"] is False and final["step"] == 8 and final["stalled_s"] is None

    adaptive = tmp_path / "adaptive"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tsp.stall(adaptive, factor=3, floor_s=0.5, poll_s=0.05):
            for n in range(1, 8):  # steps of 0.1 s: the threshold is the floor, 0.5 s
                with tsp.step(n), tsp.profile_region("critic", "update"):
                    time.sleep(0.1)
                    assert not (adaptive / "stall-rank0.txt").exists()
            with tsp.step(8), tsp.profile_region("critic", "slow_update"):
                time.sleep(1.5)
    report = (adaptive / "stall-rank0.txt").read_text()
    assert report.startswith("rank 0: no step progress for ") and "at step 8" in report
    assert "critic/slow_update" in report and "test_a_slow_job_that_progresses" in report
    assert [w for w in caught if "has made no step progress" in str(w.message)]


def test_bad_stall_settings_are_config_errors():
    with pytest.raises(ConfigError) as error:
        tsp.stall("/tmp/x", after_s=0, factor=0.5, cmd="", poll_s=-1)
    assert str(error.value).splitlines()[1:] == [
        "  stall.after_s: must be > 0 (got 0)",
        "  stall.factor: must be a number >= 1, times the slowest recent step (got 0.5)",
        "  stall.poll_s: must be > 0 (got -1)",
        "  stall.cmd: must be a non-empty command (got '')",
    ]
    with pytest.raises(ConfigError, match=r"stall\.aftr_s: unknown key \(did you mean 'after_s'\?\)"):
        tsp.from_dict({"stall": {"aftr_s": 5}})
    with pytest.raises(ConfigError, match=r"stall\.timeout_s: must be a number of seconds > 0 \(got None"):
        tsp.configure(stall={"timeout_s": None})
    with pytest.raises(ConfigError, match=r"stall\.after_s: must be a number of seconds \(got 'ten'\)"):
        tsp.apply_overrides(tsp.ProfilerConfig(), ["stall.after_s='ten'"])
    assert tsp.apply_overrides(tsp.ProfilerConfig(), ["stall.after_s=600"]).stall == tsp.StallConfig(after_s=600)


def test_each_process_role_keeps_a_status_of_its_own(tmp_path):
    folder = tmp_path / "status"
    for role in ("rollout", "actor"):  # two Ray actors of rank 0, one after the other here
        with tsp.configure(process_role=role, stall={"dir": str(folder), "after_s": 600, "poll_s": 0.05}):
            with tsp.step(3), tsp.profile_region(role, "generate"):
                time.sleep(0.2)
    assert sorted(p.name for p in folder.iterdir()) == ["live-rank0-actor.json", "live-rank0-rollout.json"]
    shown = status_cmd(str(folder), "--json")
    assert [(r["rank"], r["role"], r["state"], r["step"]) for r in json.loads(shown.stdout)["ranks"]] == [
        (0, "actor", "stopped", 3),
        (0, "rollout", "stopped", 3),
    ]
    assert (
        json.loads(shown.stdout)["verdict"][0]
        == "rank 0 (actor) stopped reporting at step 3 (its scope ended, or the process exited)"
    )


def test_an_on_demand_folder_holds_the_live_status_written_by_its_poll_thread(tmp_path):
    import threading

    folder = tmp_path / "od"
    with tsp.on_demand(folder, poll_s=0.05):
        with tsp.step(12), tsp.profile_region("rollout", "generate"):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (folder / "live-rank0.json").exists():
                time.sleep(0.05)
            names = sorted(t.name for t in threading.enumerate() if t.name.startswith("torchstep_prof"))
            time.sleep(0.2)
            live = json.loads((folder / "live-rank0.json").read_text())
    assert "torchstep_prof-live" not in names and "torchstep_prof-on-demand" in names  # no second thread
    assert live["step"] == 12 and [(r["role"], r["stage"]) for r in live["regions"]] == [("rollout", "generate")]
    assert live["threshold_s"] is None  # no stall rule without a stall section
    assert json.loads((folder / "live-rank0.json").read_text())["running"] is False
    assert json.loads((folder / "status-rank0.json").read_text())["step"] == 12  # the trigger's status too


def live_status(folder: Path, name: str = "live-rank0.json") -> dict:
    try:
        return json.loads((folder / name).read_text())
    except FileNotFoundError:  # the status thread's first write is still to come
        return {}


def test_profiled_regions_are_traced_as_before_and_shown_while_open(tmp_path):
    folder, traces = tmp_path / "status", tmp_path / "traces"
    seen = {}
    with tsp.configure(save_path=str(traces), summary=False), tsp.schedule(steps=[2]):
        with tsp.stall(folder, after_s=600, poll_s=0.05):
            for n in (1, 2, 3):
                with tsp.step(n), tsp.profile_region("critic", "update"):
                    with tsp.profile_region("critic", "loss"):
                        deadline = time.monotonic() + 30
                        while time.monotonic() < deadline:
                            live = live_status(folder)
                            if live.get("step") == n and len(live["regions"]) == 2:
                                break
                            time.sleep(0.05)
                        seen[n] = [(r["role"], r["stage"]) for r in live["regions"]]
    tsp.flush()
    assert seen == {n: [("critic", "update"), ("critic", "loss")] for n in (1, 2, 3)}
    names = [tsp.parse_trace_name(p) for p in traces.glob("*.json")]
    assert [(t.role, t.stage, t.step) for t in names] == [("critic", "update", 2)]
    events = json.loads(next(traces.glob("*.json")).read_text())["traceEvents"]
    assert any(e.get("name") == "critic/loss" for e in events)  # the nested region, a range in it


def write_status(folder: Path, rank: int, **fields) -> None:
    data = {"rank": rank, "world_size": 3, "pid": 1, "host": "h", "time": time.time(), "poll_s": 1.0,
            "running": True, "step": 7, "regions": [], "collective": None, "stack": []}  # fmt: skip
    data.update(fields)
    (folder / f"live-rank{rank}.json").write_text(json.dumps(data))


def test_status_names_a_missing_folder_a_stale_rank_and_a_missing_one(tmp_path):
    missing = status_cmd(str(tmp_path / "nope"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr and missing.stdout == ""
    empty = status_cmd(str(tmp_path))
    assert empty.returncode == 1 and "no rank keeps its live status here" in empty.stderr

    write_status(tmp_path, 0, time=time.time() - 120)
    write_status(tmp_path, 1, collective="all_reduce", ordinal=9, collective_since=time.time() - 30)
    shown = status_cmd(str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    head, tail = lines[0].split(", the longest for ")
    assert head == "every reporting rank is in all_reduce #9 (rank 1)" and 30 <= float(tail.split(" s:")[0]) < 90
    assert tail.endswith(" s: it is slow, or waits for a rank that reports no status here")
    age = lines[1].removeprefix("rank 0's status is stale (last written ").split(" s ago)")
    assert 120 <= float(age[0]) < 180 and age[1] == ": its process may have died, or be stuck holding the GIL"
    assert lines[2] == "no status here for rank 2 of 3"
    assert re.search(r"^rank 0  stale \(1[2-7]\d s ago\)  7 ", shown.stdout, re.M), shown.stdout


def test_ranks_in_different_collectives_are_named_as_a_mismatch(tmp_path):
    since = time.time() - 40
    write_status(tmp_path, 0, collective="all_reduce", ordinal=5, collective_since=since, world_size=2)
    write_status(tmp_path, 1, collective="broadcast", ordinal=5, collective_since=since, world_size=2)
    shown = status_cmd(str(tmp_path), "--json")
    verdict = json.loads(shown.stdout)["verdict"]
    assert len(verdict) == 1 and verdict[0].startswith(
        "the ranks are in different collectives (called in a different order?): rank 0 waits in all_reduce #5 (4"
    )
    assert "; rank 1 waits in broadcast #5 (4" in verdict[0]
    huge = tmp_path / "huge"
    huge.mkdir()
    write_status(huge, 0, world_size=2**62)  # a world size written by someone else: not walked
    shown = status_cmd(str(huge), "--json")
    assert json.loads(shown.stdout)["verdict"] == ["no rank waits in a collective; 1 running (step 7)"]


def test_hostile_status_folders_hang_neither_the_job_nor_the_command(tmp_path):
    folder = tmp_path / "status"
    folder.mkdir()
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    os.mkfifo(folder / "live-rank0.json")  # a FIFO at the job's own status name
    os.symlink(outside, folder / "stall-rank0.txt")  # a link at its stall file's name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tsp.stall(folder, after_s=0.2, poll_s=0.05):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                time.sleep(0.6)
    assert outside.read_text() == "keep"  # the link was replaced, never written through
    assert (folder / "live-rank0.json").is_file() and not (folder / "stall-rank0.txt").is_symlink()
    assert "no step progress" in (folder / "stall-rank0.txt").read_text()

    os.mkfifo(folder / "live-rank1.json")
    os.symlink(outside, folder / "live-rank2.json")
    (folder / "live-rank3.json").write_text("\x1b[2J" * 10)
    write_status(
        folder, 4, world_size=2**62, regions=[{"role": "actor\x1b[31m", "stage": "up\ndate", "since": time.time()}]
    )
    shown = status_cmd(str(folder))
    assert shown.returncode == 0
    assert "live-rank1.json: not a regular file (a FIFO)" in shown.stderr
    assert "live-rank2.json: a symbolic link" in shown.stderr
    assert "live-rank3.json" in shown.stderr and "\x1b" not in shown.stderr
    assert "actor\\x1b[31m/up\\ndate" in shown.stdout and "\x1b" not in shown.stdout


def test_run_stall_after_reports_a_script_stuck_between_optimizer_steps(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        "import time, torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def load_batch(n):\n"
        "    time.sleep(3.0 if n == 3 else 0.01)\n"
        "    return torch.randn(8, 4)\n"
        "for n in range(1, 6):\n"
        "    model(load_batch(n)).sum().backward()\n"
        "    opt.step()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "run", "--stall-after", "1", "--set", "stall.poll_s=0.1",
         "--save-path", str(tmp_path / "out"), str(script)],
        capture_output=True, text=True, env=worker_env(), cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "out" / "status" / "stall-rank0.txt").read_text()
    # Two optimizer steps ended: the script is in step 3 when load_batch(3) sleeps.
    assert report.startswith("rank 0: no step progress for 1.") and "at step 3" in report
    assert "in load_batch" in report and "time.sleep(3.0 if n == 3 else 0.01)" in report
    assert "has made no step progress" in done.stderr
    bad = subprocess.run([sys.executable, "-m", "torchstep_prof", "run", "--stall-after", "0", str(script)],
                         capture_output=True, text=True, env=worker_env(), cwd=tmp_path, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "stall.after_s: must be > 0 (got 0.0)" in bad.stderr


def test_the_lightning_callbacks_stall_argument_reports_a_stuck_training_step(tmp_path):
    pytest.importorskip(
        "lightning.pytorch", reason="lightning is not installed (pip install torchstep_prof[lightning])"
    )
    folder = tmp_path / "status"
    script = tmp_path / "fit.py"
    script.write_text(
        "import time, torch\nimport lightning.pytorch as pl\n"
        "from torchstep_prof.integrations.lightning import TorchstepProfCallback\n"
        "class Tiny(pl.LightningModule):\n"
        "    def __init__(self):\n        super().__init__()\n        self.layer = torch.nn.Linear(8, 1)\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        time.sleep(2.0 if batch_idx == 4 else 0.02)\n"
        "        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])\n"
        "    def configure_optimizers(self):\n        return torch.optim.SGD(self.parameters(), lr=0.01)\n"
        "data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))\n"
        f"callback = TorchstepProfCallback(save_path={str(tmp_path / 'traces')!r}, "
        f"stall={{'dir': {str(folder)!r}, 'after_s': 0.8, 'poll_s': 0.05}})\n"
        "trainer = pl.Trainer(max_steps=8, accelerator='cpu', devices=1, logger=False, enable_checkpointing=False,\n"
        "                     enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])\n"
        "trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=worker_env(),
                          cwd=tmp_path, timeout=WAIT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = (folder / "stall-rank0.txt").read_text()
    assert "at step 5" in report, report  # batch 4 makes the global step 5
    assert "trainer/training_step" in report and "in training_step" in report
    assert "time.sleep(2.0 if batch_idx == 4 else 0.02)" in report
    final = json.loads((folder / "live-rank0.json").read_text())
    assert final["running"] is False and final["step"] == 8


def test_ray_actors_of_two_roles_keep_their_own_status_and_the_slow_one_is_named(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install torchstep_prof[ray])")
    folder = tmp_path / "status"
    done = subprocess.run([sys.executable, str(WORKERS / "stall_ray_roles.py"), str(folder)], capture_output=True,
                          text=True, env=worker_env({"RAY_USAGE_STATS_ENABLED": "0"}), cwd=tmp_path, timeout=500)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    status = json.loads(done.stdout.split("STATUS ", 1)[1])
    ranks = {(r["rank"], r["role"]): r for r in status["ranks"]}
    assert set(ranks) == {(0, "actor"), (1, "rollout")}
    slow = ranks[1, "rollout"]
    assert slow["state"] == "stalled" and slow["step"] == 2 and slow["where"].endswith("in generate")
    assert [(r["role"], r["stage"]) for r in slow["regions"]] == [("rollout", "generate")]
    assert status["verdict"][0].startswith("rank 1 (rollout) is stalled: has been in rollout/generate for ")
    report = (folder / "stall-rank1-rollout.txt").read_text()
    assert report.startswith("rank 1 (rollout): no step progress for ") and "in generate" in report
    assert not (folder / "stall-rank0-actor.txt").exists()
    assert sorted(p.name for p in folder.glob("live-*.json")) == ["live-rank0-actor.json", "live-rank1-rollout.json"]
