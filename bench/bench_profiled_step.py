"""What a profiled step costs (docs/performance.md: within 1.05x of the same step under a
hand-written ``torch.profiler.profile`` with the same activities).

The target's step: a 3-layer MLP of width 512, batch 256 (about 10 ms on one core here),
forward, backward and SGD update. A second, tiny step (width 256, batch 64, ~2 ms) is measured
too, as information: every trace carries a fixed cost of ~0.1-0.2 ms beyond torch's own (the
``ProfilerStep#<n>`` row, the owner's range, the metadata, the atomic rename) which is a
visible fraction of such a short step. Candidate: the
step inside ``tsp.step(n)`` + ``tsp.profile_region`` on a selected step, CPU activity only: the
profiler starts, the body runs, the profiler stops and the trace is exported to a temporary
folder. Baseline: ``with torch.profiler.profile(activities=[CPU]) as prof: step()`` then
``prof.export_chrome_trace(<temp file>)``. Each is timed from before the block to after the
export, in alternating order round by round; the files are removed between rounds (untimed).
Both are warmed up first (the first profiler start in a process costs ~1 s).

Where CUDA is available, the same comparison runs on a CUDA step too (an MLP of width 4096,
batch 1024, synchronized at its end, so each sample holds the GPU's work): ``tsp.contents("cpu",
"cuda")`` against ``torch.profiler.profile(activities=[CPU, CUDA])`` + export, as information
(the target is the CPU one, which CI can check). Beside it, what an idle region costs (a schedule
in force, the step not selected) next to that CUDA step, as a fraction of the step. Without CUDA
the CUDA rows are left out and a note says so.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, ratio_stat, ratio_target, stat  # noqa: E402

LIMIT = 1.05


def _empty(folder: str) -> None:
    for entry in os.scandir(folder):
        os.unlink(entry.path)


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    from torch.profiler import ProfilerActivity, profile

    import torchstep_prof as tsp

    rounds = 20 if quick else 60
    report = Report("bench_profiled_step")
    for label, step_kwargs, is_target in (
        ("MLP 3x512, batch 256", {"width": 512, "batch": 256}, True),
        ("MLP 3x256, batch 64", {"width": 256, "batch": 64}, False),
    ):
        samples = _measure(tsp, profile, ProfilerActivity, _timing.make_mlp_step(**step_kwargs), rounds)
        report.add(stat(f"{label}, not profiled", samples["unprofiled"]))
        report.add(stat(f"{label} under hand-written torch.profiler + export", samples["torch"]))
        report.add(stat(f"{label} under tsp.profile_region (start, stop, export)", samples["region"]))
        report.add(ratio_stat(f"{label}: hand-written profiler / unprofiled", samples["unprofiled"], samples["torch"], "info: what profiling one step costs at all"))
        if is_target:
            report.targets.append(ratio_target("profiled_step_vs_torch", samples["torch"], samples["region"], LIMIT, f"profiled step vs hand-written torch.profiler, CPU, {label}"))
        else:
            report.add(ratio_stat(f"{label}: tsp.profile_region / hand-written", samples["torch"], samples["region"], "info: the fixed per-trace cost on a ~2 ms step"))
    report.notes.append(f"{rounds} interleaved rounds per step size, one torch thread; each sample is one whole window (start, step, stop, export)")
    _cuda_rows(report, tsp, profile, ProfilerActivity, rounds)
    return report


def _cuda_rows(report: Report, tsp, profile, ProfilerActivity, rounds: int) -> None:  # type: ignore[no-untyped-def]
    import torch

    if not torch.cuda.is_available():
        report.notes.append("CUDA rows left out: torch.cuda.is_available() is False")
        return
    label = "CUDA MLP 3x4096, batch 1024"
    cuda_step = _make_cuda_step(torch, width=4096, batch=1024)
    samples = _measure(tsp, profile, ProfilerActivity, cuda_step, rounds, cuda=True)
    report.add(stat(f"{label}, not profiled", samples["unprofiled"]))
    report.add(stat(f"{label} under hand-written torch.profiler(CPU, CUDA) + export", samples["torch"]))
    report.add(stat(f"{label} under tsp.profile_region, contents cpu+cuda", samples["region"]))
    report.add(ratio_stat(f"{label}: hand-written profiler / unprofiled", samples["unprofiled"], samples["torch"], "info: what profiling one CUDA step costs at all"))
    report.add(ratio_stat(f"{label}: tsp.profile_region / hand-written", samples["torch"], samples["region"], "info: the profiled CUDA step against torch's own profiler"))
    idle = _idle_region_cost(tsp, rounds)
    report.add(stat("idle region (schedule in force, step not selected)", idle))
    report.add(ratio_stat(f"idle region / {label} unprofiled", samples["unprofiled"][: len(idle)], idle, "info: an unprofiled region's share of a CUDA step"))
    report.notes.append(f"CUDA: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; each CUDA sample ends with torch.cuda.synchronize()")


def _make_cuda_step(torch, width: int, batch: int):  # type: ignore[no-untyped-def]
    """A CUDA MLP training step (forward, backward, SGD), synchronized at its end."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)]
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()

    def cuda_step() -> None:
        sgd.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        sgd.step()
        torch.cuda.synchronize()

    return cuda_step


def _idle_region_cost(tsp, rounds: int) -> list:  # type: ignore[no-untyped-def]
    """Seconds per idle ``with tsp.profile_region(...)`` (a schedule in force, its step never
    selected), one sample per round."""
    never = 10**9
    sample = _timing.loop('with profile_region("train", "step", step=3):\n    pass', 2000, {"profile_region": tsp.profile_region})
    with tsp.schedule(steps=[never]):
        return [sample() for _ in range(rounds)]


def _measure(tsp, profile, ProfilerActivity, mlp_step, rounds, cuda=False):  # type: ignore[no-untyped-def]
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    contents = ("cpu", "cuda") if cuda else ("cpu",)
    ours = tempfile.mkdtemp(prefix="tsp-bench-step-ours-")
    theirs = tempfile.mkdtemp(prefix="tsp-bench-step-torch-")
    steps = itertools.count(1)
    counter = itertools.count()

    def unprofiled() -> float:
        t0 = time.perf_counter()
        mlp_step()
        return time.perf_counter() - t0

    def hand_written() -> float:
        path = os.path.join(theirs, f"trace{next(counter)}.json")
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            mlp_step()
        prof.export_chrome_trace(path)
        elapsed = time.perf_counter() - t0
        _empty(theirs)
        return elapsed

    def region() -> float:
        n = next(steps)
        t0 = time.perf_counter()
        with tsp.step(n):
            with tsp.profile_region("train", "step"):
                mlp_step()
        elapsed = time.perf_counter() - t0
        tsp.flush()  # the background writer is done with the file (untimed) before it goes
        _empty(ours)
        return elapsed

    try:
        with tsp.configure(save_path=ours, summary=False), tsp.contents(*contents), tsp.schedule(active=1, repeat=0):
            for _ in range(20):  # warm-up: torch's one-time start-up, allocator, caches
                unprofiled()
            for _ in range(5):
                hand_written(), region()
            return interleave({"unprofiled": unprofiled, "torch": hand_written, "region": region}, rounds, warmup=3)
    finally:
        shutil.rmtree(ours, ignore_errors=True)
        shutil.rmtree(theirs, ignore_errors=True)


if __name__ == "__main__":
    _timing.main(run)
