"""The timeline of a real asynchronous RL loop on Ray: examples/ray_roles.py --timeline (two
rollout replicas, the second 0.5 s slower; a reference actor; a 2-rank gloo trainer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchstep_prof[ray])")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_roles.py"
SLOW_S = 0.5
TOLERANCE_S = 0.15  # Ray's call latency on a loaded 2-core machine, on top of the clock bound


@pytest.fixture(scope="module")
def spans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ray_timeline") / "spans"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--timeline", str(folder), "--steps", "4", "--slow-s", str(SLOW_S)],
        capture_output=True, text=True, timeout=500, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "step 3: " in proc.stdout and "rollout rank 1 finished rollout/generate" in proc.stdout
    return folder


def _ledger(folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "timeline", str(folder), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def ledger(spans: Path) -> dict:
    return _ledger(spans)


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


def _moved(folder: Path, role: str, rank: int, host: str, shift_s: float, keep_ray: bool = True) -> None:
    """As if the process of ``role`` and ``rank`` ran on ``host``, whose clock is ``shift_s`` ahead
    (its Ray calls' sides dropped too, unless ``keep_ray``)."""
    headers = {p: json.loads(p.read_text().splitlines()[0]) for p in folder.iterdir()}
    path = next(p for p, h in headers.items() if (h["process_role"], h["rank"]) == (role, rank))
    lines = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "process":
            record["host"] = host
        if not keep_ray:
            record.pop("ray", None)
        for key in ("spans", "steps", "anchors", "ray"):
            for item in record.get(key, ()):
                item[-2] += shift_s
                item[-1] += shift_s
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def test_ray_calls_align_actors_of_other_hosts_within_their_bound(spans: Path, ledger: dict, tmp_path: Path) -> None:
    # The reference and a rollout replica share no process group with anyone: only the
    # trainer's anchored Ray calls link them (their host names made different, clocks moved).
    moved = tmp_path / "spans"
    shutil.copytree(spans, moved)
    _moved(moved, "ref", 0, "node-b", 2.0)
    _moved(moved, "rollout", 1, "node-c", -1.5)
    after = _ledger(moved)
    procs = {p["name"].split("@")[0]: p for p in after["processes"]}  # names show their hosts now
    trainer = procs["trainer rank 1"]
    for name, shift in (("ref", 2.0), ("rollout rank 1", -1.5)):
        offset = procs[name]["offset_s"] - trainer["offset_s"]
        bound = procs[name]["bound_s"] + trainer["bound_s"]
        assert abs(offset - shift) <= bound < 0.05, (name, offset, bound)
    assert not any("no clock anchor links" in p for p in after["problems"])
    bound = max(p["bound_s"] for p in after["processes"])
    for a, b in zip(ledger["steps"], after["steps"], strict=True):  # the same ledger, within the bounds
        assert b["seconds"] == pytest.approx(a["seconds"], abs=4 * bound + 1e-3)
        idle = {p["process"].split("@")[0]: p["idle_s"] for p in b["processes"]}
        assert idle == pytest.approx({p["process"]: p["idle_s"] for p in a["processes"]}, abs=4 * bound + 1e-3)
        tails = sorted((t["region"], t["process"].split("@")[0]) for t in b["long_tails"])
        assert tails == sorted((t["region"], t["process"]) for t in a["long_tails"])  # ~0.5 s each: order may swap


def test_without_its_ray_calls_an_actor_of_another_host_is_not_aligned(spans: Path, tmp_path: Path) -> None:
    moved = tmp_path / "spans"
    shutil.copytree(spans, moved)
    _moved(moved, "ref", 0, "node-b", 2.0, keep_ray=False)
    after = _ledger(moved)
    procs = {p["name"].split("@")[0]: p for p in after["processes"]}
    assert procs["ref"]["bound_s"] is None
    assert any("no clock anchor links ref@node-b" in p for p in after["clock_notes"])
