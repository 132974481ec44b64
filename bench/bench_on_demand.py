"""What serving on-demand traces costs a training loop that is not profiled (target: within 1%).

A training step of about 3 ms (an MLP forward, backward and SGD update, one torch thread) runs
in ``tsp.step(n)`` blocks in one process, side by side round by round: under a plain
``configure`` scope, and under ``tsp.on_demand(DIR, poll_s=...)`` (its poll thread running,
writing this rank's status every poll and reading the trigger file). No request is written, so
what differs is the poll thread and the step boundary's note of the step. The target is the
default ``poll_s`` (1 s); polling every 0.1 s, ten times as often, is shown too.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, ratio_target, stat  # noqa: E402

LIMIT = 1.01
# ~1 s a sample, at least one default poll each: a median over shorter samples would mostly
# miss the polls, and so their cost.
STEPS_PER_SAMPLE = 300


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import torchstep_prof as tsp

    report = Report("bench_on_demand")
    mlp_step = _timing.make_mlp_step(width=384, batch=96, layers=3)
    numbers = itertools.count(1)
    per_sample = 30 if _timing.SMOKE else STEPS_PER_SAMPLE

    def steps() -> float:
        import time

        t0 = time.perf_counter()
        for _ in range(per_sample):
            with tsp.step(next(numbers)):
                mlp_step()
        return (time.perf_counter() - t0) / per_sample

    with tempfile.TemporaryDirectory(prefix="tsp-bench-od-") as scratch:

        def under(**fields: object):  # type: ignore[no-untyped-def]
            def sample() -> float:
                with tsp.configure(save_path=scratch, summary=False, **fields):  # type: ignore[arg-type]
                    return steps()

            return sample

        samples = interleave(
            {
                "off": under(),
                "on": under(on_demand={"dir": f"{scratch}/od", "poll_s": 0.1}),
                "default": under(on_demand={"dir": f"{scratch}/od", "poll_s": 1.0}),
            },
            rounds=4 if quick else 16,
        )
    report.add(stat("training step (~3 ms), no on_demand", samples["off"]))
    report.add(stat("training step, on_demand polling every 0.1 s", samples["on"]))
    report.add(stat("training step, on_demand polling every 1 s (the default)", samples["default"]))
    report.add(_timing.ratio_stat("on_demand poll_s=0.1 vs off", samples["off"], samples["on"]))
    report.targets.append(
        ratio_target("on_demand_poll_thread", samples["off"], samples["default"], LIMIT,
                     "a ~3 ms step with the poll thread (default poll_s=1) vs without, one process")  # fmt: skip
    )
    report.notes.append(f"{STEPS_PER_SAMPLE} steps a sample, one torch thread, no request written")
    return report


if __name__ == "__main__":
    _timing.main(run)
