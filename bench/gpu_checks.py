"""Every GPU check of the CUDA features in one run: prints what it saw and writes it as JSON.

    python bench/gpu_checks.py --out DIR

On a machine with CUDA it checks, on a small model: that ``contents("cuda")`` traces hold CUDA
kernels and runtime calls inside the region's time span and ``"memory"`` CUDA allocations; the
GPU time per region in the exit summary, ``summarize`` and the report; HolisticTraceAnalysis's
temporal breakdown on a folder ``torchstep-prof hta`` made; the NVTX ranges of
``contents("nvtx")`` (read back by ``nsys`` where it is installed, else by an NVTX injection
library built from ``bench/nvtx_log.c``); the ``memory_snapshot`` files (size, Python stacks,
history cleared) and how memory per region in ``summarize`` agrees with the snapshot on a region
that keeps a known tensor alive; the CUDA tests (``tests/test_gpu_contents.py``); and
``bench/bench_profiled_step.py`` with its CUDA rows. Without CUDA each CUDA part is skipped with
the reason (the HTA part then runs on a trace given synthetic kernels, to check the plumbing).
``DIR`` gets ``findings.json``, ``bench.json`` and the first trace folder's summary as text.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
FINDINGS: dict[str, Any] = {}
KEEP_MIB = 256  # the tensor the snapshot's region keeps alive
SCRATCH_MIB = 64  # and one it frees inside the region: the peak is their sum


def section(name: str) -> Callable[[Callable[..., dict]], Callable[..., None]]:
    """Run a check, print its findings, record them (a failure is recorded, never fatal)."""

    def wrap(check: Callable[..., dict]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            print(f"\n===== {name} =====", flush=True)
            t0 = time.perf_counter()
            try:
                found = check(*args)
            except Exception:
                found = {"status": "FAIL", "error": traceback.format_exc()[-3000:]}
            found.setdefault("status", "ok")
            found["seconds"] = round(time.perf_counter() - t0, 1)
            FINDINGS[name] = found
            print(json.dumps(found, indent=1, default=str)[-6000:], flush=True)

        return run

    return wrap


def sh(*argv: Any, timeout: float = 120, env: dict | None = None, cwd: Any = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    full.update(env or {})
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=full, cwd=cwd)


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def skip(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


NO_CUDA = "needs CUDA (torch.cuda.is_available() is False)"


@section("machine")
def machine() -> dict:
    import torch

    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if cuda():
        found["device"] = torch.cuda.get_device_name(0)
    found["nsys"] = shutil.which("nsys") or next(
        iter(sorted(Path("/").glob("opt/nvidia/nsight-systems*/bin/nsys"))), None
    )
    found["cuda_bins"] = sorted(
        p.name for d in Path("/usr/local").glob("cuda*/bin") for p in d.iterdir() if "nsys" in p.name
    )
    found["gcc"] = shutil.which("gcc")
    found["kernel"] = os.uname().release
    import inspect

    found["record_memory_history"] = str(inspect.signature(torch.cuda.memory._record_memory_history))
    found["nvtx_binding"] = getattr(torch._C, "_nvtx", None) is not None
    return found


TRAIN = """
import sys, torch, torchstep_prof as tsp
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 2048, device="cuda")
with tsp.configure(save_path=sys.argv[1]), tsp.schedule(steps=[2, 3]), tsp.contents("cpu", "cuda", "memory"):
    for n in range(1, 5):
        with tsp.step(n):
            with tsp.profile_region("train", "forward"):
                loss = model(x).square().mean()
            with tsp.profile_region("train", "backward"):
                loss.backward()
            with tsp.profile_region("train", "optim"):
                opt.step()
                opt.zero_grad()
                loss.item()  # the step's end waits for the GPU
