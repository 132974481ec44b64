"""What ``torchstep-prof run`` costs a training loop when it profiles no step (docs/performance.md:
within 1% of ``python SCRIPT``).

The same script (this file with ``--child``: an MLP training step of about 10 ms with a
``torch.optim.SGD`` update, one torch thread) runs in fresh interpreters, as ``python SCRIPT``
and as ``python -m torchstep_prof run --steps 100000 -- SCRIPT`` (a schedule in force, no step
of the run selected: the optimizer hooks' check runs on every step). Start-up (torch's import,
the package's, the runner's) is outside what is compared: each child measures its steady loop.

Three measurements, each with what it can and cannot see:

* **Instructions a step** (the target ``run_not_profiling``): each command once under valgrind's
  callgrind (``_instructions``), which counts every instruction of every thread of the process
  between the loop's start and end: the interpreter, torch's kernels, the optimizer hooks, the
  garbage collector, any thread the package started. Two runs of one command agree within
  0.01%, so anything ``run`` adds to a step shows, on any machine. Blind to cache and memory
  effects. Needs valgrind (``make bench`` installs it as root); 2-3 minutes, so not under
  ``--smoke``.
* **Wall time a step, process against process** (no target, shown with its noise floor): the
  two commands' children alternate, with a third set of ``python SCRIPT`` children beside them.
  Fresh interpreters of one command differ by up to 40% in step time here, address
  randomization off too (physical pages, neighbours on the host): the plain-vs-plain ratio says
  how far this machine's wall time can be trusted today.
* **Wall time a step, hooks on and off in one process** (the target ``run_hooks_in_process``):
  the run's ``StepDriver`` installed and removed around single steps, alternating, with a second
  set of bare steps beside them (the noise floor: about 0.5% here), so the machine's drift hits
  all alike.

Every child, and this process for the in-process comparison, runs with glibc's allocator pinned
(``_timing.ALLOCATOR_ENV``): left dynamic, the same command had 1 to 380 page faults a step,
depending on what the process happened to free before its loop.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _instructions  # noqa: E402
import _timing  # noqa: E402
from _timing import ROOT, Report, Stat, Target, ratio_stat, ratio_target, stat  # noqa: E402

LIMIT = 1.01
COUNTED_STEPS = 3  # a step is ~100 M instructions, the same each step; callgrind runs ~50x slower than the CPU


def make_step():
    """The training step every measurement times: ~10 ms, as docs/performance.md's target says."""
    return _timing.make_mlp_step(width=512, batch=192, layers=3)


def child(steps: int) -> None:
    """In the fresh interpreter: time ``steps`` training steps, print one JSON line."""
    import statistics

    mlp_step = make_step()
    for _ in range(3 if _instructions.counting() else 10):  # under valgrind: 3 as good as 10, and minutes less
        mlp_step()
    import threading

    times, cpu = [], []
    _instructions.begin()  # a no-op unless this child runs under callgrind
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        mlp_step()
        cpu.append(time.thread_time() - c0)
        times.append(time.perf_counter() - t0)
    _instructions.end()
    # The training thread's CPU time too: free of the time other processes of a shared machine
    # took the core, though blind to a thread of ours taking the GIL (hence the thread count).
    print(json.dumps({"step_s": statistics.median(times), "cpu_s": statistics.median(cpu),
                      "threads": threading.active_count()}))  # fmt: skip


def _environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TORCHSTEP_PROF_SUMMARY"] = "0"
    env.update(_timing.ALLOCATOR_ENV)  # see the module's docstring
    return env


