"""The report's Gantt of a job of hundreds of processes: its rows capped, the ones that matter kept.

Hand-written span files in the shape ``tsp.spans`` writes (one host, so one clock): 200 rollout
replicas, one of them 2 s slower than the others, and a trainer that waits for them all, then
updates; a real trace of the trainer's process beside them. The page is opened in headless
Chromium.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trace_factory import write_trace

from browser import probe_page
from torchstep_prof.traces.report.gantt import GANTT_ROWS

plotly = pytest.importorskip("plotly", reason="plotly is not installed (the [report] extra)")

ROOT = Path(__file__).resolve().parents[1]
REPLICAS = 200
SLOW = 1150  # the slow replica's pid: its name sorts past the first GANTT_ROWS


def _span_file(folder: Path, pid: int, role: str, items: list[tuple[int, float, float, str]], rank=None) -> None:
    header = {"kind": "process", "format": 1, "host": "node", "pid": pid, "rank": rank, "world_size": 1,
              "local_rank": 0, "process_role": role, "start": 999.0}  # fmt: skip
    batch = {
        "kind": "batch",
        "thread": "MainThread",
        "rank": rank,
        "spans": [[region.split("/")[0], region.split("/")[1], a, b] for _, a, b, region in items],
        "steps": [[n, a, b] for n, a, b, _ in items],
    }
    lines = [header, batch, {"kind": "end", "at": 1100.0}]
    (folder / f"spans-node-{pid}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _job(folder: Path, steps: int = 3) -> None:
    folder.mkdir()
    for pid in range(1000, 1000 + REPLICAS):
        seconds = 3.0 if pid == SLOW else 1.0
        items = [(n, 1000.0 + 10 * n, 1000.0 + 10 * n + seconds, "rollout/generate") for n in range(steps)]
        _span_file(folder, pid, "rollout", items)
    trainer = [(n, 1000.0 + 10 * n + 3.1, 1000.0 + 10 * n + 4.0, "actor/update") for n in range(steps)]
    _span_file(folder, os.getpid(), "trainer", trainer, rank=0)  # the process of the trace below


def test_a_gantt_of_hundreds_of_processes_draws_the_critical_ones_and_says_how_many_it_left_out(tmp_path):
    traces, spans = tmp_path / "traces", tmp_path / "spans"
    write_trace(traces, role="actor", stage="update", step=1)
    _job(spans)
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "report", str(traces), "--spans", str(spans), "-o", str(page)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"the timeline of {REPLICAS + 1} process(es)" in done.stdout
    html = page.read_text()
    left_out = REPLICAS + 1 - GANTT_ROWS
    notes = re.findall(r'<p class="meta rows-left-out">(.*?)</p>', html, re.S)
    assert len(notes) == 3  # under each step's chart
    for n, note in zip((0, 1, 2), sorted(notes, key=lambda t: re.search(r"--step (\d+)", t)[1])):
        assert note.startswith(f"{GANTT_ROWS} of {REPLICAS + 1} processes drawn")
        assert f"{left_out} not drawn" in note
        assert f"<code>torchstep-prof timeline {spans} --step {n}</code> lists them all" in note

    probe = probe_page(page)
    assert probe["errors"] == []
    gantts = [c for c in probe["charts"] if c["kind"] == "gantt"]
    assert len(gantts) == 3
    specs = json.loads(re.search(r'id="tsp-figures">(.*?)</script>', html, re.S)[1])
    for chart in gantts:
        rows = specs[chart["fig"]]["layout"]["yaxis"]["categoryarray"]
        assert len(rows) == GANTT_ROWS
        # Kept first: the slow replica (the long tail, on the critical path) and the trainer,
        # though both sort past the first GANTT_ROWS names; then the others in order.
        assert f"rollout pid {SLOW}" in rows and "trainer" in rows
        others = sorted(f"rollout pid {pid}" for pid in range(1000, 1000 + REPLICAS) if pid != SLOW)
        assert sorted(rows) == sorted(others[: GANTT_ROWS - 2] + [f"rollout pid {SLOW}", "trainer"])
        drawn = chart["text"]
        assert f"rollout pid {SLOW}" in drawn and "idle: waited for rollout/generate on rollout pid 1150" in drawn
        assert "rollout pid 1199" not in drawn
        assert chart["rect"][3] < 110 + 34 * GANTT_ROWS + 10  # px: the height of 48 rows, not of 201
        path = next(t for t in specs[chart["fig"]]["data"] if t["name"] == "critical path")
        assert set(path["y"]) == {f"rollout pid {SLOW}", "trainer"}
