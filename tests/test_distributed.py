"""Real multi-process jobs: torch.distributed gloo groups of 2 (torchrun) and 4 (two simulated
nodes), which ranks write traces, when and where the finish hook runs, the DDP example.

Each job is launched once per module and several tests read what it left: the worker scripts
in ``tests/workers/`` say what each phase does. Nothing here is timed; the workers' own
collectives keep the ranks in step where an assertion depends on order.
Select or skip the module with ``-m distributed`` / ``-m "not distributed"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import torchstep_prof as tsp
from dist_helpers import REPO, WORKERS, Launch, read_json, run_ranks, run_torchrun
from trace_helpers import check_trace_file, everything_under, owner_range_name, trace_files

pytestmark = pytest.mark.distributed

EXPORTED = ("TSP_TEST_EXPORTED", "exported by the test: 'quoted' $NOT_EXPANDED")


@attrs.frozen
class Job:
    """A finished job: its output folder and how its processes ended."""

    out: Path
    launch: Launch

    def result(self, rank: int) -> dict:
        """What the worker of ``rank`` reported (see ``workers/_common.write_result``)."""
        self.launch.check()
        return read_json(self.out / f"result_rank{rank}.json")

    def traces(self, phase: str) -> list[tuple[Path, tsp.TraceName]]:
        """The phase's trace files, each checked against docs/trace-files.md, with its parsed name."""
        self.launch.check()
        folder = self.out / phase
        leftovers = [p for p in everything_under(folder) if p not in trace_files(folder)]
        assert not leftovers, f"not a trace, or not flat in save_path: {leftovers}"
        found = []
        for path in trace_files(folder):
            trace = check_trace_file(path)
            if trace["torchstep_prof"]["discrete"]:
                assert owner_range_name(path, trace) is not None, f"{path.name}: no owner's range"
            found.append((path, tsp.parse_trace_name(path)))
        return found

    def hook_runs(self, phase: str) -> list[tuple[int, int]]:
        """``(rank, training pid)`` for each run of the phase's hook, in the order they ran."""
        self.launch.check()
        counter = self.out / phase / "counter"
        if not counter.exists():
            return []
        return [(int(rank), int(pid)) for rank, pid in (line.split() for line in counter.read_text().splitlines())]

    def hook_dump(self, phase: str, rank: int) -> dict:
        """The environment and ``save_path`` listing the phase's hook saw on ``rank``."""
        return read_json(self.out / phase / f"hook_rank{rank}.json")


def _fields(names: list[tuple[Path, tsp.TraceName]]) -> set[tuple[str, str, int, int]]:
    return {(n.role, n.stage, n.step, n.rank) for _, n in names}


@pytest.fixture(scope="module")
def selection_job(tmp_path_factory) -> Job:
    """``workers/selection_worker.py`` under torchrun, 2 ranks."""
    out = tmp_path_factory.mktemp("selection")
    return Job(out, run_torchrun(WORKERS / "selection_worker.py", 2, [str(out)], log_dir=out))


@pytest.fixture(scope="module")
def hook_job(tmp_path_factory) -> Job:
    """``workers/hook_worker.py`` under torchrun, 2 ranks, with a variable of the test exported."""
    out = tmp_path_factory.mktemp("hooks")
    launch = run_torchrun(WORKERS / "hook_worker.py", 2, [str(out)], log_dir=out, env=dict([EXPORTED]))
    return Job(out, launch)


