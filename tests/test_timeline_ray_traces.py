"""A Ray job profiled with traces only (no span log): its traces carry the Ray calls of
``torchstep_prof.integrations.ray``, and ``timeline`` aligns the actor's clock from them.

tests/workers/ray_traced_worker.py runs a driver that calls a scorer actor each step (``submit``,
``get``, ``@anchored``); both trace steps 1-3. The scorer is then moved to a host whose clock is
0.5 s ahead (its traces' times +0.5 s, their host renamed), as tests/test_timeline_ray.py moves
span files.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchstep_prof[ray])")

WORKER = Path(__file__).resolve().parent / "workers" / "ray_traced_worker.py"
SHIFT_S = 0.5  # less than the traced steps last: a clock off by more than the run reads as another run


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ray_traces") / "out"
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(folder), "5"],
        capture_output=True, text=True, timeout=500, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return folder


def _timelines(folder: Path, role: str) -> dict[Path, dict]:
    found = {}
    for path in sorted(folder.glob(f"{role}_*.json")):
        found[path] = json.loads(path.read_text())
    assert len(found) == 3, sorted(folder.iterdir())
    return found


def _ledger(folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "timeline", str(folder), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ledger = json.loads(out.stdout)
    assert ledger["source"] == "traces"
    return ledger


def _moved(traces: Path, into: Path, *, keep_ray: bool) -> Path:
    """The job with the scorer on another host, 0.5 s ahead (its Ray items dropped unless kept)."""
    shutil.copytree(traces, into)
    for path, data in _timelines(into, "reward").items():
        data["baseTimeNanoseconds"] += int(SHIFT_S * 1e9)
        timeline = data["torchstep_prof"]["timeline"]
        timeline["host"] = "node-b"
        for key, start in (("spans", 2), ("steps", 1), ("anchors", 2), ("ray", 2)):  # where each shape's times are
            for item in timeline.get(key, ()):
                item[start] += SHIFT_S
                item[start + 1] += SHIFT_S
        if not keep_ray:
            timeline.pop("ray", None)
        path.write_text(json.dumps(data))
    return into


def test_traces_carry_both_sides_of_each_ray_call(traces: Path) -> None:
    sides: dict[str, set[str]] = {}
    for role, whats in (("actor_update", {"submitted", "returned"}), ("reward_score", {"ran"})):
        for data in _timelines(traces, role).values():
            for task, what, start, end in data["torchstep_prof"]["timeline"].get("ray", ()):
                assert what in whats and end >= start
                sides.setdefault(task, set()).add(what)
    paired = [task for task, seen in sides.items() if seen == {"submitted", "ran", "returned"}]
    assert len(paired) >= 2, sides  # each side carried by one trace of its process


def test_the_ray_calls_in_traces_align_an_actor_on_another_host(traces: Path, tmp_path: Path) -> None:
    ledger = _ledger(_moved(traces, tmp_path / "moved", keep_ray=True))
    by_name = {p["name"]: p for p in ledger["processes"]}
    assert set(by_name) == {f"trainer@{socket.gethostname()}", "reward@node-b"}
    reward = by_name.pop("reward@node-b")
    (trainer,) = by_name.values()
    offset = reward["offset_s"] - trainer["offset_s"]
    bound = reward["bound_s"] + trainer["bound_s"]
    assert bound < 0.1  # a Ray call's two latencies on a loaded machine
    assert abs(offset - SHIFT_S) <= bound, (offset, bound)
    assert not ledger["clock_notes"]

    # Without the Ray items nothing links the moved scorer to the trainer.
    ledger = _ledger(_moved(traces, tmp_path / "unlinked", keep_ray=False))
    reward = next(p for p in ledger["processes"] if p["host"] == "node-b")
    assert reward["bound_s"] is None
    assert any("reward@node-b" in note for note in ledger["clock_notes"]), ledger["clock_notes"]
