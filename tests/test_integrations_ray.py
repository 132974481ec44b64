"""Roles as Ray actors: examples/ray_roles.py on a local cluster, run once (Ray starts slowly)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchstep_prof[ray])")

from tests.trace_helpers import check_trace_file, trace_files
from torchstep_prof import parse_trace_name

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_roles.py"
RANKED = {"actor": [0, 1], "critic": [2], "rollout": [3]}  # the example's numbering, world 4
STAGES = {"actor": ["forward", "update"], "critic": ["forward", "update"], "rollout": ["generate"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("ray")
    # Each hook run lists the folder into a file of its own: one file means one run.
    hook = f'ls "$TORCHSTEP_PROF_SAVE_PATH" > "{root}/hook-rank$TORCHSTEP_PROF_RANK-pid$$.txt"'
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--save-path", str(root / "prof"), "--on-finish", hook, "--unranked"],
        capture_output=True,
        text=True,
        timeout=500,
        env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc, root


def test_actors_write_traces_named_by_role_and_rank(run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, root = run
    files = trace_files(root / "prof")
    ranked = [p for p in files if parse_trace_name(p).world_size == 4]
    found = sorted((n.role, n.stage, n.step, n.rank) for n in map(parse_trace_name, ranked))
    expected = sorted(
        (role, stage, step, rank)
        for role, ranks in RANKED.items()
        for rank in ranks
        for stage in STAGES[role]
        for step in (2, 3)
    )
    assert found == expected
    for path in ranked:
        check_trace_file(path)  # metadata, distributedInfo and one ProfilerStep#<n>
    # one pid per worker: every rank is its own actor process
    assert len({parse_trace_name(p).pid for p in ranked}) == 4


def test_per_node_hook_runs_once_after_every_actor(run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, root = run
    runs = sorted(root.glob("hook-*.txt"))
    assert [p.name.split("-pid")[0] for p in runs] == ["hook-rank0"], runs
    listed = set(runs[0].read_text().split())
    ranked = {p.name for p in trace_files(root / "prof") if parse_trace_name(p).world_size == 4}
    assert len(ranked) == 14 and ranked <= listed, sorted(ranked - listed)
    # The hook ran in a worker, whose output stays in Ray's log files: the driver prints what it did.
    proc, _ = run
    assert proc.stdout.count("finish hook ran on rank 0:") == 1, proc.stdout[-3000:]
    assert "finish hook ran on rank" not in proc.stdout.replace("finish hook ran on rank 0:", "")


def test_actor_without_rank_variables_warns_once_naming_the_fix(run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, root = run
    assert proc.stderr.count("has no RANK variable") == 1, proc.stderr[-5000:]
    warning = next(line for line in proc.stderr.splitlines() if "has no RANK variable" in line)
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        assert variable in warning
    # attributed to the example's code that profiles (Worker.__init__), not to torchstep_prof's
    assert re.search(rf"{re.escape(str(EXAMPLE))}:\d+: TorchstepProfWarning: ", warning), warning
    # and it was rank 0 of 1, as the warning says
    unranked = [p for p in trace_files(root / "prof") if parse_trace_name(p).world_size == 1]
    assert sorted((n.role, n.rank, n.step) for n in map(parse_trace_name, unranked)) == [
        ("critic", 0, 2), ("critic", 0, 2), ("critic", 0, 3), ("critic", 0, 3)
    ]


def test_no_warning_outside_ray_actors() -> None:
    # ray imported, and even initialized in this driver: not an actor, so no word about ranks
    code = (
        "import ray, warnings\n"
        "warnings.simplefilter('error')\n"
        "from torchstep_prof.topology import current_topology\n"
        "assert current_topology().rank == 0\n"
        "print('quiet')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "quiet", out.stderr
    assert "RANK variable" not in out.stderr
