"""Region ranges are filed as torch files its own user ranges (``user_annotation``), and the
wall time the summary at exit prints is the one the command line reads from the file."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import torch

import torchstep_prof as tsp
from script_helpers import run_script

REPO = Path(__file__).resolve().parents[1]


def events(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "torchstep_prof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_region_ranges_are_user_annotations_like_record_function_ranges(tmp_path):
    """What HolisticTraceAnalysis, a Perfetto query or a user's script selects as user
    annotations holds every region: the owner's, nested ones, a fused step's, another
    thread's, next to the user's own record_function range."""
    with tsp.configure(save_path=str(tmp_path / "discrete"), summary=False), tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("actor", "update"):
            with tsp.profile_region("actor", "compute_log_prob"), torch.profiler.record_function("mine/own"):
                torch.ones(8, 8).mm(torch.ones(8, 8))
    fused = tmp_path / "fused"
    with tsp.configure(save_path=str(fused), summary=False, discrete=False), tsp.schedule(steps=[2]), tsp.step(2):
        with tsp.profile_region("rollout", "generate"):
            torch.ones(4).sum()
        worker = threading.Thread(target=lambda: tsp.profile_region("reward", "score").__enter__().__exit__(None, None, None))
        worker.start()
        worker.join()
        with tsp.profile_region("critic", "update"):
            torch.ones(4).sum()
    tsp.flush()
    (discrete,) = (tmp_path / "discrete").glob("*.json")
    (fused_trace,) = fused.glob("*.json")
    for path, regions in ((discrete, {"actor/update", "actor/compute_log_prob"}),
                          (fused_trace, {"rollout/generate", "critic/update", "reward/score"})):  # fmt: skip
        annotations = {e["name"] for e in events(path) if e.get("cat") == "user_annotation"}
        assert regions <= annotations, (path.name, annotations)
        assert not [e for e in events(path) if e["name"] in regions and e.get("cat") != "user_annotation"]
    annotations = {e["name"]: e for e in events(discrete) if e.get("cat") == "user_annotation"}
    assert "mine/own" in annotations  # torch's own user range, for comparison: the same category
    assert set(annotations["actor/update"]) == set(annotations["mine/own"])  # and the same keys
    # The readers still find the regions: diff's per-region wall times and operators.
    diffed = cli("diff", "fused", "fused", cwd=tmp_path)
    assert diffed.returncode == 0, diffed.stderr
    lines = diffed.stdout.splitlines()
    regions = lines[lines.index("Regions (mean wall ms per trace), largest change first:") + 2 :]
    assert {line.split()[0] for line in regions[:3]} == {"rollout/generate", "critic/update", "reward/score"}


def test_the_exit_table_and_ls_print_the_same_wall_time(tmp_path):
    code = """
        import time
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1, 2]), tsp.configure(save_path="profile"):
            for n in (1, 2):
                with tsp.step(n), tsp.profile_region("gpt", "fw"):
                    time.sleep(0.02 * n)
    """
    result = run_script(code, tmp_path, columns=250)
    assert result.returncode == 0, result.stderr
    table = {}
    for line in result.stdout.splitlines():
        match = re.match(r"^gpt\s+fw\s+(\d+)\s+\d+\s+([\d.]+)\s", line)
        if match:
            table[int(match[1])] = match[2]
    listed = cli("ls", "profile", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    walls = {}
    for line in listed.stdout.splitlines()[1:]:
        cells = line.split()
        walls[int(cells[2])] = cells[7]
    assert table == walls and len(table) == 2, (result.stdout, listed.stdout)
    summarized = json.loads(cli("summarize", "profile", "--json", cwd=tmp_path).stdout)
    for group in summarized["groups"]:
        assert f"{group['ranks'][0]['wall_ms']:.1f}" == table[group["step"]]


def test_traces_written_before_keep_their_cpu_op_regions_readable(tmp_path):
    """A trace written before region ranges were re-filed has them under cpu_op: the readers
    find the same regions and the same operators in it."""
    with tsp.configure(save_path=str(tmp_path / "new"), summary=False, discrete=False), tsp.schedule(steps=[1]):
        with tsp.step(1):
            for role in ("actor", "critic"):
                with tsp.profile_region(role, "update"):
                    torch.ones(16, 16).mm(torch.ones(16, 16))
    tsp.flush()
    (new,) = (tmp_path / "new").glob("*.json")
    trace = json.loads(new.read_text())
    for event in trace["traceEvents"]:
        if event.get("name") in ("actor/update", "critic/update"):
            event["cat"] = "cpu_op"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / new.name).write_text(json.dumps(trace))
    read = {}
    for side in ("new", "old"):
        done = cli("summarize", side, "--json", cwd=tmp_path)
        diffed = cli("diff", side, side, cwd=tmp_path)
        assert done.returncode == 0 and diffed.returncode == 0, done.stderr + diffed.stderr
        doc = json.loads(done.stdout)
        read[side] = ([(r["rank"], r["wall_ms"], r["top_ops"]) for g in doc["groups"] for r in g["ranks"]],
                      diffed.stdout.replace(side, "<side>"))  # fmt: skip
    assert read["new"] == read["old"]
    assert "actor/update" in read["new"][1] and "critic/update" in read["new"][1]


def test_a_layout_without_room_to_patch_is_rewritten_whole_and_one_it_cannot_parse_is_left(tmp_path):
    """torch 2.13 puts whitespace between an event's keys; a compact layout (another torch) has
    no room for the longer category, so the file is parsed and rewritten; a file that does not
    parse is left for the tail's checks to report."""
    from torchstep_prof.writing.range_marks import mark_region_ranges

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 0, "dur": 2500.0, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "actor/update", "ts": 1, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 5, "pid": 1, "tid": 1},
    ]
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps({"traceEvents": events, "traceName": "x"}, separators=(",", ":")))
    assert mark_region_ranges(str(compact), {"actor/update"}, 4) == 0.0025
    categories = {e["name"]: e["cat"] for e in json.loads(compact.read_text())["traceEvents"]}
    assert categories == {"ProfilerStep#4": "user_annotation", "actor/update": "user_annotation", "aten::mm": "cpu_op"}
    broken = tmp_path / "broken.json"
    text = json.dumps({"traceEvents": events}, separators=(",", ":"))[:-3]
    broken.write_text(text)
    assert mark_region_ranges(str(broken), {"actor/update"}, 4) is None
    assert broken.read_text() == text


def test_the_same_pass_hands_over_each_region_range_and_the_step_range_with_their_times(tmp_path):
    """The spans a trace carries (writing/trace_timeline.py) come from this pass: torch's layout
    (patched in place) and a compact one (rewritten whole) give the same ranges."""
    from torchstep_prof.writing.range_marks import Range, mark_region_ranges

    events = [  # keys in torch's order: pid, tid, ts, dur after the name
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 7, "ts": 0.5, "dur": 2500.0},
        {"ph": "X", "cat": "cpu_op", "name": "actor/update", "pid": 1, "tid": 7, "ts": 1.25, "dur": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 7, "ts": 2, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#3", "pid": 1, "tid": 7, "ts": 9, "dur": 1},
    ]
    expected = [Range("ProfilerStep#4", "7", 0.5, 2500.0), Range("actor/update", "7", 1.25, 10.0)]
    for separators in ((", ", ": "), (",", ":")):
        path = tmp_path / f"trace{len(separators[0])}.json"
        path.write_text(json.dumps({"traceEvents": events, "traceName": "x"}, separators=separators))
        ranges: list[Range] = []
        assert mark_region_ranges(str(path), {"actor/update"}, 4, ranges) == 0.0025
        assert ranges == expected, separators
