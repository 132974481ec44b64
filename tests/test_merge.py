"""Merging traces into one Chrome trace: one track per input, on one wall-clock timeline."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import attrs
import pytest
from trace_factory import write_ranks, write_trace

from torchstep_prof.traces.analysis.merge import merge_traces, track_label
from torchstep_prof.traces.reading.files import (
    TraceInfo,
    TraceReadError,
    load_trace,
    read_trace_info,
    scan_traces,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """4 ranks x 2 steps in one folder; two traces recorded 1 s apart in another."""
    root = tmp_path_factory.mktemp("merge")
    written = write_ranks(root / "ranks", world_size=4, steps=(1, 2), sleep_s=0.003)
    first = write_trace(root / "apart", role="rollout", stage="generate", step=1, sleep_s=0.002)
    time.sleep(1.0)
    second = write_trace(
        root / "apart", role="rollout", stage="generate", step=2, sleep_s=0.002, gzip=True
    )
    return {"root": root, "written": written, "apart": (first, second)}


def _tracks(merged: dict) -> dict:
    """pid -> track name, from the process_name metadata."""
    return {
        e["pid"]: e["args"]["name"]
        for e in merged["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }


def _complete(events: list, pid: object = None) -> list:
    return [e for e in events if e.get("ph") == "X" and (pid is None or e["pid"] == pid)]


def test_merge_of_four_ranks_and_two_steps(run: dict, tmp_path: Path) -> None:
    infos, unreadable = scan_traces(run["root"] / "ranks")
    assert len(infos) == 8 and not unreadable
    out = tmp_path / "merged.json"
    result = merge_traces(infos, out)
    with open(out) as handle:
        merged = json.load(handle)

    tracks = _tracks(merged)
    expected = [f"actor/update rank {r} step {s}" for s in (1, 2) for r in range(4)]
    assert sorted(tracks.values()) == sorted(expected)
    assert [t.label for t in result.tracks] == expected  # sorted by step, then rank
    sort_index = {
        e["pid"]: e["args"]["sort_index"]
        for e in merged["traceEvents"]
        if e.get("name") == "process_sort_index"
    }
    assert [tracks[pid] for pid in sorted(sort_index, key=sort_index.get)] == expected
    # Every event sits on one of the tracks: no input's own pids (ints or strings) survive.
    assert {e["pid"] for e in merged["traceEvents"]} == set(tracks)
    names = [e for e in merged["traceEvents"] if e.get("name") == "process_name"]
    assert len(names) == len(tracks) == 8
    assert result.events == len(merged["traceEvents"])
    assert merged["baseTimeNanoseconds"] == min(i.base_time_ns for i in infos)
    assert not [p for p in tmp_path.iterdir() if p.name != "merged.json"]  # no temp file left


def test_each_input_keeps_its_relative_timing(run: dict, tmp_path: Path) -> None:
    infos, _ = scan_traces(run["root"] / "ranks")
    result = merge_traces(infos, tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    for track in result.tracks:
        original = _complete(load_trace(track.path)["traceEvents"])
        moved = _complete(merged["traceEvents"], track.pid)
        assert [e["name"] for e in moved] == [e["name"] for e in original]
        offsets = [m["ts"] - o["ts"] for m, o in zip(moved, original)]
        assert max(offsets) - min(offsets) < 0.01, track.label  # one shift for the whole input
        assert [m["dur"] for m in moved] == [o["dur"] for o in original]
        step_name = f"ProfilerStep#{track.label.rsplit(' ', 1)[-1]}"
        assert sum(e["name"] == step_name for e in moved) == 1


def test_traces_recorded_one_second_apart_stay_one_second_apart(run: dict, tmp_path: Path) -> None:
    first, second = run["apart"]
    out = tmp_path / "apart.json.gz"
    result = merge_traces([second.path, first.path], out)  # paths work too, in any order
    merged = json.loads(gzip.decompress(out.read_bytes()))
    starts = {}
    for track in result.tracks:
        step = track.label.rsplit(" ", 1)[-1]
        (event,) = [
            e
            for e in _complete(merged["traceEvents"], track.pid)
            if e["name"] == f"ProfilerStep#{step}"
        ]
        starts[step] = event["ts"]
    gap_ms = (starts["2"] - starts["1"]) / 1000
    wall_gap_ms = (second.started_ns - first.started_ns) / 1e6
    assert wall_gap_ms >= 1000
    assert gap_ms == pytest.approx(wall_gap_ms, abs=5)
    # And on the absolute clock: the output's base plus ts is the wall-clock start.
    epoch_ns = merged["baseTimeNanoseconds"] + starts["1"] * 1000
    assert epoch_ns == pytest.approx(first.started_ns, abs=5e6)


def _trace_file(path: Path, trace: dict) -> Path:
    path.write_text(json.dumps(trace))
    return path


def _synthetic(rank: int, base_ns: int, events: list) -> dict:
    return {
        "baseTimeNanoseconds": base_ns,
        "torchstep_prof": {
            "role": "actor",
            "stage": "update",
            "step": 1,
            "rank": rank,
            "world_size": 2,
        },
        "traceEvents": events,
    }


def test_flows_keep_their_pairs_and_string_pids_are_renumbered(tmp_path: Path) -> None:
    def events() -> list:
        return [
            {"ph": "M", "name": "process_name", "pid": 10, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_labels", "pid": 10, "tid": 0, "args": {"labels": "CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 10, "tid": 11, "args": {"name": "main"}},
            {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 10, "tid": 11, "ts": 0, "dur": 9},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 1, "pid": 10, "tid": 11, "ts": 1},
            {
                "ph": "f",
                "cat": "fwdbwd",
                "name": "fwdbwd",
                "id": 1,
                "pid": 10,
                "tid": 11,
                "ts": 5,
                "bp": "e",
            },
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 11, "ts": 2, "dur": 1},
            {
                "ph": "X",
                "cat": "Trace",
                "name": "PyTorch Profiler (0)",
                "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": 0,
                "dur": 10,
            },
            {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 10},
        ]

    paths = [
        _trace_file(tmp_path / "a.json", _synthetic(0, 2_000_000_000, events())),
        _trace_file(tmp_path / "b.json", _synthetic(1, 1_000_000_000, events())),
    ]
    out = tmp_path / "out" / "merged.json"
    out.parent.mkdir()
    merge_traces(paths, out)
    merged = json.loads(out.read_text())
    assert merged["baseTimeNanoseconds"] == 1_000_000_000
    tracks = _tracks(merged)
    assert sorted(tracks.values()) == ["actor/update rank 0 step 1", "actor/update rank 1 step 1"]
    assert all(isinstance(e["pid"], int) and e["pid"] in tracks for e in merged["traceEvents"])
    # Only the merge's own process metadata is left.
    labels = [e for e in merged["traceEvents"] if e.get("name") == "process_labels"]
    assert sorted(e["args"]["labels"] for e in labels) == ["a.json", "b.json"]

    flows = [e for e in merged["traceEvents"] if e.get("ph") in ("s", "f")]
    by_id: dict = {}
    for e in flows:
        by_id.setdefault(e["id"], []).append(e)
    assert len(by_id) == 2  # one pair per input, ids no longer shared
    for pair in by_id.values():
        assert sorted(e["ph"] for e in pair) == ["f", "s"]
        assert len({e["pid"] for e in pair}) == 1

    for pid, name in tracks.items():
        mine = [e for e in merged["traceEvents"] if e["pid"] == pid]
        # The CPU thread 11 and the GPU's stream 11 were different threads: still apart.
        op = next(e for e in mine if e["name"] == "op")
        kernel = next(e for e in mine if e["name"] == "k")
        assert op["tid"] == 11 and kernel["tid"] != op["tid"]
        # A global instant would cross every track: it is scoped to its own process now.
        assert next(e for e in mine if e["name"] == "Record Window End")["s"] == "p"
        # The input based 1 s later is shifted by 1 s.
        assert op["ts"] == (1_000_000.0 if name.endswith("rank 0 step 1") else 0)


def test_merge_refuses_nothing_and_bad_inputs(run: dict, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no trace"):
        merge_traces([], tmp_path / "x.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    with pytest.raises(TraceReadError, match="bad.json"):
        merge_traces([run["written"][0].path, bad], tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_track_label() -> None:
    info = TraceInfo(
        path="p",
        role="actor",
        stage="compute-log-prob",
        step=3,
        rank=2,
        world_size=4,
        wall_ms=1.0,
        base_time_ns=None,
        size_bytes=0,
    )
    assert track_label(info) == "actor/compute-log-prob rank 2 step 3"


def test_track_label_marks_occurrences_from_the_second() -> None:
    info = TraceInfo(
        path="p", role="trainer", stage="forward", step=15, rank=0, world_size=2,
        wall_ms=1.0, base_time_ns=None, size_bytes=0, occurrence=2,
    )
    assert track_label(info) == "trainer/forward rank 0 step 15 #2"
    assert track_label(attrs.evolve(info, occurrence=1)) == "trainer/forward rank 0 step 15"


def test_a_bad_input_is_left_out_and_named(run: dict, tmp_path: Path) -> None:
    good = read_trace_info(run["written"][0].path)
    gone = attrs.evolve(good, path=str(tmp_path / "gone.json"), rank=1)  # deleted since the scan
    result = merge_traces([good, gone], tmp_path / "out.json")
    assert [t.path for t in result.tracks] == [good.path]
    assert [path for path, _ in result.skipped] == [gone.path]
    merged = json.loads((tmp_path / "out.json").read_text())
    assert [i["file"] for i in merged["torchstep_prof_merge"]["inputs"]] == [good.path]
    assert set(_tracks(merged).values()) == {"actor/update rank 0 step 1"}
    with pytest.raises(ValueError, match="every input was skipped"):
        merge_traces([gone], tmp_path / "none.json")
    assert not (tmp_path / "none.json").exists()
