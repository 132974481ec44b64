"""What a nested region costs inside a running trace (docs/performance.md: within 1.5x of torch's
fastest range marker, ``torch._C._profiler._RecordFunctionFast``).

Each sample is its own trace: an outer ``profile_region`` on a selected step (inside
``tsp.step(n)``) starts the profiler, the inner loop of a few thousand ranges is timed, and the
outer region's exit (stop and export to a temporary folder) is not. The candidates run inside
the same kind of trace, in turns: ``profile_region`` nested, ``_RecordFunctionFast`` and
``torch.profiler.record_function`` (a reference).
"""

from __future__ import annotations

import itertools
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, ratio_stat, ratio_target, stat  # noqa: E402

LIMIT = 1.5


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import timeit

    import torch

    import torchstep_prof as tsp

    try:
        from torch._C._profiler import _RecordFunctionFast
    except ImportError:  # pragma: no cover - depends on the torch build
        _RecordFunctionFast = None

    number = 3_000
    rounds = 10 if quick else 30
    report = Report("bench_nested_range")
    folder = tempfile.mkdtemp(prefix="tsp-bench-nested-")
    steps = itertools.count(1)
    ns = {"tsp": tsp, "fast": _RecordFunctionFast, "record_function": torch.profiler.record_function}
    timers = {
        "profile_region": timeit.Timer("with tsp.profile_region('actor', 'compute_log_prob'):\n    pass", globals=ns),
        "record_function": timeit.Timer("with record_function('actor/compute_log_prob'):\n    pass", globals=ns),
    }
    if _RecordFunctionFast is not None:
        timers["fast"] = timeit.Timer("with fast('actor/compute_log_prob'):\n    pass", globals=ns)

    def in_trace(timer: timeit.Timer, count: int):  # type: ignore[no-untyped-def]
        def sample() -> float:
            with tsp.step(next(steps)), tsp.profile_region("bench", "outer"):
                per_op = timer.timeit(count) / count  # only the inner loop is timed
            return per_op

        return sample

    try:
        # Every step records (a cycle of one active step, repeated); traces go to a temp folder.
        with tsp.configure(save_path=folder, summary=False), tsp.contents("cpu"), tsp.schedule(active=1, repeat=0):
            samplers = {name: in_trace(timer, number if name != "record_function" else number // 4) for name, timer in timers.items()}
            samples = interleave(samplers, rounds)
            for name in samples:
                report.add(stat(f"range in a running trace: {name}", samples[name]))
            if "fast" in samples:
                report.targets.append(
                    ratio_target("nested_region_vs_fast_range", samples["fast"], samples["profile_region"], LIMIT, "nested profile_region vs _RecordFunctionFast")
                )
            else:
                report.notes.append("torch has no _RecordFunctionFast: no target measured")
            base = samples.get("fast", samples["profile_region"])
            report.add(ratio_stat("record_function / fast range", base, samples["record_function"], "info, reference"))
            report.add(ratio_stat("profile_region / record_function", samples["record_function"], samples["profile_region"], "info"))
            # Sanity: the outer regions did write traces (one per sample, warm-up rounds included).
            written = len(list(Path(folder).glob("*.json")))
            report.notes.append(f"{number} nested ranges per sample ({number // 4} for record_function), each sample its own trace ({written} written), {rounds} rounds")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


if __name__ == "__main__":
    _timing.main(run)