@pytest.fixture(scope="module")
def node_job(tmp_path_factory) -> Job:
    """``workers/node_worker.py``: 4 processes, as torchrun would start them on two hosts."""
    out = tmp_path_factory.mktemp("nodes")

    def two_nodes(rank: int) -> dict[str, str]:
        return {"LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": str(rank // 2)}

    launch = run_ranks(WORKERS / "node_worker.py", 4, [str(out)], log_dir=out, env_for_rank=two_nodes)
    return Job(out, launch)


# --- which ranks profile -------------------------------------------------------------------------


def test_steps_1_and_3_on_rank_0_write_two_files_on_rank_0_only(selection_job):
    traces = selection_job.traces("rank0")
    assert _fields(traces) == {("actor", "forward", 1, 0), ("actor", "forward", 3, 0)}
    pid = selection_job.result(0)["pid"]
    for path, name in traces:
        assert (name.world_size, name.pid) == (2, pid), path.name
        info = check_trace_file(path)["distributedInfo"]
        assert (info["rank"], info["world_size"]) == (0, 2)
    assert not [p for p in selection_job.result(1)["traces"] if Path(p).parent.name == "rank0"]


def test_all_ranks_writes_one_file_per_rank_and_step(selection_job):
    traces = selection_job.traces("all")
    assert _fields(traces) == {("actor", "forward", step, rank) for step in (1, 3) for rank in (0, 1)}
    pids = {rank: selection_job.result(rank)["pid"] for rank in (0, 1)}
    assert pids[0] != pids[1]
    for path, name in traces:
        assert (name.world_size, name.pid) == (2, pids[name.rank]), path.name
        assert check_trace_file(path)["distributedInfo"]["world_size"] == 2


def test_a_rank_that_does_not_exist_selects_nothing(selection_job):
    assert selection_job.launch.returncodes == (0,)
    assert everything_under(selection_job.out / "rank7") == []
    for rank in (0, 1):
        assert selection_job.result(rank)["trace_errors"] == []


def test_ranks_0_and_2_of_a_group_of_4(node_job):
    traces = node_job.traces("ranks_0_2")
    assert _fields(traces) == {("learner", "update", step, rank) for step in (1, 3) for rank in (0, 2)}
    assert {name.world_size for _, name in traces} == {4}


def test_the_toolkit_issues_no_collective(selection_job):
    # Rank 1 slept 3 s inside its profiled region (then exported, ran its hook) while rank 0 was
    # already waiting in its next all-reduce, under a 20 s gloo timeout: the job still ended well.
    assert selection_job.launch.ok, selection_job.launch.output
    assert _fields(selection_job.traces("no_barrier/save")) == {("actor", "forward", 1, 1)}
    assert selection_job.hook_runs("no_barrier") == [(1, selection_job.result(1)["pid"])]
    # And no torch.distributed collective was called by anything but the workers themselves.
    for rank in (0, 1):
        assert selection_job.result(rank)["toolkit_collectives"] == []


# --- the finish hook -----------------------------------------------------------------------------


def test_hook_runs_once_per_rank_after_the_last_selected_step(hook_job):
    pids = {rank: hook_job.result(rank)["pid"] for rank in (0, 1)}
    assert sorted(hook_job.hook_runs("counter")) == [(0, pids[0]), (1, pids[1])]
    traces = hook_job.traces("counter/save")
    regions = [("actor", "compute-log-prob"), ("ref-model", "forward")]
    expected = {(role, stage, step) for role, stage in regions for step in (1, 2)}
    assert {(n.role, n.stage, n.step) for _, n in traces} == expected
    for rank in (0, 1):
        result = hook_job.result(rank)
        assert result["counter_exists_after_step1"] is False
        assert result["own_line_after_step2"] is True
        own = {path.name for path, name in traces if name.rank == rank}
        assert len(own) == 4
        assert own <= set(hook_job.hook_dump("counter", rank)["listing"])


def test_hook_environment(hook_job):
    save_path = (hook_job.out / "counter" / "save").resolve()
    for rank in (0, 1):
        dump = hook_job.hook_dump("counter", rank)
        env, pid = dump["env"], hook_job.result(rank)["pid"]
        assert Path(env["TORCHSTEP_PROF_SAVE_PATH"]).resolve() == save_path
        assert env["TORCHSTEP_PROF_RANK"] == str(rank)
        assert env["TORCHSTEP_PROF_WORLD_SIZE"] == "2"
        assert env["TORCHSTEP_PROF_LOCAL_RANK"] == str(rank)  # one node: torchrun's LOCAL_RANK
        assert env["TORCHSTEP_PROF_PID"] == str(pid) != str(dump["hook_pid"])
        assert env["TORCHSTEP_PROF_ROLES"] == "actor,ref-model"
        traces = {Path(p).resolve() for p in env["TORCHSTEP_PROF_TRACES"].split(os.pathsep)}
        assert traces == {p.resolve() for p, n in hook_job.traces("counter/save") if n.rank == rank}
        assert env[EXPORTED[0]] == EXPORTED[1]


@pytest.mark.parametrize(
    ("phase", "runners"),
    [
        pytest.param("profiled_1", {1}, id="profiled [1], no hook ranks: rank 1"),
        pytest.param("hook_ranks_1", {1}, id="profiled [0], hook ranks [1]: rank 1"),
        pytest.param("all_ranks_wins", {0, 1}, id="hook all_ranks wins over ranks [0]"),
    ],
)
def test_hook_rank_rules(hook_job, phase, runners):
    runs = hook_job.hook_runs(phase)
    assert sorted(rank for rank, _ in runs) == sorted(runners)
    for rank, pid in runs:
        assert pid == hook_job.result(rank)["pid"]


def test_hook_of_a_schedule_beyond_the_loop_runs_once_at_block_exit(hook_job):
    # Steps {2, 10} of a 3-step loop: step 10 never comes, so the hook waits for the block's exit.
    assert sorted(rank for rank, _ in hook_job.hook_runs("late_steps")) == [0, 1]
    for rank in (0, 1):
        result = hook_job.result(rank)
        assert result["own_line_after_loop"] is False
        assert result["own_line_after_block"] is True
    assert {n.step for _, n in hook_job.traces("late_steps/save")} == {2}


def test_per_node_hook_runs_once_per_node_after_its_slowest_rank(node_job):
    # Ranks 0, 1 form node 0 and ranks 2, 3 node 1; local rank 1 of each node sleeps 1.5 s in
    # its step-2 region, well after its node's uploader (local rank 0) has finished.
    assert sorted(rank for rank, _ in node_job.hook_runs("per_node")) == [0, 2]
    for node, uploader, slow in [(0, 0, 1), (1, 2, 3)]:
        dump = node_job.hook_dump("per_node", uploader)
        assert dump["env"]["TORCHSTEP_PROF_LOCAL_RANK"] == "0"
        traces = node_job.traces(f"per_node/save_node{node}")
        expected = {("learner", "update", step, rank) for step in (1, 2) for rank in (uploader, slow)}
        assert _fields(traces) == expected
        # Every trace of the node, its slowest rank's last one included, was there for the upload.
        assert {path.name for path, _ in traces} <= set(dump["listing"])


# --- the DDP example -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["discrete", "fused"])
def test_ddp_example_under_torchrun(tmp_path, mode):
    save = tmp_path / "profile_ddp"
    args = ["--save-path", str(save)] + (["--fused"] if mode == "fused" else [])
    launch = run_torchrun(REPO / "examples" / "ddp_torchrun.py", 2, args, log_dir=tmp_path).check()
    stages = ["forward", "backward", "optimizer-step"] if mode == "discrete" else ["train"]
    traces = Job(tmp_path, launch).traces("profile_ddp")
    expected = {("trainer", stage, step, rank) for stage in stages for step in (2, 3) for rank in (0, 1)}
    assert _fields(traces) == expected
    for rank in (0, 1):
        assert f"[rank {rank}] traces in {save}" in launch.output
        assert f"rank {rank}: 5 steps done" in launch.output



# --- reading a 4-rank run's folder ----------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchstep_prof", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_summarize_flags_the_rank_that_slept_in_its_region(node_job):
    folder = node_job.out / "straggler"
    done = _cli("summarize", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["unreadable"] == []
    groups = {(g["role"], g["stage"], g["step"]): g for g in summary["groups"]}
    assert set(groups) == {("actor", "compute-log-prob", 1), ("actor", "compute-log-prob", 2)}
    for group in groups.values():
        assert sorted(r["rank"] for r in group["ranks"]) == [0, 1, 2, 3]
        assert group["straggler"] == 2
        slow = next(r for r in group["ranks"] if r["rank"] == 2)
        assert slow["wall_ms"] >= 300


def test_merge_puts_every_rank_and_step_on_one_timeline(node_job, tmp_path):
    merged = tmp_path / "merged.json"
    done = _cli("merge", str(node_job.out / "straggler"), "-o", str(merged))
    assert done.returncode == 0, done.stderr
    trace = json.loads(merged.read_text())
    names = {
        e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    assert names == {f"actor/compute-log-prob rank {r} step {n}" for r in range(4) for n in (1, 2)}


def test_hta_links_one_trace_per_rank(node_job, tmp_path):
    out = tmp_path / "hta"
    done = _cli("hta", str(node_job.out / "straggler"), "--role", "actor", "--stage", "compute-log-prob",
                "--step", "2", "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = sorted(out.iterdir())
    assert [tsp.parse_trace_name(f).rank for f in files] == [0, 1, 2, 3]
    for f in files:
        assert json.loads(f.read_text())["distributedInfo"]["rank"] == tsp.parse_trace_name(f).rank
