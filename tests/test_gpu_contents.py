"""``contents("nvtx")`` and ``contents("memory_snapshot")``, and what ``contents("cuda")`` and
``"memory"`` record on a GPU.

The CPU tests check the configuration, the one-warning fallback without CUDA and the snapshot
writer; the CUDA tests (skipped without CUDA) check real kernels, runtime calls, allocations,
NVTX ranges and allocator snapshots. ``bench/gpu_checks.py`` runs these on a GPU machine.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from trace_helpers import events, load_trace, trace_files

import torchstep_prof as tsp
from torchstep_prof.errors import ConfigError
from torchstep_prof.recording import memory_history as _memory_history
from torchstep_prof.recording import nvtx as _nvtx
from torchstep_prof.traces.reading.files import scan_traces
from torchstep_prof.writing import memory_snapshot as _snapshot

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.is_available() is False)")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback of a machine without CUDA")
REPO = Path(__file__).resolve().parents[1]


# --- configuration and the fallback without CUDA (CPU) ------------------------------------------


def test_nvtx_and_memory_snapshot_are_contents_a_typo_is_named() -> None:
    with tsp.contents("cpu", "nvtx", "memory_snapshot"):
        assert tsp.effective_config().contents == ("cpu", "nvtx", "memory_snapshot")
    with pytest.raises(ConfigError) as caught:
        with tsp.contents("nvtx", "memory_snapshots"):
            pass
    assert "contents: 'memory_snapshots' is not one of" in str(caught.value)
    assert "nvtx, memory_snapshot" in str(caught.value)


@cpu_only
@pytest.mark.skipif(_nvtx._nvtx_module() is not None, reason="this torch build has NVTX")
def test_without_cuda_nvtx_and_snapshots_warn_once_and_traces_are_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_nvtx, "_warned", False)
    monkeypatch.setattr(_memory_history, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tsp.configure(save_path=str(tmp_path), summary=False), tsp.schedule(steps=[1, 2]):
            with tsp.contents("cpu", "nvtx", "memory_snapshot"):
                for n in (1, 2):
                    with tsp.step(n), tsp.profile_region("actor", "update"):
                        with tsp.profile_region("actor", "inner"):
                            torch.ones(4).add_(1)
        tsp.flush()
    texts = [str(w.message) for w in caught]
    assert len([t for t in texts if "'nvtx'" in t]) == 1, texts
    assert len([t for t in texts if "'memory_snapshot'" in t]) == 1, texts
    assert all(issubclass(w.category, tsp.TorchstepProfWarning) for w in caught)
    files = trace_files(tmp_path)
    assert len(files) == 2 and sorted(os.listdir(tmp_path)) == sorted(p.name for p in files)  # no snapshot
    assert "actor/inner" in {e.get("name") for e in events(load_trace(files[0]))}
    assert all(r.memory_snapshot is None for r in tsp.records().traces)


def test_snapshot_file_is_named_like_its_trace_and_never_replaces_one(tmp_path) -> None:
    trace = tmp_path / "actor_update_step3_rank0-of-1_pid7_20260101000000000.json.gz"
    temporary = str(tmp_path / ".torchstep_prof-partial-h-7-1.partial.pickle")
    snapshot = {"segments": [], "device_traces": [[{"action": "alloc", "size": 512}]]}
    path, problem = _snapshot.write_snapshot(snapshot, temporary, str(trace))
    assert problem is None and path == str(
        tmp_path / "actor_update_step3_rank0-of-1_pid7_20260101000000000.memory_snapshot.pickle"
    )
    with open(path, "rb") as f:
        assert pickle.load(f) == snapshot
    again, problem = _snapshot.write_snapshot({"other": 1}, temporary, str(trace))
    assert again is None and "exists already" in str(problem)
    with open(path, "rb") as f:
        assert pickle.load(f) == snapshot  # the first one stays
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # no temporary left


def test_a_snapshot_over_the_limit_is_not_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_snapshot, "MAX_SNAPSHOT_BYTES", 1000)
    trace = tmp_path / "actor_update_step3_rank0-of-1_pid7_20260101000000000.json"
    path, problem = _snapshot.write_snapshot({"blob": b"x" * 5000}, str(tmp_path / "t.pickle"), str(trace))
    assert path is None and "over the 0 MiB limit" in str(problem)
    assert os.listdir(tmp_path) == []


# --- on a GPU ------------------------------------------------------------------------------------


def _run_cuda_region(tmp_path: Path, *contents: str, keep_mib: int = 0, steps: tuple[int, ...] = (1,)):
    """One region per step doing real CUDA work (a matmul, synchronized inside the region);
    with ``keep_mib``, an inner region allocates that many MiB and keeps them alive."""
    kept = []
    x = torch.randn(1024, 1024, device="cuda")
    with (
        tsp.configure(save_path=str(tmp_path), summary=False),
        tsp.schedule(steps=list(steps)),
        tsp.contents(*contents),
    ):
        for n in steps:
            with tsp.step(n), tsp.profile_region("actor", "update"):
                with tsp.profile_region("actor", "forward"):
                    y = (x @ x).relu()
                if keep_mib:
                    with tsp.profile_region("actor", "keep"):
                        kept.append(torch.empty(keep_mib * 2**20, dtype=torch.uint8, device="cuda"))
                torch.cuda.synchronize()
    tsp.flush()
    del y
    return kept


def _step_span(trace: dict) -> tuple[float, float]:
    # The CPU's range: with CUDA, Kineto adds a copy on the GPU timeline (gpu_user_annotation).
    [step] = [
        e
        for e in events(trace)
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
    ]
    return float(step["ts"]), float(step["ts"]) + float(step["dur"])


@needs_cuda
def test_cuda_trace_holds_kernels_and_runtime_calls_inside_the_region(tmp_path) -> None:
    _run_cuda_region(tmp_path, "cpu", "cuda")
    [path] = trace_files(tmp_path)
    trace = load_trace(path)
    start, end = _step_span(trace)
    kernels = [e for e in events(trace) if e.get("cat") == "kernel"]
    runtime = [e for e in events(trace) if e.get("cat") == "cuda_runtime"]
    assert kernels and runtime
    inside = [k for k in kernels if start <= k["ts"] and k["ts"] + k["dur"] <= end]
    assert len(inside) == len(kernels), (start, end, [(k["name"], k["ts"], k["dur"]) for k in kernels])
    assert any(start <= r["ts"] <= end for r in runtime if "Launch" in r["name"])
    [record] = tsp.records().traces
    [info], _ = scan_traces(tmp_path)
    assert record.gpu_ms is not None and 0 < record.gpu_ms <= record.wall_s * 1000
    assert info.gpu_ms == pytest.approx(record.gpu_ms)  # one rule for the summary and summarize


@needs_cuda
def test_back_to_back_cuda_traces_keep_their_cuda_events_times(tmp_path) -> None:
    # Three traces a step, one right after the other, no synchronize: each trace's export
    # must be done before the next window starts, or its CUDA events come out at ts 0, dur 0.
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
    x = torch.randn(256, 1024, device="cuda")
    with tsp.configure(save_path=str(tmp_path), summary=False), tsp.schedule(steps=[2, 3]), tsp.contents("cpu", "cuda"):
        for n in (1, 2, 3):
            with tsp.step(n):
                with tsp.profile_region("train", "forward"):
                    loss = model(x).square().mean()
                with tsp.profile_region("train", "backward"):
                    loss.backward()
                with tsp.profile_region("train", "zero"):
                    model.zero_grad()
    tsp.flush()
    files = trace_files(tmp_path)
    assert len(files) == 6
    for path in files:
        trace = load_trace(path)
        start, end = _step_span(trace)
        runtime = [e for e in events(trace) if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]]
        assert runtime or "zero" in path.name, path.name
        outside = [(r["name"], r["ts"] - start) for r in runtime if not start <= r["ts"] <= end]
        assert not outside, (path.name, end - start, outside)


@needs_cuda
def test_memory_holds_cuda_allocations(tmp_path) -> None:
    _run_cuda_region(tmp_path, "cpu", "cuda", "memory", keep_mib=64)
    [path] = trace_files(tmp_path)
    cuda = [e for e in events(load_trace(path)) if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1]
    assert any(e["args"]["Bytes"] >= 64 * 2**20 for e in cuda), cuda[:5]


@needs_cuda
def test_memory_snapshot_is_written_next_to_its_trace_and_history_is_cleared(tmp_path) -> None:
    _run_cuda_region(tmp_path, "cpu", "cuda", "memory_snapshot", keep_mib=32, steps=(1, 2))
    traces = trace_files(tmp_path)
    snapshots = sorted(tmp_path.glob("*" + _snapshot.SNAPSHOT_SUFFIX))
    assert len(traces) == 2 and len(snapshots) == 2
    assert {_snapshot.snapshot_path(str(t)) for t in traces} == {str(s) for s in snapshots}
    for snapshot_file in snapshots:
        with open(snapshot_file, "rb") as f:
            snapshot = pickle.load(f)
        allocs = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
        # Each window holds its own 32 MiB allocation, and not the other step's: history cleared.
        assert len([a for a in allocs if a["size"] == 32 * 2**20]) == 1
        assert any("frames" in a and a["frames"] for a in allocs)  # Python stacks
    assert not any(torch.cuda.memory._snapshot()["device_traces"])  # nothing recorded after the window
    assert sorted(str(r.memory_snapshot) for r in tsp.records().traces) == [str(s) for s in snapshots]


NVTX_SCRIPT = """
import sys, threading, torch, torchstep_prof as tsp
x = torch.randn(1024, 1024, device="cuda")

