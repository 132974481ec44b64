"""Traces carry the timeline's spans: ``timeline`` and ``summarize`` on a folder of traces, no span log.

A real job (torchrun, 2 gloo ranks, ``actor`` and ``ref`` colocated in each process, rank 1's
ref 0.3 s slower) traces steps 2 and 3 with a schedule and no span log; the trace folder alone
gives the ledger of those steps."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from torchstep_prof.cli import main

from dist_helpers import WORKERS, run_torchrun
from trace_factory import write_ranks


@pytest.fixture(scope="module")
def traced_job(tmp_path_factory) -> Path:
    """The trace folder of a 4-step job tracing steps 2 and 3 on both ranks, spans off."""
    folder = tmp_path_factory.mktemp("traced")
    args = ["-", "4", "1", "0.3", str(folder / "traces"), "2", "3"]
    run_torchrun(WORKERS / "timeline_worker.py", 2, args, log_dir=folder).check()
    assert not list(folder.glob("**/spans-*.jsonl"))  # no span log: the traces are the only source
    return folder / "traces"


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_each_trace_carries_its_process_spans_under_the_torchstep_prof_key(traced_job):
    path = next(traced_job.glob("ref_compute-log-prob_step3_rank1-of-2_*.json"))
    meta = json.loads(path.read_text())["torchstep_prof"]
    timeline = meta["timeline"]
    assert (timeline["rank"], timeline["world_size"], timeline["pid"]) == (1, 2, meta["pid"])
    assert timeline["host"] and timeline["format"] == 1
    [(role, stage, start, end, _thread)] = timeline["spans"]
    assert (role, stage) == ("ref", "compute_log_prob") and 0.3 < end - start < 1.0
    [(step, step_start, step_end)] = timeline["steps"]
    assert step == 3 and step_start <= start <= end <= step_end
    assert abs(start - path.stat().st_mtime) < 60  # seconds since the epoch, this host's clock


def test_timeline_on_a_trace_folder_gives_the_traced_steps_with_both_processes(traced_job, capsys):
    code, out, _ = _cli(capsys, "timeline", str(traced_job))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("read from the spans the traces in ")
    assert lines[1].endswith(": 2 processes on 1 host, 2 steps")
    assert lines[2].startswith("step 2: ") and lines[3].startswith("step 3: ")
    code, out, err = _cli(capsys, "timeline", str(traced_job), "--step", "1")
    assert (code, out, err) == (1, "", "torchstep-prof: timeline: --step 1: not traced (traced: 2-3)\n")
    code, out, _ = _cli(capsys, "timeline", str(traced_job), "--json")
    ledger = json.loads(out)
    assert ledger["source"] == "traces" and ledger["note"] is None
    assert sorted(p["name"] for p in ledger["processes"]) == ["actor+ref rank 0", "actor+ref rank 1"]
    assert all(p["bound_s"] is not None and p["bound_s"] < 0.05 for p in ledger["processes"])
    assert [s["number"] for s in ledger["steps"]] == [2, 3]
    for step in ledger["steps"]:
        rows = {p["process"]: p for p in step["processes"]}
        assert set(rows) == {"actor+ref rank 0", "actor+ref rank 1"}
        waits = [g for g in rows["actor+ref rank 0"]["gaps"] if g["waited_for"] == "ref/compute_log_prob"]
        assert waits and waits[0]["waited_process"] == "actor+ref rank 1" and 0.25 < waits[0]["seconds"] < 0.6
        assert (step["long_tails"][0]["region"], step["long_tails"][0]["process"]) == (
            "ref/compute_log_prob",
            "actor+ref rank 1",
        )


def test_summarize_adds_the_timeline_section_and_key(traced_job, capsys):
    code, out, _ = _cli(capsys, "summarize", str(traced_job))
    assert code == 0
    section = out[out.index("Timeline, each step across 2 processes (from the traces") :]
    verdicts = [line.strip() for line in section.splitlines() if line.strip().startswith("step ")]
    assert [v.split(":")[0] for v in verdicts] == ["step 2", "step 3"]
    assert all("waiting for ref/compute-log-prob" in v for v in verdicts)
    code, out, _ = _cli(capsys, "summarize", str(traced_job), "--json")
    doc = json.loads(out)
    assert doc["timeline"]["source"] == "traces"
    assert [s["number"] for s in doc["timeline"]["steps"]] == [2, 3]
    assert len(doc["timeline"]["processes"]) == 2


def test_gzip_traces_are_read_and_span_files_are_preferred_when_both_are_there(traced_job, tmp_path, capsys):
    packed = tmp_path / "packed"
    packed.mkdir()
    for path in traced_job.glob("*.json"):
        with open(path, "rb") as plain, gzip.open(packed / (path.name + ".gz"), "wb") as out:
            shutil.copyfileobj(plain, out)
    _, plain_out, _ = _cli(capsys, "timeline", str(traced_job), "--json")
    _, packed_out, _ = _cli(capsys, "timeline", str(packed), "--json")
    assert json.loads(packed_out)["steps"] == json.loads(plain_out)["steps"]
    # A span file beside the traces: it is read (it covers every step), and that is said.
    header = {"kind": "process", "format": 1, "host": "a", "pid": 1, "rank": 0, "world_size": 1}
    steps = [[n, 10.0 * n, 10.0 * n + 1 + n % 3 + n / 10] for n in range(7)]  # step 6 beats 0 and 3
    batch = {
        "kind": "batch",
        "thread": "MainThread",
        "spans": [["rollout", "generate", a, b] for _, a, b in steps],
        "steps": steps,
    }
    (packed / "spans-a-1.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(batch) + "\n")
    code, out, _ = _cli(capsys, "timeline", str(packed))
    assert code == 0 and out.startswith("note: ") and "the span files are read" in out
    assert "1 processes on 1 host, 7 steps" in out
    code, out, _ = _cli(capsys, "summarize", str(packed), "--json")
    assert json.loads(out)["timeline"]["source"] == "span files"
    code, out, _ = _cli(capsys, "summarize", str(packed))
    section = out[out.index("Timeline, each step across 1 processes (from the span files; the 5 slowest of 7") :]
    assert "the span files are read" in section
    assert [line.split(":")[0].strip() for line in section.splitlines() if line.startswith("  step ")] == [
        "step 1", "step 2", "step 4", "step 5", "step 6",
    ]  # fmt: skip


def test_traces_without_spans_leave_summarize_unchanged_and_hostile_files_are_skipped(traced_job, tmp_path, capsys):
    write_ranks(tmp_path, world_size=2, steps=(1,))  # torch's own traces: no spans in them
    code, out, _ = _cli(capsys, "summarize", str(tmp_path), "--json")
    assert code == 0 and "timeline" not in json.loads(out)
    code, out, _ = _cli(capsys, "summarize", str(tmp_path))
    assert code == 0 and "Timeline" not in out
    code, _, err = _cli(capsys, "timeline", str(tmp_path))
    assert code == 1 and "no trace carrying spans" in err
    # One job's trace beside a FIFO, a link and a trace whose spans are of the wrong shape.
    shutil.copy(next(traced_job.glob("actor_update_step2_rank0-*.json")), tmp_path / "good.json")
    os.mkfifo(tmp_path / "fifo.json")
    os.symlink(tmp_path / "good.json", tmp_path / "link.json")
    bad = json.loads((tmp_path / "good.json").read_text())
    bad["torchstep_prof"]["timeline"]["spans"] = [["actor", "update", "soon", 1.0]]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    (tmp_path / "deep.json").write_text('{"torchstep_prof": ' + "[" * 100_000 + "]" * 100_000 + ', "traceEvents": []}')
    code, out, _ = _cli(capsys, "timeline", str(tmp_path), "--json")
    ledger = json.loads(out)
    assert code == 0 and [p["name"] for p in ledger["processes"]] == ["actor rank 0"]
    problems = "\n".join(ledger["problems"])
    assert "fifo.json: cannot be read" in problems and "link.json: cannot be read" in problems
    assert "bad.json: its spans are not of the right shape" in problems and "deep.json: cannot be read" in problems
    assert "2 traces without spans" in problems


def test_summarize_reads_the_timeline_of_the_newest_run_of_each_rank(traced_job, tmp_path, capsys):
    """An older run traced into the same folder (other pids, an hour earlier) is left out of the
    section, as summarize leaves it out of its table; ``timeline`` leaves it out too, and says so."""
    for path in traced_job.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
        trace = json.loads(path.read_text())
        meta = trace["torchstep_prof"]
        old_pid = meta["pid"] + 100_000
        meta["pid"] = meta["timeline"]["pid"] = old_pid
        trace["baseTimeNanoseconds"] -= 3600 * 10**9
        for key in ("spans", "steps", "anchors"):
            for item in meta["timeline"][key]:
                item[-3 if key == "spans" else -2] -= 3600
                item[-2 if key == "spans" else -1] -= 3600
        pid_part, stamp = path.stem.split("_pid")[1].split("_")
        name = path.name.replace(f"_pid{pid_part}_{stamp}", f"_pid{old_pid}_{int(stamp) - 10**7}")
        (tmp_path / name).write_text(json.dumps(trace))
    code, out, _ = _cli(capsys, "timeline", str(tmp_path), "--json")
    doc = json.loads(out)
    newest = {json.loads(p.read_text())["torchstep_prof"]["pid"] for p in traced_job.glob("*.json")}
    assert code == 0 and {p["pid"] for p in doc["processes"]} == newest
    assert doc["note"] == f"2 processes of 1 older run in {tmp_path} ignored; give each run its own folder"
    code, out, _ = _cli(capsys, "summarize", str(tmp_path), "--json")
    timeline = json.loads(out)["timeline"]
    assert sorted(p["pid"] for p in timeline["processes"]) == sorted(
        json.loads(p.read_text())["torchstep_prof"]["pid"] for p in traced_job.glob("actor_update_step2_*.json")
    )
    assert [s["number"] for s in timeline["steps"]] == [2, 3] and all(s["seconds"] < 5 for s in timeline["steps"])


def test_a_trace_names_its_process_role(tmp_path, capsys):
    import torchstep_prof as tsp

    with tsp.configure(save_path=str(tmp_path), summary=False, process_role="trainer"), tsp.schedule(steps=[1]):
        with tsp.step(1), tsp.profile_region("actor", "update"):
            pass
    tsp.flush()
    code, out, _ = _cli(capsys, "timeline", str(tmp_path), "--json")
    assert code == 0 and [p["name"] for p in json.loads(out)["processes"]] == ["trainer"]
