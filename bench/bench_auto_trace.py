"""What watching for slow steps (``auto_trace``) costs a step, beside metrics on without it.

Target, timed side by side in the same run (interleaved rounds): a step block holding one
region, with metrics on, an on-demand folder polled and ``auto_trace`` watching, within 1.15x
of the same step with metrics on and the folder polled but nothing watched (the watch adds one
``deque.append`` per step on the training thread, and a 50 ms tick on the poll thread).
Informative: both against metrics off. No step is slow, so nothing is traced while timing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, loop, ratio_stat, ratio_target, stat  # noqa: E402

LIMIT = 1.15
STEP = "with tsp.step(7):\n    with tsp.profile_region('actor', 'update'):\n        pass"


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import torchstep_prof as tsp

    number = 5_000
    rounds = 10 if quick else 30
    report = Report("bench_auto_trace")
    ns = {"tsp": tsp}
    timed = loop(STEP, number, ns)
    folder = tempfile.mkdtemp(prefix="bench_auto_trace_")

    def metrics_off() -> float:
        with tsp.metrics(enable=False):
            return timed()

    def watching() -> float:
        with tsp.auto_trace(baseline_steps=50):  # the watch starts here and stops at the exit
            return timed()

    with tsp.configure(summary=False), tsp.metrics(port=0, addr="127.0.0.1"), tsp.on_demand(folder, poll_s=1.0):
        for _ in range(3):  # each thread's cells are made on first use: not measured
            watching()
            metrics_off()
        samples = interleave({"metrics_off": metrics_off, "metrics_on": timed, "watching": watching}, rounds)
    report.add(stat("step + region, metrics off", samples["metrics_off"]))
    report.add(stat("step + region, metrics on", samples["metrics_on"]))
    report.add(stat("step + region, metrics on + auto_trace watching", samples["watching"]))
    report.add(ratio_stat("metrics on vs off", samples["metrics_off"], samples["metrics_on"]))
    report.add(ratio_stat("watching vs metrics off", samples["metrics_off"], samples["watching"]))
    report.targets.append(
        ratio_target("watching_vs_metrics_on", samples["metrics_on"], samples["watching"], LIMIT,
                     "a step with auto_trace watching vs metrics on alone")
    )  # fmt: skip
    report.notes.append(f"{number} steps per sample, {rounds} interleaved rounds; ratios are of medians")
    return report


if __name__ == "__main__":
    _timing.main(run)
