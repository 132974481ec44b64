"""What a region costs with metrics on (``tsp.metrics``), and that metrics off costs what it did.

Targets, each timed side by side with its baseline (a bare class-based context manager made per
``with``) in the same run:

- metrics on, no schedule: ``with tsp.profile_region(...)`` within 2.5x of the bare manager, and a
  ``@tsp.profiled`` call within 3x of the same function called inside it (the decorator's
  wrapper is a Python frame more, and it calls the function with ``*args, **kwargs``);
- metrics on, a schedule in force and the step not selected (inside ``step(n)``): within 3x
  (the region reads the step block's answer from its context variable first);
- spans on (``tsp.spans``, the span log of docs/timeline.md), no schedule: within 2.5x, and
  spans and metrics both on: within 2.5x (a region hands its start and end to the one reader
  either way, one append);
- metrics off, the same two cases (no schedule; schedule, step not selected): still within the
  2x of ``bench_idle_region``, measured in this run beside the metrics-on ones.

The endpoint listens on 127.0.0.1 at a free port; nothing scrapes it while timing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, interleave, loop, ratio_target, stat  # noqa: E402
from bench_idle_region import Bare, plain  # noqa: E402  (the same baselines, side by side)

LIMIT_ON = 2.5
LIMIT_ON_WRAPPED = 3.0  # @profiled, and a region that reads its step block's answer
LIMIT_SPANS = 2.5
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

    from torchstep_prof.region_metrics import recorder
    from torchstep_prof.timeline import span_log

    # The reader (the folding thread once a second, the span log's thread twice a second) would
    # here take millions of 200 ns regions a second on the same GIL, a load no real step makes
    # (regions of a millisecond and more). Its work is timed apart, per span, below; the
    # regions' own cost is timed with it paused, and this thread's list emptied before each
    # sample, untimed, as the reader keeps it (a list grown to millions of items would time the
    # allocator's copies).
    every = recorder.FOLD_EVERY_S, span_log.WRITE_EVERY_S
    recorder.FOLD_EVERY_S = span_log.WRITE_EVERY_S = 3600.0

    def emptied_first(sampler: Any) -> Any:
        def sample() -> float:
            spans = getattr(recorder._LOCAL, "spans", None)
            if spans is not None:
                spans.clear()
            return sampler()  # type: ignore[no-any-return]

        return sample

    ns = {"tsp": tsp, "Bare": Bare, "plain": plain, "update": update}
    samplers = {
        "bare": emptied_first(loop("with Bare():\n    pass", number, ns)),
        "region": emptied_first(loop("with tsp.profile_region('actor', 'update'):\n    pass", number, ns)),
        "call_in_bare": emptied_first(loop("with Bare():\n    plain()", number, ns)),
        "profiled": emptied_first(loop("update()", number, ns)),
    }

    def measure(
        case: str, limit: float, what: str, profiled: bool = True, region: Any = None, wrapped_limit: float = 0.0
    ) -> None:
        chosen = samplers if profiled else {k: samplers[k] for k in ("bare", "region")}
        if region is not None:
            chosen = {**chosen, "region": region}
        samples = interleave(chosen, rounds)
        report.add(stat(f"{case}: profile_region", samples["region"]))
        report.targets.append(
            ratio_target(
                f"{case}_region", samples["bare"], samples["region"], limit, f"profile_region vs bare cm, {what}"
            )
        )
        if profiled:
            report.add(stat(f"{case}: @profiled call", samples["profiled"]))
            report.targets.append(
                ratio_target(
                    f"{case}_profiled",
                    samples["call_in_bare"],
                    samples["profiled"],
                    wrapped_limit or limit,
                    f"@profiled call vs call in bare cm, {what}",
                )
            )

    with tsp.profile_region("actor", "update"):  # the environment read once: not measured
        pass
    measure("metrics_off_no_schedule", LIMIT_OFF, "metrics off, no schedule")
    with tsp.configure(summary=False), tsp.schedule(steps=[NEVER]):
        for n in (1, 2):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
        with tsp.step(3):
            measure(
                "metrics_off_step_not_selected",
                LIMIT_OFF,
                "metrics off, schedule in force, step not selected",
                profiled=False,
            )

    with tsp.configure(summary=False), tsp.metrics(port=0, addr="127.0.0.1"):
        for _ in range(3):  # each thread's span list is made on first use: not measured
            with tsp.profile_region("actor", "update"):
                pass
            update()
        measure("metrics_on_no_schedule", LIMIT_ON, "metrics on, no schedule", wrapped_limit=LIMIT_ON_WRAPPED)
        with tsp.schedule(steps=[NEVER]):
            for n in (1, 2):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
            with tsp.step(3):
                measure(
                    "metrics_on_step_not_selected",
                    LIMIT_ON_WRAPPED,
                    "metrics on, schedule in force, step not selected",
                    profiled=False,
                )
        report.add(_reader_cost_per_span(tsp, "metrics on: the folding thread, per span (information)"))
    import tempfile

    with tempfile.TemporaryDirectory() as spans_dir, tsp.configure(summary=False), tsp.spans(spans_dir):
        for _ in range(3):  # each thread's span list is made on first use: not measured
            with tsp.profile_region("actor", "update"):
                pass
        # Metrics were on earlier in this process: the spans-only case is timed with the
        # buckets set aside, as in a process that never turned metrics on.
        bounds = list(recorder.BOUNDS)
        recorder.BOUNDS.clear()
        try:
            measure("spans_on_no_schedule", LIMIT_SPANS, "spans on, no schedule", profiled=False)
            report.add(_reader_cost_per_span(tsp, "spans on: the span log's thread, per span (information)"))
        finally:
            recorder.BOUNDS[:] = bounds
        with tsp.metrics(port=0, addr="127.0.0.1"):
            measure(
                "spans_and_metrics_on_no_schedule", LIMIT_SPANS, "spans and metrics on, no schedule", profiled=False
            )
            report.add(_reader_cost_per_span(tsp, "spans and metrics on: both readers, per span (information)"))
    recorder.FOLD_EVERY_S, span_log.WRITE_EVERY_S = every
    report.notes.append(
        f"{number} iterations per sample, {rounds} interleaved rounds; ratios are of medians, min/max of per-round ratios"
    )
    return report


def _reader_cost_per_span(tsp: Any, what: str) -> _timing.Stat:
    """What the reader spends on one span, off the training thread (taking, folding into the
    histograms, formatting and writing the span log's lines, whichever are on)."""
    import time

    from torchstep_prof.region_metrics import recorder
    from torchstep_prof.timeline import span_log

    def read() -> None:
        if recorder._SPANS_ON:
            span_log.flush_spans()
        else:
            recorder.drain()

    samples = []
    for _ in range(5):
        read()
        for _ in range(20_000):
            with tsp.profile_region("actor", "update"):
                pass
        t0 = time.perf_counter()
        read()
        samples.append((time.perf_counter() - t0) / 20_000)
    return stat(what, samples)


if __name__ == "__main__":
    _timing.main(run)
