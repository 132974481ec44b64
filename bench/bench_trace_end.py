"""How long the block that ends a trace blocks training (docs/performance.md: no longer than
1.2x torch's own ``stop()``, on 1 MB and 50 MB traces; the write runs on the background writer).

Each window runs many small ops (an in-place add on a small tensor) so that its JSON is about
1 MB or 50 MB (the op count is calibrated first). Side by side, round by round:

- torchstep_prof: a profiled region around the ops; the time from the last statement inside
  the ``with`` to the statement after it (ranges closed, metadata, torch's ``stop()``, the trace
  handed to the writer). The writer is then waited for (not timed), so its export never
  overlaps the next sample.
- torch: a hand-written ``torch.profiler.profile`` with the same activities, started before the
  same ops; the time of its ``stop()`` alone (its results are then freed, untimed).

On a shared 2-core machine the per-round ratios spread widely (0.4x-2x): read the median of a
full run, not a ``--quick`` one.
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
from _timing import Report, interleave, ratio_target, stat  # noqa: E402

LIMIT = 1.2
SIZES_MB = (1, 50)


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import torch
    from torch.profiler import ProfilerActivity, profile

    import torchstep_prof as tsp

    report = Report("bench_trace_end")
    folder = tempfile.mkdtemp(prefix="tsp-bench-trace-end-")
    steps = itertools.count(1)
    x = torch.ones(8)

    def ops(n: int) -> None:
        for _ in range(n):
            x.add_(1)

    def largest_file() -> int:
        size = 0
        for entry in os.scandir(folder):
            size = max(size, entry.stat().st_size)
            os.unlink(entry.path)
        return size

    def ours(n: int, sizes: list[int]):  # type: ignore[no-untyped-def]
        def sample() -> float:
            with tsp.profile_region("train", "window", step=next(steps)):
                ops(n)
                t0 = time.perf_counter()
            blocked = time.perf_counter() - t0
            tsp.flush()  # not timed: the writer's export must not overlap the next sample
            sizes.append(largest_file())
            return blocked

        return sample

    def torch_stop(n: int):  # type: ignore[no-untyped-def]
        def sample() -> float:
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.start()
            ops(n)
            t0 = time.perf_counter()
            prof.stop()
            blocked = time.perf_counter() - t0
            # Not timed: free torch's results now, as the writer does once a trace is written
            # (the profile object sits in a reference cycle: left alone, its results would
            # weigh on the next samples until a garbage collection).
            prof.profiler.kineto_results = None
            return blocked

        return sample

    try:
        with tsp.configure(save_path=folder, summary=False), tsp.contents("cpu"), tsp.schedule(active=1, repeat=0):
            calibration: list[int] = []
            ours(2000, calibration)()
            ours(2000, calibration)()
            if not calibration or calibration[-1] <= 0:
                raise SystemExit("bench_trace_end: FAIL: the calibration trace is empty or missing")
            bytes_per_op = calibration[-1] / 2000
            for mb in SIZES_MB:
                n = max(100, int(mb * 1e6 / bytes_per_op))
                rounds = (6 if quick else 30) if mb < 10 else (2 if quick else 4)
                sizes: list[int] = []
                samples = interleave({"torch": torch_stop(n), "tsp": ours(n, sizes)}, rounds, warmup=1)
                report.add(stat(f"{mb} MB: torch stop()", samples["torch"], note=f"{n} ops, reference"))
                report.add(stat(f"{mb} MB: tsp trace end", samples["tsp"], note="region exit"))
                taken = len(samples["tsp"])  # the rounds interleave took (fewer under --smoke)
                written = sizes[-taken:]
                if len(written) < taken or min(written) < mb * 1e6 / 4:
                    # An empty or missing trace means our samples ran unprofiled (the region took
                    # something for another profiler): their times measure nothing.
                    raise SystemExit(
                        f"bench_trace_end: FAIL: the {mb} MB samples wrote traces of {written} bytes; "
                        "torchstep_prof did not profile them"
                    )
                report.add(stat(f"{mb} MB: trace file", [float(s) for s in written], unit="B"))
                report.targets.append(
                    ratio_target(
                        f"trace_end_vs_torch_stop_{mb}MB",
                        samples["torch"],
                        samples["tsp"],
                        LIMIT,
                        f"block ending a {mb} MB trace vs torch's stop()",
                    )
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.notes.append(f"{bytes_per_op:.0f} bytes of JSON per op; CPU activities; writer waited for between samples")
    return report


if __name__ == "__main__":
    _timing.main(run)
