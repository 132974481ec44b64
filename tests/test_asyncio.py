"""Asyncio tasks entering regions during a selected step: never a crash, each task on its own track.

torch's ranges are per thread and must nest; tasks of one thread interleave. So only the trace
owner's task opens torch ranges; every other task's regions are spans written into the trace at
export, on a track (a ``tid`` named by a ``thread_name`` event) per task.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from trace_helpers import check_trace_file, find_range, ranges, trace_files

import torchstep_prof as tsp
from torchstep_prof import parse_trace_name

WORKER = Path(__file__).resolve().parent / "workers" / "asyncio_tasks.py"


def _run_workers(runs: list[tuple[Path, list[str]]]) -> None:
    """Run the worker once per (save_path, arguments), side by side; every run must exit 0."""
    procs = [
        (args, subprocess.Popen([sys.executable, str(WORKER), str(folder), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for folder, args in runs
    ]
    failures = []
    for args, proc in procs:
        output, _ = proc.communicate(timeout=240)
        if proc.returncode != 0:
            failures.append(f"asyncio_tasks.py {' '.join(args)}: rc {proc.returncode}\n{output[-3000:]}")
    assert not failures, "\n".join(failures)


def _tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}


def _task_spans(trace: dict, stage: str = "a") -> dict[str, dict]:
    """Each task's ``task<i>/<stage>`` range, by role; fails if a task has two."""
    found: dict[str, dict] = {}
    for event in ranges(trace):
        role, _, name_stage = event["name"].partition("/")
        if role.startswith("task") and name_stage == stage:
            assert role not in found, f"two {event['name']} ranges"
            found[role] = event
    return found


@pytest.mark.parametrize("tasks", [8, 2])
def test_tasks_entering_regions_in_a_selected_step_never_crash(tmp_path, tasks):
    """The reported case (``with profile_region(f"task{i}", "a"): await asyncio.sleep(0.001)``
    in ``step(n)``), in 20 selected steps: 10 discrete (the first task owns the trace), 10 fused
    (the step block owns it). Every step writes one trace holding every task's region, the
    owner's as a torch range on the thread's track and every other task's on a track of its own."""
    steps = 10
    _run_workers([(tmp_path, [str(tasks), str(steps)])])

    files = trace_files(tmp_path)
    assert sorted(parse_trace_name(p).step for p in files) == list(range(1, 2 * steps + 1)), [p.name for p in files]
    for path in files:
        trace = check_trace_file(path)
        spans = _task_spans(trace)
        assert sorted(spans) == sorted(f"task{i}" for i in range(tasks)), (path.name, sorted(spans))
        tracks = _tracks(trace)
        if parse_trace_name(path).step <= steps:  # discrete
            assert parse_trace_name(path).role == "task0"  # the first task to enter owns it
            owner = spans.pop("task0")
            assert "asyncio task" not in tracks.get(owner["tid"], "")
        else:
            assert parse_trace_name(path).role == "-".join(f"task{i}" for i in range(tasks))
        task_tids = [span["tid"] for span in spans.values()]
        assert len(set(task_tids)) == len(task_tids), "two tasks share a track"
        for role, span in spans.items():
            assert "asyncio task" in tracks.get(span["tid"], ""), (role, span["tid"], tracks)
            assert span["dur"] >= 0


def test_nested_regions_in_tasks_in_any_interleaving(tmp_path):
    """Tasks that enter at random times (also after the owner's trace stopped, then owning the
    next one), with a region nested in each: 20 steps of 8 tasks, 20 of 2, half discrete, half
    fused. No crash, every file whole, and every nested span inside its task's span on the same
    track."""
    runs = [(tmp_path / "8", ["8", "10", "--nested", "--jitter", "1"]), (tmp_path / "2", ["2", "10", "--nested", "--jitter", "2"])]
    _run_workers(runs)
    for folder, args in runs:
        files = trace_files(folder)
        steps = sorted(parse_trace_name(p).step for p in files)
        # Fused: exactly one trace per step; discrete: at least one (a late task owns another).
        assert set(steps) == set(range(1, 21)), (args, steps)
        assert [s for s in steps if s > 10] == list(range(11, 21)), (args, steps)
        for path in files:
            trace = check_trace_file(path)
            tracks = _tracks(trace)
            outer, inner = _task_spans(trace, "a"), _task_spans(trace, "inner")
            for role, span in inner.items():
                if role in outer and outer[role]["tid"] in tracks:  # both spans of a non-owner task
                    parent = outer[role]
                    assert span["tid"] == parent["tid"], (path.name, role)
                    assert parent["ts"] <= span["ts"] + 1 and span["ts"] + span["dur"] <= parent["ts"] + parent["dur"] + 1
            for span in list(outer.values()) + list(inner.values()):
                if span["tid"] >= 1 << 30:  # a synthetic track: a task's, and named for it
                    assert "asyncio task" in tracks[span["tid"]]


def test_tasks_of_an_event_loop_started_inside_a_region_are_spans(save_dir):
    """A synchronous owner (a rollout region) that runs an event loop of request tasks: the
    tasks' regions are spans on their own tracks, the owner's range stays on the thread's."""

    async def request(i: int) -> None:
        with tsp.profile_region("rollout", f"request{i}"):
            await asyncio.sleep(0.001 * (3 - i))

    async def generate() -> None:
        await asyncio.gather(*(request(i) for i in range(3)))

    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("rollout", "generate"):
            with tsp.profile_region("rollout", "prepare"):  # the nested fast path, before the loop
                pass
            asyncio.run(generate())
    (path,) = trace_files(save_dir)
    trace = check_trace_file(path)
    tracks = _tracks(trace)
    generate_range = find_range(trace, "rollout/generate")
    assert find_range(trace, "rollout/prepare")["tid"] == generate_range["tid"]
    request_tids = [find_range(trace, f"rollout/request{i}")["tid"] for i in range(3)]
    assert len(set(request_tids)) == 3 and generate_range["tid"] not in request_tids
    assert all("asyncio task" in tracks[tid] for tid in request_tids)
