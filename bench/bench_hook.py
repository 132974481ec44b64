"""What a finish hook costs the step that triggers it (docs/performance.md: with ``wait=False``,
the default, a ``sleep 2`` hook adds under 5 ms to that step).

Each round times one profiled step (the last one its schedule selects, so its exit starts the
hook) twice, side by side: under ``on_finish("sleep 2")`` and under no hook at all. The target
is the difference of the medians, in ms. The hooks keep sleeping in the background while the
rounds go on; the script waits for them at the end.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, Target, median, stat  # noqa: E402

LIMIT_MS = 5.0


def run(quick: bool = False) -> Report:
    import torch

    import torchstep_prof as tsp

    rounds = 5 if quick else 15
    folder = tempfile.mkdtemp(prefix="tsp-bench-hook-")
    x = torch.randn(64, 64)

    def triggering_step(hook: bool) -> float:
        scopes = [tsp.configure(save_path=folder, summary=False), tsp.schedule(steps=[1])]
        if hook:
            scopes.append(tsp.on_finish("sleep 2", timeout_s=30))
        with scopes[0], scopes[1], (scopes[2] if hook else tsp.contents()):
            t0 = time.perf_counter()
            with tsp.step(1), tsp.profile_region("actor", "update"):
                (x @ x).sum()
            return time.perf_counter() - t0

    with tsp.configure(save_path=folder, summary=False), tsp.schedule(steps=[1]):
        tsp.profile_region("warm", "up")  # the profiler's one-time start-up, outside the rounds
    triggering_step(False)
    with_hook, without = [], []
    for index in range(rounds):
        order = (True, False) if index % 2 == 0 else (False, True)
        for hook in order:
            (with_hook if hook else without).append(triggering_step(hook))
    tsp.flush(timeout=60)
    report = Report("bench_hook")
    report.add(stat("step that starts a `sleep 2` hook", with_hook))
    report.add(stat("the same step, no hook", without))
    deltas = [(h - n) * 1000 for h, n in zip(with_hook, without)]
    report.targets.append(
        Target(
            "hook_blocks_step_ms",
            (median(with_hook) - median(without)) * 1000,
            min(deltas),
            max(deltas),
            LIMIT_MS,
            "ms",
            "added to the triggering step by a `sleep 2` hook (wait=False)",
        )
    )
    # The first hook of a process is the one a real job triggers (once): it must not pay the
    # hook's imports in the training thread either (they are paid with the warm-up).
    report.targets.append(
        Target(
            "hook_first_trigger_ms",
            (with_hook[0] - median(without)) * 1000,
            (with_hook[0] - max(without)) * 1000,
            (with_hook[0] - min(without)) * 1000,
            LIMIT_MS,
            "ms",
            "added to the step that triggers the process's first hook (wait=False)",
        )
    )
    report.notes.append(f"{rounds} rounds, each one hooked and one plain step side by side")
    return report


if __name__ == "__main__":
    _timing.main(run)
