"""What ``torchstep-prof run`` costs a training loop when it profiles no step (SPEC "Performance":
within 1% of ``python SCRIPT``).

The same script (this file with ``--child``: an MLP training step of about 10 ms with a
``torch.optim.SGD`` update, one torch thread) runs in fresh interpreters, as ``python SCRIPT``
and as ``python -m torchstep_prof run --steps 100000 -- SCRIPT`` (a schedule in force, no step
of the run selected: the optimizer hooks' check runs on every step), the two alternating child by
child. Each child times its own steady-state loop and prints the median step time; start-up
(torch's import, the profiler's one-time warm-up) is outside what is compared.

Both children run with glibc's mmap threshold fixed (``MALLOC_MMAP_THRESHOLD_`` = 16 MiB, so the
step's tensors come from the heap in both, with no system call). Left dynamic, it moves with whatever the process freed before the loop (any import
does), and the step's 128 KiB tensors then come from the heap or from fresh pages: 30 to 145
page faults a step, the same script and the same command, which swung the ratio 0.8x-1.15x
between runs. Fixed, it compares what ``run`` adds to a step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import ROOT, Report, ratio_target, stat  # noqa: E402

LIMIT = 1.01


def child(steps: int) -> None:
    """In the fresh interpreter: time ``steps`` training steps, print one JSON line."""
    import statistics

    mlp_step = _timing.make_mlp_step(width=512, batch=64, layers=3)
    for _ in range(10):
        mlp_step()
    import threading

    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        mlp_step()
        cpu.append(time.thread_time() - c0)
        times.append(time.perf_counter() - t0)
    # The training thread's CPU time too: free of the time other processes of a shared machine
    # took the core, though blind to a thread of ours taking the GIL (hence the thread count).
    print(json.dumps({"step_s": statistics.median(times), "cpu_s": statistics.median(cpu),
                      "threads": threading.active_count()}))  # fmt: skip


def _one(command: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TORCHSTEP_PROF_SUMMARY"] = "0"
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(16 << 20))  # see the module's docstring
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> Report:
    report = Report("bench_run")
    rounds, steps = (1, 20) if _timing.SMOKE else (2, 100) if quick else (6, 300)
    script = [str(Path(__file__).resolve()), "--child", str(steps)]
    plain_cmd = [sys.executable, *script]
    run_cmd = [sys.executable, "-m", "torchstep_prof", "run", "--steps", "100000", "--", *script]
    plain_runs: list[dict] = []
    run_runs: list[dict] = []
    for index in range(rounds):
        pair = [(plain_runs, plain_cmd), (run_runs, run_cmd)]
        for samples, command in pair if index % 2 == 0 else pair[::-1]:
            samples.append(_one(command))
    plain, profiled = [r["step_s"] for r in plain_runs], [r["step_s"] for r in run_runs]
    plain_cpu, run_cpu = [r["cpu_s"] for r in plain_runs], [r["cpu_s"] for r in run_runs]
    report.add(stat("python SCRIPT: one training step", plain))
    report.add(stat("torchstep-prof run, no step profiled: one training step", profiled))
    report.add(stat("python SCRIPT: training thread's CPU time a step", plain_cpu))
    report.add(stat("torchstep-prof run: training thread's CPU time a step", run_cpu))
    report.targets.append(
        ratio_target("run_not_profiling", plain, profiled, LIMIT, "torchstep-prof run vs python SCRIPT, no step profiled")
    )
    report.notes.append(f"{rounds} children each, {steps} steps a child, medians of the per-step times")
    cpu_ratio = statistics.median(run_cpu) / statistics.median(plain_cpu)
    report.notes.append(f"CPU time of the training thread, run / python SCRIPT: {cpu_ratio:.3f}; threads at the "
                        f"loop's end: python SCRIPT {sorted({r['threads'] for r in plain_runs})}, "
                        f"run {sorted({r['threads'] for r in run_runs})}")  # fmt: skip
    in_process(report, quick)
    return report


def in_process(report: Report, quick: bool) -> None:
    """The same step in this process with the run's hooks installed and removed round by round:
    free of the between-process noise of a shared machine."""
    import tempfile

    _timing.clean_environment()
    import torchstep_prof as tsp
    from torchstep_prof.selection.frames import current_frame
    from torchstep_prof.zero_code.boundaries import StepDriver

    mlp_step = _timing.make_mlp_step(width=512, batch=64, layers=3)
    with tempfile.TemporaryDirectory() as scratch, tsp.configure(save_path=scratch, summary=False, discrete=False), \
            tsp.schedule(steps=[100000]):  # fmt: skip
        driver = StepDriver(current_frame())

        def with_hooks() -> float:
            driver.install()
            try:
                return _timing.loop("step()", 20, {"step": mlp_step})()
            finally:
                driver.close()

        samples = _timing.interleave({"bare": _timing.loop("step()", 20, {"step": mlp_step}), "run": with_hooks},
                                     rounds=6 if quick else 20)  # fmt: skip
    from torchstep_prof.summary.records import STORE

    STORE.clear()  # close() noted that no step was profiled: not this bench's summary
    report.add(stat("in process: training step, no hooks", samples["bare"]))
    report.add(stat("in process: training step, run's hooks installed", samples["run"]))
    report.targets.append(
        ratio_target("run_hooks_in_process", samples["bare"], samples["run"], LIMIT,
                     "the same step with and without run's optimizer hooks, one process")  # fmt: skip
    )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        _timing.main(run)
