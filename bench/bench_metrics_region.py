"""What a region costs with metrics on (``tsp.metrics``), and that metrics off costs what it did.

Targets, each timed side by side with its baseline (a bare class-based context manager made per
``with``) in the same run:

- metrics on, no schedule: ``with tsp.profile_region(...)`` within 4x of the bare manager, and a
  ``@tsp.profiled`` call within 4x of the same function called inside it;
- metrics on, a schedule in force and the step not selected (inside ``step(n)``): within 4x;
- metrics off, the same two cases (no schedule; schedule, step not selected): still within the
  2x of ``bench_idle_region``, measured in this run beside the metrics-on ones.

The endpoint listens on 127.0.0.1 at a free port; nothing scrapes it while timing.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, loop, ratio_target, stat  # noqa: E402
from bench_idle_region import Bare, plain  # noqa: E402  (the same baselines, side by side)

LIMIT_ON = 4.0
LIMIT_OFF = 2.0
NEVER = 10**9




def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    import torchstep_prof as tsp

    number = 20_000
    rounds = 12 if quick else 40
    report = Report("bench_metrics_region")

    @tsp.profiled(role="critic")
    def update() -> None:
        return None

    ns = {"tsp": tsp, "Bare": Bare, "plain": plain, "update": update}
    samplers = {
        "bare": loop("with Bare():\n    pass", number, ns),
        "region": loop("with tsp.profile_region('actor', 'update'):\n    pass", number, ns),
        "call_in_bare": loop("with Bare():\n    plain()", number, ns),
        "profiled": loop("update()", number, ns),
    }

    def measure(case: str, limit: float, what: str, profiled: bool = True) -> None:
        chosen = samplers if profiled else {k: samplers[k] for k in ("bare", "region")}
        samples = interleave(chosen, rounds)
        report.add(stat(f"{case}: profile_region", samples["region"]))
        report.targets.append(ratio_target(f"{case}_region", samples["bare"], samples["region"], limit, f"profile_region vs bare cm, {what}"))
        if profiled:
            report.add(stat(f"{case}: @profiled call", samples["profiled"]))
            report.targets.append(ratio_target(f"{case}_profiled", samples["call_in_bare"], samples["profiled"], limit,
                                               f"@profiled call vs call in bare cm, {what}"))

    with tsp.profile_region("actor", "update"):  # the environment read once: not measured
        pass
    measure("metrics_off_no_schedule", LIMIT_OFF, "metrics off, no schedule")
    with tsp.configure(summary=False), tsp.schedule(steps=[NEVER]):
        for n in (1, 2):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
        with tsp.step(3):
            measure("metrics_off_step_not_selected", LIMIT_OFF, "metrics off, schedule in force, step not selected", profiled=False)

    with tsp.configure(summary=False), tsp.metrics(port=0, addr="127.0.0.1"):
        for _ in range(3):  # each thread's cells are made on first use: not measured
            with tsp.profile_region("actor", "update"):
                pass
            update()
        measure("metrics_on_no_schedule", LIMIT_ON, "metrics on, no schedule")
        with tsp.schedule(steps=[NEVER]):
            for n in (1, 2):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
            with tsp.step(3):
                measure("metrics_on_step_not_selected", LIMIT_ON, "metrics on, schedule in force, step not selected", profiled=False)
    report.notes.append(f"{number} iterations per sample, {rounds} interleaved rounds; ratios are of medians, min/max of per-round ratios")
    return report


if __name__ == "__main__":
    _timing.main(run)