"""


@section("cuda traces, GPU time per region (exit summary, summarize, report)")
def cuda_traces(work: Path, out: Path) -> dict:
    if not cuda():
        return skip(NO_CUDA)
    folder = work / "train"
    (work / "train.py").write_text(TRAIN)
    done = sh(sys.executable, work / "train.py", folder, env={"COLUMNS": "160"})
    found: dict[str, Any] = {"exit_code": done.returncode, "exit_summary": (done.stdout + done.stderr)[-2500:]}
    from torchstep_prof.traces.reading.files import load_trace

    per_trace = {}
    for path in sorted(folder.glob("*.json")):
        events = load_trace(str(path))["traceEvents"]
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        [step] = [e for e in steps if e.get("cat") != "gpu_user_annotation"]
        start, end = step["ts"], step["ts"] + step["dur"]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
        cuda_memory = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 1]
        per_trace[path.name.split("_pid")[0]] = {
            "wall_ms": round(step["dur"] / 1000, 3),
            "step_range_copies": sorted(str(e.get("cat")) for e in steps),
            "kernels": len(kernels),
            "kernels_within_span": sum(start <= k["ts"] and k["ts"] + k["dur"] <= end for k in kernels),
            "kernels_starting_in_span": sum(start <= k["ts"] <= end for k in kernels),
            "runtime_calls": len(runtime),
            "runtime_calls_in_span": sum(start <= r["ts"] <= end for r in runtime),
            # The profiler's own cudaDeviceSynchronize at its stop comes after the region's end.
            "runtime_calls_outside_span": sorted(r["name"] for r in runtime if not start <= r["ts"] <= end),
            "cuda_memory_events": len(cuda_memory),
            "cuda_events_at_ts_0": sum(e.get("ts") == 0 for e in kernels + runtime),
        }
    found["traces"] = per_trace
    table = sh(sys.executable, "-m", "torchstep_prof", "summarize", folder, env={"COLUMNS": "160"})
    found["summarize"] = table.stdout[-3000:]
    (out / "summarize.txt").write_text(table.stdout + "\n" + found["exit_summary"])
    doc = json.loads(sh(sys.executable, "-m", "torchstep_prof", "summarize", folder, "--json").stdout)
    found["summarize_json_gpu_ms"] = {
        f"{g['role']}/{g['stage']} step {g['step']}": [(r["wall_ms"], r["gpu_ms"]) for r in g["ranks"]]
        for g in doc["groups"]
    }
    page = work / "report.html"
    report = sh(sys.executable, "-m", "torchstep_prof", "report", folder, "-o", page)
    text = page.read_text() if page.exists() else ""
    found["report"] = {
        "exit_code": report.returncode,
        "stderr": report.stderr[-500:],
        "gpu_lines": text.count("GPU (kernels inside the region) median"),
    }
    ok = (
        done.returncode == 0
        and all(
            t["kernels"]
            and set(t["runtime_calls_outside_span"]) <= {"cudaDeviceSynchronize"}
            and t["kernels_starting_in_span"]
            and not t["cuda_events_at_ts_0"]
            for t in per_trace.values()
        )
        and "gpu ms" in found["exit_summary"]
        and "gpu ms" in found["summarize"]
        and found["report"]["gpu_lines"] > 0
        and any(t["cuda_memory_events"] for t in per_trace.values())
    )
    found["status"] = "ok" if ok else "FAIL"
    return found


@section("HolisticTraceAnalysis temporal breakdown on a torchstep-prof hta folder")
def hta(work: Path) -> dict:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        return skip(f"HolisticTraceAnalysis is not installed ({exc})")
    folder = work / "train"
    found: dict[str, Any] = {}
    if not cuda():
        sys.path.insert(0, str(REPO / "tests"))
        from trace_factory import add_kernels, write_trace

        folder = work / "synthetic"
        written = write_trace(folder, role="train", stage="forward", step=2, sleep_s=0.01)
        add_kernels(written.path, ((100.0, 3000.0, 7), (4000.0, 2000.0, 7)))
        found["note"] = "no CUDA: a CPU trace given synthetic kernels (checks the plumbing only)"
    out = work / "hta"
    made = sh(
        sys.executable,
        "-m",
        "torchstep_prof",
        "hta",
        folder,
        "--role",
        "train",
        "--stage",
        "forward",
        "--step",
        2,
        "-o",
        out,
    )
    found["hta_cmd"] = {
        "exit_code": made.returncode,
        "stderr": made.stderr[-800:],
        "files": sorted(os.listdir(out)) if out.exists() else [],
    }
    # Each trace holds one step: HTA leaves a trace's last step out unless told to keep it.
    analysis = TraceAnalysis(trace_dir=str(out), include_last_profiler_step=True)
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    found["temporal_breakdown"] = breakdown.to_string()
    found["status"] = "ok" if made.returncode == 0 and len(breakdown) >= 1 else "FAIL"
    return found


NVTX_JOB = """
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


