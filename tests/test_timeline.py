"""``torchstep-prof timeline``: span files read back, clocks aligned from anchors, each step's ledger.

Real jobs (torchrun, 2 gloo ranks with two roles in each process) and hand-written span files
(a job's shape made exact, a shifted clock, hostile files)."""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from torchstep_prof.cli import main
from torchstep_prof.timeline.clock import estimate_offsets
from torchstep_prof.timeline.reading import Anchor, RayCall

from dist_helpers import WORKERS, run_torchrun, worker_env


def _write(folder: Path, name: str, header: dict, batches: list[dict], ended: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    lines = [{"kind": "process", "format": 1, **header}]
    lines += [{"kind": "batch", "thread": "MainThread", "rank": header.get("rank", 0), **b} for b in batches]
    if ended:
        lines.append({"kind": "end", "at": 0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _rl_job(folder: Path, steps: int = 3, base: float = 1000.0, pid: int = 1) -> None:
    """A trainer that waits on two rollout replicas (the second 3 s slower), then updates."""
    trainer, fast, slow = ({"spans": [], "steps": []} for _ in range(3))
    for n in range(steps):
        t = base + 20 * n
        for replica, seconds in ((fast, 3), (slow, 6)):
            replica["spans"].append(["rollout", "generate", t, t + seconds])
            replica["steps"].append([n, t, t + seconds])
        trainer["spans"] += [["ref", "compute_log_prob", t + 6.1, t + 7], ["actor", "update", t + 7, t + 9]]
        trainer["steps"].append([n, t, t + 9])
    for p, role, batch in ((pid, "trainer", trainer), (pid + 1, "rollout", fast), (pid + 2, "rollout", slow)):
        header = {"host": "a", "pid": p, "rank": 0, "world_size": 1, "process_role": role}
        _write(folder, f"spans-a-{p}.jsonl", header, [batch])


def _timeline(folder: Path, capsys, *args: str) -> tuple[int, str, str]:
    code = main(["timeline", str(folder), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_verdict_names_the_idle_role_what_it_waited_for_and_the_slow_replica(tmp_path, capsys):
    _rl_job(tmp_path)
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0
    assert out.splitlines()[1] == (
        "step 0: 9.0 s; trainer idle 6.1 s (68%) waiting for rollout/generate; "
        "rollout pid 3 finished rollout/generate 3.0 s after the other"
    )
    assert "critical path: rollout/generate (rollout pid 3, 6.0 s) → ref/compute_log_prob (trainer, 900.0 ms) → actor/update (trainer, 2.0 s)" in out
    assert "idle at 0 µs for 6.1 s: until rollout/generate on rollout pid 3 ended" in out
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    ledger = json.loads(out)
    step = ledger["steps"][1]
    trainer = next(p for p in step["processes"] if p["process"] == "trainer")
    assert trainer["idle_s"] == pytest.approx(6.1) and not trainer["within_clock_error"]
    assert dict(map(tuple, trainer["busy_by_region"])) == pytest.approx({"actor/update": 2.0, "ref/compute_log_prob": 0.9})
    assert step["long_tails"][0] == {
        "region": "rollout/generate", "process": "rollout pid 3", "past_median_s": 3.0, "longer_by_s": 3.0, "others": 1,
        "within_clock_error": False,
    }  # fmt: skip
    assert [r["role"] for r in step["role_idle"]] == ["trainer", "rollout"]


def test_clock_offsets_are_recovered_from_barriers_within_their_bound():
    # b's clock runs 2 s ahead; each barrier's entries spread out, its exits within 1-4 ms.
    anchors: dict[str, list[Anchor]] = {"a": [], "b": []}
    for k in range(20):
        t = 100.0 + k
        late = k % 2  # who arrives last alternates: bounds close from both sides
        anchors["a"].append(Anchor("barrier", k, t + (0.3 if late == 0 else 0.0), t + 0.3 + 0.001 * (k % 3 + 1)))
        anchors["b"].append(Anchor("barrier", k, 2 + t + (0.3 if late == 1 else 0.0), 2 + t + 0.3 + 0.001 * (k % 4 + 1)))
    clocks = estimate_offsets({"a": "n1", "b": "n2"}, anchors)
    assert clocks.reference in ("a", "b")
    shift = clocks.offset("b") - clocks.offset("a")
    assert abs(shift - 2.0) <= clocks.pair_bound("a", "b") < 0.01
    # No anchor, another host: no offset is claimed.
    lonely = estimate_offsets({"a": "n1", "c": "n3"}, {"a": anchors["a"]})
    assert lonely.bound("c") == float("inf") or lonely.bound("a") == float("inf")


def test_clock_offsets_are_recovered_from_ray_calls_within_their_bound():
    # "a" calls a task on "b" (clock 2 s ahead) each second: submitted, run 1-3 ms later for
    # 100 ms, got back 0.5-2 ms after its end.
    ray: dict[str, list[RayCall]] = {"a": [], "b": []}
    for k in range(20):
        t = 100.0 + k
        start, end = t + 0.001 * (k % 3 + 1), t + 0.001 * (k % 3 + 1) + 0.1
        ray["a"].append(RayCall(f"task{k}", "submitted", t, t))
        ray["b"].append(RayCall(f"task{k}", "ran", 2 + start, 2 + end))
        ray["a"].append(RayCall(f"task{k}", "returned", end + 0.0005 * (k % 4 + 1), end + 0.0005 * (k % 4 + 1)))
    clocks = estimate_offsets({"a": "n1", "b": "n2"}, {}, ray)
    shift = clocks.offset("b") - clocks.offset("a")
    assert abs(shift - 2.0) <= clocks.pair_bound("a", "b") < 0.002
    # Returns alone bound one side only: no offset is claimed.
    returns = {"a": [c for c in ray["a"] if c.what == "returned"], "b": ray["b"]}
    one_sided = estimate_offsets({"a": "n1", "b": "n2"}, {}, returns)
    assert math.isinf(one_sided.bound("a")) or math.isinf(one_sided.bound("b"))


def test_processes_of_two_hosts_without_anchors_are_never_ordered(tmp_path, capsys):
    _rl_job(tmp_path)
    path = tmp_path / "spans-a-1.jsonl"
    path.write_text(path.read_text().replace('"host": "a"', '"host": "b"'))
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    ledger = json.loads(out)
    assert any("no clock anchor links" in p for p in ledger["clock_notes"])
    trainer = next(p for p in ledger["steps"][0]["processes"] if p["process"].startswith("trainer"))
    assert trainer["within_clock_error"]
    assert "trainer" not in ledger["steps"][0]["verdict"].split(";")[1]


@pytest.fixture(scope="module")
def colocated_job(tmp_path_factory) -> Path:
    """A torchrun job of 2 gloo ranks, actor and ref in each; rank 1's ref 0.3 s slower."""
    folder = tmp_path_factory.mktemp("colocated")
    run_torchrun(WORKERS / "timeline_worker.py", 2, [str(folder / "spans"), "6", "1", "0.3"], log_dir=folder).check()
    return folder / "spans"


def test_a_torchrun_job_with_colocated_roles_names_the_slow_rank_and_what_the_other_waited_for(colocated_job, capsys):
    code, out, _ = _timeline(colocated_job, capsys, "--json")
    assert code == 0
    ledger = json.loads(out)
    assert sorted(p["name"] for p in ledger["processes"]) == ["actor+ref rank 0", "actor+ref rank 1"]
    assert all(p["bound_s"] < 0.05 for p in ledger["processes"])
    assert [s["number"] for s in ledger["steps"]] == list(range(6))
    waited, idle_more = [], []
    for step in ledger["steps"][1:]:  # step 0 holds the ranks' start-up skew
        rows = {p["process"]: p for p in step["processes"]}
        fast, slow = rows["actor+ref rank 0"], rows["actor+ref rank 1"]
        waits = [g for g in fast["gaps"] if g["waited_for"] == "ref/compute_log_prob"]
        assert waits and waits[0]["waited_process"] == "actor+ref rank 1"
        waited.append(waits[0]["seconds"])
        idle_more.append(fast["idle_s"] - slow["idle_s"])
        tail = step["long_tails"][0]
        assert (tail["region"], tail["process"]) == ("ref/compute_log_prob", "actor+ref rank 1")
        path = [(e["region"], e["process"]) for e in step["critical_path"]]
        assert ("ref/compute_log_prob", "actor+ref rank 1") in path
        assert path.index(("ref/compute_log_prob", "actor+ref rank 1")) < len(path) - 1  # something came after it
        assert "waiting for ref/compute_log_prob" in step["verdict"]
    # The times, over the steps: one step of a loaded machine may oversleep; the rank's extra 0.3 s may not vanish.
    assert 0.25 < statistics.median(waited) < 0.6, waited
    assert statistics.median(idle_more) == pytest.approx(0.3, abs=0.1), idle_more


def test_a_clock_shifted_by_two_seconds_is_recovered_within_its_bound(colocated_job, tmp_path, capsys):
    shifted = tmp_path / "spans"
    shutil.copytree(colocated_job, shifted)
    rank1 = next(p for p in shifted.iterdir() if json.loads(p.read_text().splitlines()[0])["rank"] == 1)
    lines = []
    for line in rank1.read_text().splitlines():  # as if rank 1 ran on another node whose clock is 2 s ahead
        record = json.loads(line)
        if record["kind"] == "process":
            record["host"] = "node-b"
        for key in ("spans", "steps", "anchors"):
            for item in record.get(key, ()):
                item[-2] += 2.0
                item[-1] += 2.0
        lines.append(json.dumps(record))
    rank1.write_text("\n".join(lines) + "\n")
    _, before, _ = _timeline(colocated_job, capsys, "--json")
    _, after, _ = _timeline(shifted, capsys, "--json")
    original, moved = json.loads(before), json.loads(after)
    procs = {p["rank"]: p for p in moved["processes"]}
    offset = procs[1]["offset_s"] - procs[0]["offset_s"]
    bound = procs[1]["bound_s"] + procs[0]["bound_s"]
    assert abs(offset - 2.0) <= bound < 0.05
    for a, b in zip(original["steps"], moved["steps"]):
        assert b["seconds"] == pytest.approx(a["seconds"], abs=2 * bound + 1e-3)
        idle = {p["process"].split("@")[0]: p["idle_s"] for p in b["processes"]}
        for p in a["processes"]:
            assert idle[p["process"]] == pytest.approx(p["idle_s"], abs=2 * bound + 1e-3)


def test_hostile_span_files_are_skipped_and_named_never_hang_or_crash(tmp_path):
    _rl_job(tmp_path)
    (tmp_path / "spans-cut-9.jsonl").write_bytes(
        b'{"kind": "process", "format": 1, "host": "a", "pid": 9, "rank": 0}\n'
        b'{"kind": "batch", "thread": "T", "spans": [["x", "y", 1000.0, 1001.0]]}\n'
        b'{"kind": "batch", "thread": "T", "spans": [["x", "y", 1000.0, 10'
    )
    (tmp_path / "spans-junk-10.jsonl").write_bytes(
        b'{"kind": "process", "host": "a", "pid": 10, "rank": 0}\n'
        b'not json\n{"kind": "batch", "spans": "abc"}\n{"kind": "batch", "spans": [["r", "s", NaN, 1]]}\n'
        b'{"kind": "batch", "thread": "T", "spans": [["\\u001b[2Jevil", "s\\n", 1000.5, 1000.6]]}\n'
        b'{"kind": "batch", "thread": "T", "spans": [], "ray": [["t1", "stolen", 1000.0, 1000.0]]}\n'
    )
    with open(tmp_path / "spans-huge-11.jsonl", "wb") as huge:  # sparse: no disk used
        huge.truncate(600 << 20)
    os.mkfifo(tmp_path / "spans-fifo-12.jsonl")
    os.symlink("/dev/zero", tmp_path / "spans-zero-13.jsonl")
    (tmp_path / "spans-nohead-14.jsonl").write_text('{"kind": "batch", "spans": []}\n')
    result = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "timeline", str(tmp_path)],
        env=worker_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Traceback" not in result.stderr
    assert "spans-cut-9.jsonl: line 3 has no line end (still being written, or its process stopped while writing it)" in out
    assert "problems reading the files:" in out and "skipped: " not in out  # never "skipped: ... skipped"
    assert "spans-huge-11.jsonl: bigger than" in out
    assert "spans-fifo-12.jsonl: not a regular file (a FIFO)" in out
    assert "spans-zero-13.jsonl: a symbolic link" in out
    assert "spans-nohead-14.jsonl: no process line" in out
    assert "spans-junk-10.jsonl: line 2 skipped" in out
    assert "spans-junk-10.jsonl: line 6 skipped (ValueError: expected one of submitted, returned, ran" in out
    assert "\x1b" not in out and "\\x1b[2Jevil/s\\n" in out
    assert "step 1: 9.0 s; trainer idle 6.1 s (68%) waiting for rollout/generate" in out


def test_an_empty_or_missing_folder_is_a_clear_error(tmp_path, capsys):
    code, out, err = _timeline(tmp_path, capsys)
    assert code == 1 and "no span file, and no trace carrying spans, in" in err
    assert out == ""  # no advice about steps: there is nothing to mark
    with pytest.raises(SystemExit) as caught:
        main(["timeline", str(tmp_path / "missing")])
    assert caught.value.code == 2
    assert "not a folder" in capsys.readouterr().err


def test_anchors_that_contradict_each_other_are_reported():
    # The same barrier seen 3 s apart by b, then 0 s apart: a clock stepped mid-run.
    anchors = {
        "a": [Anchor("barrier", 1, 10.0, 10.001), Anchor("barrier", 2, 20.0, 20.001)],
        "b": [Anchor("barrier", 1, 13.0, 13.001), Anchor("barrier", 2, 20.0, 20.001)],
    }
    clocks = estimate_offsets({"a": "n1", "b": "n2"}, anchors)
    [found] = clocks.contradictions
    assert (found.name, found.seq, found.against, found.a, found.b) == ("barrier", 2, ("barrier", 1), "a", "b")
    assert found.seconds == pytest.approx(2.998, abs=1e-3)
    assert clocks.bound("b") == float("inf")  # no offset is claimed across the contradiction


def test_a_contradiction_names_the_anchor_and_processes_and_keeps_one_hosts_processes_linked(tmp_path, capsys):
    t = 10.0
    for pid, host, late in ((1, "n1", 0.0), (2, "n1", 0.0), (3, "n2", 3.0)):
        batch = {
            "spans": [["w", "work", t, t + 1 + 0.1 * pid]],
            "steps": [[0, t, t + 2]],
            "anchors": [["barrier", 1, t + late, t + late + 0.001], ["barrier", 2, 20.0, 20.001]],
        }
        _write(tmp_path, f"spans-{host}-{pid}.jsonl", {"host": host, "pid": pid, "process_role": "w"}, [batch])
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0
    clocks = out[out.index("clocks: ") :].splitlines()
    assert clocks[0] == "clocks: on w pid 1@n1's; every aligned offset is right within 1.0 ms"
    assert clocks[1].startswith("  clock anchor 'barrier' #2 contradicts #1 (and the anchors before it) for w pid 1@n1 and w pid 3@n2 by 3.0 s")  # fmt: skip
    assert "no clock anchor links w pid 3@n2 to w pid 1@n1" in out  # the reference is never among them
    assert "skipped" not in out
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    bounds = {p["pid"]: p["bound_s"] for p in json.loads(out)["processes"]}
    assert bounds[1] == 0 and 0 < bounds[2] <= 0.001 and bounds[3] is None  # one host: still linked


def test_one_process_is_no_aligned_offset(tmp_path, capsys):
    _write(tmp_path, "spans-a-1.jsonl", {"host": "a", "pid": 1}, [{"spans": [["w", "x", 1.0, 2.0]], "steps": [[0, 1.0, 2.0]]}])
    _write(tmp_path, "spans-b-2.jsonl", {"host": "b", "pid": 2}, [{"spans": [["w", "x", 1.0, 2.0]], "steps": [[0, 1.0, 2.0]]}])
    code, out, _ = _timeline(tmp_path, capsys)
    assert "clocks: on w pid 1@a's; no other process is aligned to it" in out
    assert "right within" not in out


def test_a_second_run_in_the_same_folder_is_shown_alone_and_the_older_one_named(tmp_path, capsys):
    _rl_job(tmp_path, base=1000.0, pid=1)
    _rl_job(tmp_path, base=9000.0, pid=11)
    # A Ray actor started late in the newest run (its log starts after the others' did) is of that run.
    late = {"spans": [["reward", "score", 9021.0, 9022.0]], "steps": [[1, 9021.0, 9022.0]]}
    _write(tmp_path, "spans-a-20.jsonl", {"host": "a", "pid": 20, "rank": 0, "world_size": 1, "process_role": "reward", "start": 9020.5}, [late])  # fmt: skip
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"note: 3 processes of 1 older run in {tmp_path} ignored; give each run its own folder"
    assert lines[1] == f"timeline of {tmp_path}: 4 processes on 1 host, 3 steps"
    assert lines[2].startswith("step 0: 9.0 s; trainer idle 6.1 s (68%) waiting for rollout/generate")
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    doc = json.loads(out)
    assert doc["note"] == f"3 processes of 1 older run in {tmp_path} ignored; give each run its own folder"
    assert sorted(p["pid"] for p in doc["processes"]) == [11, 12, 13, 20]


def test_the_verdict_pins_on_a_region_only_the_idle_time_that_waited_for_it(tmp_path, capsys):
    t = 1000.0
    trainer = {"spans": [["trainer", "a", t, t + 1], ["trainer", "b", t + 1.5, t + 2], ["trainer", "c", t + 5, t + 6]], "steps": [[0, t, t + 6]]}  # fmt: skip
    gen = {"spans": [["gen", "x", t, t + 1.45], ["gen", "z", t + 1.5, t + 6]], "steps": [[0, t, t + 6]]}
    _write(tmp_path, "spans-a-1.jsonl", {"host": "a", "pid": 1, "process_role": "trainer"}, [trainer])
    _write(tmp_path, "spans-a-2.jsonl", {"host": "a", "pid": 2, "process_role": "gen"}, [gen])
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0
    # 0.5 s of the trainer's 3.5 s waited for gen/x; the 3 s after trainer/b followed nothing seen.
    assert out.splitlines()[1] == "step 0: 6.0 s; trainer idle 3.5 s (58%), 500.0 ms of it waiting for gen/x"
    assert "idle at 1.0 s for 500.0 ms: until gen/x on gen ended" in out
    assert "idle at 2.0 s for 3.0 s: unexplained" in out
    assert "idle share by role: trainer 58% (500.0 ms of it waiting for gen/x)" in out


def test_a_process_that_ended_a_phase_last_only_because_it_started_late_is_no_long_tail(tmp_path, capsys):
    t = 1000.0
    early = {"spans": [["ref", "compute_log_prob", t, t + 3]], "steps": [[0, t, t + 3.5]]}
    late = {"spans": [["ref", "compute_log_prob", t + 2.5, t + 3.5]], "steps": [[0, t, t + 3.5]]}
    _write(tmp_path, "spans-a-1.jsonl", {"host": "a", "pid": 1, "process_role": "ref"}, [early])
    _write(tmp_path, "spans-a-2.jsonl", {"host": "a", "pid": 2, "process_role": "ref"}, [late])
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0 and "long tail" not in out and "finished" not in out, out
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    assert json.loads(out)["steps"][0]["long_tails"] == []


def test_every_process_without_an_exit_line_is_named_with_its_last_step(tmp_path, capsys):
    def batch(last: int) -> dict:
        return {"spans": [["w", "x", 10.0 * n, 10.0 * n + 5] for n in range(last + 1)], "steps": [[n, 10.0 * n, 10.0 * n + 5] for n in range(last + 1)]}  # fmt: skip

    _write(tmp_path, "spans-a-1.jsonl", {"host": "a", "pid": 1, "rank": 0, "world_size": 3}, [batch(3)])
    _write(tmp_path, "spans-a-2.jsonl", {"host": "a", "pid": 2, "rank": 1, "world_size": 3}, [batch(2)], ended=False)
    _write(tmp_path, "spans-a-3.jsonl", {"host": "a", "pid": 3, "rank": 2, "world_size": 3}, [batch(1)], ended=False)
    code, out, _ = _timeline(tmp_path, capsys)
    lines = out.splitlines()
    assert lines[1] == (
        "no exit line (killed, or still running): w rank 1 (last step finished: 2), w rank 2 (last step finished: 1); "
        "a process torn down (torchrun's SIGTERM after another rank failed, ray.shutdown()) loses what it logged "
        "in its last half second"
    )
    assert lines[4].endswith("; incomplete: w rank 2's span log ends in this step") and lines[4].startswith("step 2:")
    assert lines[5].endswith("; incomplete: w rank 1's span log ends in this step") and lines[5].startswith("step 3:")


def test_step_asks_for_steps_the_spans_hold_and_json_gives_only_those(tmp_path, capsys):
    _rl_job(tmp_path, steps=4)
    code, out, err = _timeline(tmp_path, capsys, "--step", "99", "--step", "2")
    assert (code, out) == (1, "")
    assert err == "torchstep-prof: timeline: --step 99: not in the spans (steps: 0-3)\n"
    code, out, _ = _timeline(tmp_path, capsys, "--json", "--step", "2", "--step", "0")
    assert code == 0 and [s["number"] for s in json.loads(out)["steps"]] == [0, 2]
    code, out, _ = _timeline(tmp_path, capsys, "--step", "2")
    assert code == 0 and "step 2 (9.0 s), process by process:" in out


def test_a_full_stdout_is_a_clean_error_not_a_traceback(tmp_path):
    _rl_job(tmp_path)
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "torchstep_prof", "timeline", str(tmp_path)],
            env=worker_env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == "torchstep-prof: timeline: cannot write the output (No space left on device)\n"


def test_a_process_whose_ray_calls_ran_but_logged_no_region_is_warned_about(tmp_path, capsys):
    _rl_job(tmp_path)
    # What an async actor with tsp.spans entered in __init__ writes: its calls' runs, no region.
    batch = {"thread": "AsyncIO Thread: default", "spans": [], "ray": [["t1", "ran", 1000.0, 1001.0], ["t2", "ran", 1020.0, 1021.0]]}  # fmt: skip
    _write(tmp_path, "spans-a-7.jsonl", {"host": "a", "pid": 7, "process_role": "reward"}, [batch])
    code, out, _ = _timeline(tmp_path, capsys)
    assert code == 0
    assert out.splitlines()[1] == (
        "warning: reward (pid 7) ran 2 anchored Ray calls but logged no region: an async actor method runs in another "
        "thread and context, so enter tsp.spans in the method (docs/timeline.md)"
    )
    code, out, _ = _timeline(tmp_path, capsys, "--json")
    assert json.loads(out)["warnings"][0].startswith("reward (pid 7) ran 2 anchored Ray calls")