def fetch():  # another thread's region while the trace records: a span, an NVTX start/end range
    with tsp.profile_region("loader", "fetch"):
        torch.ones(16, device="cuda").sum().item()

with tsp.configure(save_path=sys.argv[1], summary=False), tsp.schedule(steps=[2]), tsp.contents("cpu", "cuda", "nvtx"):
    for n in (1, 2, 3):
        with tsp.step(n), tsp.profile_region("actor", "update"):
            with tsp.profile_region("actor", "forward"):
                (x @ x).sum().item()
            worker = threading.Thread(target=fetch)
            worker.start()
            worker.join()
"""


@needs_cuda
def test_nvtx_ranges_are_pushed_for_the_selected_step(tmp_path) -> None:
    library = tmp_path / "libnvtx_log.so"
    built = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(library), str(REPO / "bench" / "nvtx_log.c"), "-lpthread"],
        capture_output=True,
        text=True,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the NVTX logging library (needs gcc): {built.stderr[-300:]}")
    log = tmp_path / "nvtx.txt"
    (tmp_path / "job.py").write_text(NVTX_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env.update(PYTHONPATH=str(REPO), NVTX_INJECTION64_PATH=str(library), NVTX_LOG_FILE=str(log))
    done = subprocess.run(
        [sys.executable, "job.py", "out"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    pushes = [line.split(" ", 2)[1:] for line in log.read_text().splitlines() if line.startswith("push ")]
    assert ["0", "ProfilerStep#2"] in pushes and ["1", "actor/update"] in pushes and ["2", "actor/forward"] in pushes
    assert len([p for p in pushes if p[1].startswith("actor/")]) == 2  # the selected step only
    lines = log.read_text().splitlines()
    assert len([x for x in lines if x.startswith("pop ")]) == len(pushes)  # every range closed
    # The other thread's region (a span): a start / end range, once, ended.
    starts = [line.split(" ", 2) for line in lines if line.startswith("start ")]
    assert [s[2] for s in starts] == ["loader/fetch"]
    assert [line.split(" ")[1] for line in lines if line.startswith("end ")] == [starts[0][1]]