@section("NVTX ranges of contents('nvtx')")
def nvtx(work: Path) -> dict:
    if not cuda():
        return skip(NO_CUDA)
    (work / "nvtx_job.py").write_text(NVTX_JOB)
    found: dict[str, Any] = {}
    nsys = FINDINGS.get("machine", {}).get("nsys")
    if nsys:
        ran = sh(nsys, "profile", "-t", "nvtx,cuda", "-o", work / "nsys_report", "--force-overwrite", "true",
                 sys.executable, work / "nvtx_job.py", work / "nsys_out", timeout=150)  # fmt: skip
        stats = sh(nsys, "stats", "--report", "nvtx_sum", work / "nsys_report.nsys-rep", timeout=90)
        found["nsys"] = {
            "exit_code": ran.returncode,
            "out": (ran.stdout + ran.stderr)[-1200:],
            "nvtx_sum": (stats.stdout + stats.stderr)[-2000:],
        }
    library = work / "libnvtx_log.so"
    built = sh("gcc", "-shared", "-fPIC", "-O2", "-o", library, REPO / "bench" / "nvtx_log.c", "-lpthread")
    if built.returncode != 0:
        found["injection"] = {"built": False, "stderr": built.stderr[-800:]}
        found["status"] = "ok" if "actor/update" in json.dumps(found.get("nsys", {})) else "FAIL"
        return found
    log = work / "nvtx_log.txt"
    ran = sh(
        sys.executable,
        work / "nvtx_job.py",
        work / "nvtx_out",
        env={"NVTX_INJECTION64_PATH": str(library), "NVTX_LOG_FILE": str(log)},
    )
    lines = log.read_text().splitlines() if log.exists() else []
    found["injection"] = {"exit_code": ran.returncode, "stderr": ran.stderr[-800:], "log": lines[:40]}
    pushes = [line for line in lines if line.startswith("push ")]
    wanted = ["push 0 ProfilerStep#2", "push 1 actor/update", "push 2 actor/forward"]
    starts = [line.split(" ", 2) for line in lines if line.startswith("start ")]
    ends = [line.split(" ") for line in lines if line.startswith("end ")]
    spans_ok = [s[2] for s in starts] == ["loader/fetch"] and [e[1] for e in ends] == [starts[0][1]]
    found["injection"]["other_thread_span_ok"] = spans_ok
    ok = all(w in pushes for w in wanted) and len([p for p in pushes if "actor/" in p]) == 2 and spans_ok
    found["status"] = "ok" if ok and ran.returncode == 0 else "FAIL"
    return found