def _one(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=_environment(), cwd=str(ROOT), timeout=300,
                          check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commands(steps: int) -> tuple[list[str], list[str]]:
    script = [str(Path(__file__).resolve()), "--child", str(steps)]
    return [sys.executable, *script], [sys.executable, "-m", "torchstep_prof", "run", "--steps", "100000", "--", *script]


def run(quick: bool = False) -> Report:
    report = Report("bench_run")
    instructions(report)
    wall_time(report, quick)
    in_process(report, quick)
    return report


def instructions(report: Report) -> None:
    """Both commands under callgrind at once (a count does not care what else runs)."""
    reason = "--smoke (2-3 minutes under valgrind)" if _timing.SMOKE else _instructions.missing()
    if reason:
        report.notes.append(f"instructions a step not counted, so no run_not_profiling target: {reason}")
        return
    commands = _commands(COUNTED_STEPS)
    env = dict(_environment(), PYTHONHASHSEED="0")
    with ThreadPoolExecutor(2) as pool:
        plain, run_ = pool.map(lambda command: _instructions.count(command, env).instructions, commands)
    report.add(Stat("python SCRIPT: instructions a step", plain / COUNTED_STEPS, plain / COUNTED_STEPS,
                    plain / COUNTED_STEPS, 1, ""))  # fmt: skip
    report.add(Stat("torchstep-prof run: instructions a step", run_ / COUNTED_STEPS, run_ / COUNTED_STEPS,
                    run_ / COUNTED_STEPS, 1, ""))  # fmt: skip
    report.targets.append(Target("run_not_profiling", run_ / plain, run_ / plain, run_ / plain, LIMIT, "x",
                                 "torchstep-prof run vs python SCRIPT, no step profiled: instructions a step"))  # fmt: skip
    report.notes.append(f"run adds {(run_ - plain) / COUNTED_STEPS:,.0f} instructions a step "
                        f"(callgrind, every thread of the process, {COUNTED_STEPS} steps each)")  # fmt: skip


def wall_time(report: Report, quick: bool) -> None:
    """Children of the two commands alternate, with a second set of plain ones: the noise floor."""
    rounds, steps = (1, 10) if _timing.SMOKE else (2, 50) if quick else (6, 150)
    plain_cmd, run_cmd = _commands(steps)
    runs: dict[str, list[dict]] = {"plain": [], "run": [], "plain again": []}
    for index in range(rounds):
        order = [("plain", plain_cmd), ("run", run_cmd), ("plain again", plain_cmd)]
        for name, command in order if index % 2 == 0 else order[::-1]:
            runs[name].append(_one(command))
    plain, profiled, again = ([r["step_s"] for r in runs[name]] for name in ("plain", "run", "plain again"))
    report.add(stat("python SCRIPT: one training step", plain))
    report.add(stat("torchstep-prof run, no step profiled: one training step", profiled))
    report.add(ratio_stat("wall time a step, run / python SCRIPT", plain, profiled))
    report.add(ratio_stat("wall time a step, python SCRIPT / python SCRIPT (noise floor)", plain, again))
    cpu_ratio = statistics.median(r["cpu_s"] for r in runs["run"]) / statistics.median(r["cpu_s"] for r in runs["plain"])
    report.notes.append(f"wall time: {rounds} children of each, {steps} steps a child, medians of the per-step "
                        f"times; the training thread's CPU time, run / python SCRIPT: {cpu_ratio:.3f}; threads at the "
                        f"loop's end: python SCRIPT {sorted({r['threads'] for r in runs['plain']})}, "
                        f"run {sorted({r['threads'] for r in runs['run']})}")  # fmt: skip


def in_process(report: Report, quick: bool) -> None:
    """The same step in this process with the run's hooks installed and removed step by step: free
    of the between-process noise of a shared machine, and of its drift (10% within seconds here)."""
    import tempfile

    _timing.clean_environment()
    _timing.pin_allocator()
    import torchstep_prof as tsp
    from torchstep_prof.selection.frames import current_frame
    from torchstep_prof.zero_code.boundaries import StepDriver

    mlp_step = make_step()
    with tempfile.TemporaryDirectory() as scratch, tsp.configure(save_path=scratch, summary=False, discrete=False), \
            tsp.schedule(steps=[100000]):  # fmt: skip
        driver = StepDriver(current_frame())
        bare = _timing.loop("step()", 1, {"step": mlp_step})

        def with_hooks() -> float:
            driver.install()
            try:
                return bare()
            finally:
                driver.close()

        samplers = {"bare": bare, "run": with_hooks, "bare again": bare}  # the last: the noise floor
        samples = _timing.interleave(samplers, rounds=100 if quick else 600)
    from torchstep_prof.summary.records import STORE

    STORE.clear()  # close() noted that no step was profiled: not this bench's summary
    report.add(stat("in process: training step, no hooks", samples["bare"]))
    report.add(stat("in process: training step, run's hooks installed", samples["run"]))
    report.add(ratio_stat("in process: no hooks / no hooks (noise floor)", samples["bare"], samples["bare again"]))
    report.targets.append(
        ratio_target("run_hooks_in_process", samples["bare"], samples["run"], LIMIT,
                     "the same step with and without run's optimizer hooks, one process")  # fmt: skip
    )


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        _timing.main(run)
