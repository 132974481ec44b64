"""The timeline of a real asynchronous RL loop on Ray: examples/ray_roles.py --timeline (two
rollout replicas, the second 0.5 s slower; a reference actor; a 2-rank gloo trainer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchstep_prof[ray])")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_roles.py"
SLOW_S = 0.5
TOLERANCE_S = 0.15  # Ray's call latency on a loaded 2-core machine, on top of the clock bound


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> dict:
    spans = tmp_path_factory.mktemp("ray_timeline") / "spans"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--timeline", str(spans), "--steps", "4", "--slow-s", str(SLOW_S)],
        capture_output=True, text=True, timeout=500, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "step 3: " in proc.stdout and "rollout rank 1 finished rollout/generate" in proc.stdout
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "timeline", str(spans), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_every_process_is_in_the_ledger_on_one_clock(ledger: dict) -> None:
    names = sorted(p["name"] for p in ledger["processes"])
    assert names == ["ref", "rollout rank 0", "rollout rank 1", "trainer rank 0", "trainer rank 1"]
    assert all(p["bound_s"] is not None and p["bound_s"] <= 0.01 for p in ledger["processes"])
    assert [s["number"] for s in ledger["steps"]] == [1, 2, 3, 4]


def test_the_slow_replica_is_the_long_tail_and_the_trainer_waits_its_extra_time(ledger: dict) -> None:
    for step in ledger["steps"][1:]:  # step 1 holds the actors' first calls
        tail = next(t for t in step["long_tails"] if t["region"] == "rollout/generate")
        assert tail["process"] == "rollout rank 1" and not tail["within_clock_error"]
        assert tail["past_median_s"] == pytest.approx(SLOW_S, abs=TOLERANCE_S)
        assert "rollout rank 1 finished rollout/generate" in step["verdict"]
        rows = {p["process"]: p for p in step["processes"]}
        bound = max(p["bound_s"] for p in ledger["processes"])
        # Trainer rank 0 finished its update first, then waited (all-reduce, barrier) for rank 1,
        # whose replica took SLOW_S longer: that wait is the replica's extra time.
        extra = rows["rollout rank 1"]["busy_s"] - rows["rollout rank 0"]["busy_s"]
        waited = rows["trainer rank 0"]["gaps"][-1]
        assert waited["at_step_end"]
        assert waited["seconds"] == pytest.approx(extra, abs=TOLERANCE_S + 2 * bound)
        # Rank 1 sat idle at the step's start while its replica generated, then the reference ran.
        first = rows["trainer rank 1"]["gaps"][0]
        assert first["start_s"] == pytest.approx(0.0, abs=0.05)
        assert first["seconds"] >= rows["rollout rank 1"]["busy_s"]


def test_the_critical_path_runs_rollout_then_ref_then_the_update(ledger: dict) -> None:
    for step in ledger["steps"][1:]:
        path = [(e["region"], e["process"]) for e in step["critical_path"]]
        assert path[-3:] == [
            ("rollout/generate", "rollout rank 1"),
            ("ref/compute_log_prob", "ref"),
            ("actor/update", "trainer rank 1"),
        ], path