@section("memory snapshot of a region keeping a known tensor, against summarize's memory")
def snapshot(work: Path) -> dict:
    if not cuda():
        return skip(NO_CUDA)
    import torch

    import torchstep_prof as tsp
    from torchstep_prof.writing.memory_snapshot import SNAPSHOT_SUFFIX

    folder = work / "snap"
    kept = []
    with tsp.configure(save_path=str(folder), summary=False), tsp.schedule(steps=[1, 2]):
        with tsp.contents("cpu", "cuda", "memory", "memory_snapshot"):
            for n in (1, 2):
                with tsp.step(n), tsp.profile_region("actor", "keep"):
                    scratch = torch.empty(SCRATCH_MIB * 2**20, dtype=torch.uint8, device="cuda")
                    kept.append(torch.empty(KEEP_MIB * 2**20, dtype=torch.uint8, device="cuda"))
                    del scratch
                    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tsp.flush()
    found: dict[str, Any] = {"flush_s": round(time.perf_counter() - t0, 3)}
    records = tsp.records().traces
    found["records"] = [
        {
            "path": os.path.basename(r.path or ""),
            "snapshot": os.path.basename(r.memory_snapshot or ""),
            "stop_ms": round(r.stop_s * 1000, 1),
            "gpu_ms": r.gpu_ms,
        }
        for r in records
    ]
    snapshots = sorted(folder.glob("*" + SNAPSHOT_SUFFIX))
    found["snapshots"] = {}
    for record in records:
        if record.memory_snapshot is None:
            continue
        path = Path(record.memory_snapshot)
        with open(path, "rb") as f:
            snap = pickle.load(f)
        trace = [e for device in snap["device_traces"] for e in device]
        net = peak = 0
        for event in trace:
            if event["action"] == "alloc":
                net += event["size"]
            elif event["action"] == "free_completed":
                net -= event["size"]
            peak = max(peak, net)
        big = [e for e in trace if e["action"] == "alloc" and e["size"] == KEEP_MIB * 2**20]
        found["snapshots"][record.step] = {
            "file": path.name,
            "bytes": path.stat().st_size,
            "events": len(trace),
            "actions": sorted({e["action"] for e in trace}),
            "net_mib": net / 2**20,
            "peak_mib": peak / 2**20,
            "kept_alloc_has_python_frames": bool(big and big[0].get("frames")),
            "kept_alloc_frames": (big[0].get("frames") or [])[:3] if big else None,
        }
    if snapshots:  # the offline form of PyTorch's memory viz renders it
        page = work / "snapshot.html"
        viz = sh(sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", snapshots[0], "-o", page)
        found["memory_viz"] = {
            "exit_code": viz.returncode,
            "html_bytes": page.stat().st_size if page.exists() else 0,
            "stderr": viz.stderr[-300:],
        }
    found["history_after"] = sum(len(device) for device in torch.cuda.memory._snapshot()["device_traces"])
    doc = json.loads(sh(sys.executable, "-m", "torchstep_prof", "summarize", folder, "--json").stdout)
    found["summarize_memory"] = {
        m["step"]: {"device": m["device"], "peak_mib": m["peak_bytes"] / 2**20, "net_mib": m["net_bytes"] / 2**20}
        for m in doc.get("memory", [])
        if m["role"] == "actor" and m["stage"] == "keep" and m["device"].startswith("cuda")
    }
    pairs = [(found["summarize_memory"].get(step), snap) for step, snap in found["snapshots"].items()]
    agree = bool(pairs) and all(
        m is not None and abs(m["net_mib"] - s["net_mib"]) < 1 and abs(m["peak_mib"] - s["peak_mib"]) < 1
        for m, s in pairs
    )
    expected = all(
        abs(s["net_mib"] - KEEP_MIB) < 1 and abs(s["peak_mib"] - KEEP_MIB - SCRATCH_MIB) < 1
        for s in found["snapshots"].values()
    )
    found["agree"], found["expected_net_and_peak"] = agree, expected
    ok = len(snapshots) == 2 and len(found["snapshots"]) == 2 and found["history_after"] == 0 and agree and expected
    found["status"] = (
        "ok" if ok and all(s["kept_alloc_has_python_frames"] for s in found["snapshots"].values()) else "FAIL"
    )
    return found


@section("CUDA tests (tests/test_gpu_contents.py, tests/test_gpu_time.py)")
def gpu_tests() -> dict:
    done = sh(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "tests/test_gpu_contents.py",
        "tests/test_gpu_time.py",
        timeout=240,
        cwd=REPO,
    )
    return {
        "status": "ok" if done.returncode == 0 else "FAIL",
        "exit_code": done.returncode,
        "out": (done.stdout + done.stderr)[-3000:],
    }


@section("bench/bench_profiled_step.py (CPU target, CUDA rows)")
def bench(out: Path) -> dict:
    done = sh(
        sys.executable,
        REPO / "bench" / "bench_profiled_step.py",
        "--quick",
        "--json-out",
        out / "bench.json",
        timeout=240,
    )
    return {"status": "ok" if done.returncode == 0 else "FAIL", "out": (done.stdout + done.stderr)[-4000:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for findings.json, bench.json, summarize.txt")
    parser.add_argument("--skip", action="append", default=[], help="leave out: tests, bench")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    work = Path(tempfile.mkdtemp(prefix="tsp-gpu-checks-"))
    try:
        machine()
        cuda_traces(work, out)
        hta(work)
        nvtx(work)
        snapshot(work)
        if "tests" not in args.skip:
            gpu_tests()
        if "bench" not in args.skip:
            bench(out)
    finally:
        (out / "findings.json").write_text(json.dumps(FINDINGS, indent=1, default=str))
        shutil.rmtree(work, ignore_errors=True)
    print("\n===== verdicts =====")
    for name, found in FINDINGS.items():
        print(f"{found['status']:>8}  {name}  ({found['seconds']} s)")
    return 1 if any(f["status"] == "FAIL" for f in FINDINGS.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
