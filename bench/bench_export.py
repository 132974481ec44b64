"""How long writing one trace blocks the training thread (docs/performance.md: gzip runs off the
training thread; target: a gz trace blocks no more than 1.1x a plain JSON one).

A 20-step window (the MLP step of ``bench_profiled_step`` run 20 times inside one owning
region, ~1 MB of JSON) is recorded, and the time from the last statement inside the ``with``
to the statement after it is measured: the owner's exit (torch's stop and the hand-off to the
background writer, which exports, compresses and names the file). Each round is its own
``tsp.configure`` scope, whose exit waits for pending files, so one round's writing does not
overlap the next round's measurement (the gzip wait is printed, not part of the target).
``bench_trace_end.py`` compares the exit with torch's own ``stop()``.

References: torch's own ``prof.stop()`` + ``export_chrome_trace(".json")`` and
``export_chrome_trace(".json.gz")`` (level 9 on the calling thread) on the same window.
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

LIMIT = 1.1
WINDOW_STEPS = 20


def _empty(folder: str) -> int:
    size = 0
    for entry in os.scandir(folder):
        size = max(size, entry.stat().st_size)
        os.unlink(entry.path)
    return size


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    from torch.profiler import ProfilerActivity, profile

    import torchstep_prof as tsp

    rounds = 6 if quick else 20
    report = Report("bench_export")
    mlp_step = _timing.make_mlp_step()
    folder = tempfile.mkdtemp(prefix="tsp-bench-export-")
    steps = itertools.count(1)
    sizes: dict[str, list[int]] = {}
    flush_s: list[float] = []

    def ours(gz: bool):  # type: ignore[no-untyped-def]
        def sample() -> float:
            with tsp.configure(save_path=folder, gzip=gz, summary=False):
                with tsp.step(next(steps)), tsp.profile_region("train", "window"):
                    for _ in range(WINDOW_STEPS):
                        mlp_step()
                    t0 = time.perf_counter()
                blocked = time.perf_counter() - t0
                t1 = time.perf_counter()
            if gz:
                flush_s.append(time.perf_counter() - t1)  # the scope's exit waited for the gzip thread
            sizes.setdefault("gz" if gz else "json", []).append(_empty(folder))
            return blocked

        return sample

    def torch_export(suffix: str):  # type: ignore[no-untyped-def]
        def sample() -> float:
            prof = profile(activities=[ProfilerActivity.CPU])
            prof.start()
            for _ in range(WINDOW_STEPS):
                mlp_step()
            t0 = time.perf_counter()
            prof.stop()
            prof.export_chrome_trace(os.path.join(folder, f"torch{suffix}"))
            blocked = time.perf_counter() - t0
            sizes.setdefault(f"torch{suffix}", []).append(_empty(folder))
            return blocked

        return sample

    try:
        with tsp.contents("cpu"), tsp.schedule(active=1, repeat=0):
            for _ in range(10):
                mlp_step()
            samples = interleave(
                {
                    "json": ours(False),
                    "gz": ours(True),
                    "torch_json": torch_export(".json"),
                    "torch_gz": torch_export(".json.gz"),
                },
                rounds,
                warmup=2,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.add(stat("tsp region exit, plain JSON", samples["json"]))
    report.add(stat("tsp region exit, gzip=True", samples["gz"]))
    report.add(stat("torch stop + export_chrome_trace(.json)", samples["torch_json"], note="reference"))
    report.add(stat("torch stop + export_chrome_trace(.json.gz)", samples["torch_gz"], note="reference, level 9 in-thread"))
    report.add(stat("gzip=True: scope exit waiting for the gzip thread", flush_s[-rounds:], note="not in the step"))
    for key, label in (("json", "tsp .json"), ("gz", "tsp .json.gz"), ("torch.json", "torch .json"), ("torch.json.gz", "torch .json.gz")):
        if sizes.get(key):
            report.add(stat(f"file size: {label}", [float(s) for s in sizes[key][-rounds:]], unit="B"))
    report.add(ratio_stat("tsp plain exit / torch stop+export .json", samples["torch_json"], samples["json"], "info (target: no longer than torch's export)"))
    report.add(ratio_stat("tsp gz exit / torch stop+export .json.gz", samples["torch_gz"], samples["gz"], "info"))
    report.targets.append(ratio_target("export_gz_vs_json_blocking", samples["json"], samples["gz"], LIMIT, "gz trace vs plain JSON, time the step is blocked"))
    report.notes.append(f"{WINDOW_STEPS} MLP steps per window, {rounds} interleaved rounds, one torch thread")
    return report


if __name__ == "__main__":
    _timing.main(run)
