"""What the first profiled region costs the training loop (docs/performance.md: torch's one-time
profiler start-up, ~1 s here because it imports ``torch._inductor``, does not land inside the
first profiled step).

Each sample is a fresh interpreter (the cost is once per process). The child warms the MLP step
up unprofiled, then profiles steps 1 and 5 of a 6-step loop (``tsp.step(n)`` around
``tsp.profile_region``) and times every step from before its ``with`` to after it (start, body,
stop and export included). Target: step 1 (the first profiled window of the process) within 1.5x
of step 5 (a later one), ratio of the medians over the children.

The MLP step here updates its weights by hand: a ``torch.optim`` optimizer imports
``torch._inductor`` when it is made, which would pay torch's stall before the loop and hide what
is measured (the child checks that ``torch._inductor`` is not imported before profiling starts).
Processes without an optimizer (a rollout or reference-model role) are the ones exposed to it.

The package loads its public names on first use (PEP 562). The child looks ``tsp.step`` and
``tsp.profile_region`` up before the loop, and prints what that first lookup costs after the
scope is entered: code that touches them first inside step 1 pays that there (it is the import
of a module, once per process, profiled step or not; ``bench_import`` covers import costs).

Two ways of switching profiling on are measured:

* ``scope``: ``tsp.schedule(steps=[1, 5])`` (with ``configure`` / ``contents``) entered before the
  loop, the normal usage. The engine pays torch's start-up as the scope is entered on a rank that
  may profile; that scope-entry time is printed.
* ``env``: no scope in the code, the schedule comes only from ``TORCHSTEP_PROF_OVERRIDES`` (the
  "no code change" path of docs/configuration.md).
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

LIMIT = 1.5
STEPS = 6
PROFILED = (1, 5)


def child(mode: str) -> None:
    """Run in the fresh interpreter: print one JSON line of timings."""
    import contextlib
    import shutil

    import torch  # noqa: F401  (timed apart: the parent's concern is the loop)

    import torchstep_prof as tsp

    folder = os.environ["TSP_BENCH_FOLDER"]
    if mode == "env" and "torch._inductor" in sys.modules:
        # torchstep_prof paid torch.profiler's start-up at import (the environment switched
        # profiling on, torch was imported first): that is the behaviour measured here.
        inductor_at_import = True
    else:
        inductor_at_import = False
    mlp_step = _timing.make_mlp_step(optimizer=False)
    for _ in range(20):
        mlp_step()
    inductor_before = "torch._inductor" in sys.modules and not inductor_at_import
    times = {}
    with contextlib.ExitStack() as scopes:
        t0 = time.perf_counter()
        if mode == "scope":
            scopes.enter_context(tsp.configure(save_path=folder, summary=False))
            scopes.enter_context(tsp.contents("cpu"))
            scopes.enter_context(tsp.schedule(steps=list(PROFILED)))
        scope_entry = time.perf_counter() - t0
        t0 = time.perf_counter()
        _ = tsp.step, tsp.profile_region  # first lookup: loads the module (lazy public API)
        lookup = time.perf_counter() - t0
        for n in range(1, STEPS + 1):
            t0 = time.perf_counter()
            with tsp.step(n):
                with tsp.profile_region("train", "step"):
                    mlp_step()
            times[n] = time.perf_counter() - t0
    # Untimed. In env mode no scope exit waits for the background writer: step 5's trace may
    # still be on its way to disk when the folder is listed.
    tsp.flush()
    written = sorted(p.name for p in Path(folder).iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"scope_entry": scope_entry, "lookup": lookup, "times": times, "written": written, "inductor_before": inductor_before}))


def _run_child(mode: str, folder: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["TSP_BENCH_FOLDER"] = folder
    if mode == "env":
        env["TORCHSTEP_PROF_OVERRIDES"] = f"schedule.steps=[{PROFILED[0]},{PROFILED[1]}] save_path={folder} summary=false contents=[cpu]"
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=180
    )
    if done.returncode != 0:
        raise RuntimeError(f"child ({mode}) failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1])
    if len(data["written"]) != len(PROFILED):
        raise RuntimeError(f"child ({mode}) wrote {data['written']}, expected {len(PROFILED)} traces")
    if data["inductor_before"]:
        raise RuntimeError(f"child ({mode}): torch._inductor was imported before profiling; the stall is not measured")
    return data


def run(quick: bool = False) -> Report:
    import tempfile

    counts = {"scope": 2 if quick else 5, "env": 2 if quick else 3}
    if _timing.SMOKE:  # one child of each mode: each pays a fresh interpreter and torch's start-up
        counts = {"scope": 1, "env": 1}
    report = Report("bench_first_region")
    results: dict[str, list[dict]] = {mode: [] for mode in counts}
    for index in range(max(counts.values())):
        for mode in ("scope", "env") if index % 2 == 0 else ("env", "scope"):
            if len(results[mode]) < counts[mode]:
                results[mode].append(_run_child(mode, tempfile.mkdtemp(prefix=f"tsp-bench-first-{mode}-")))
    for mode, runs in results.items():
        first = [r["times"]["1"] for r in runs]
        later = [r["times"]["5"] for r in runs]
        plain = [statistics.median(r["times"][str(n)] for n in range(1, STEPS + 1) if n not in PROFILED) for r in runs]
        if mode == "scope":
            report.add(stat("scope: entering schedule/configure/contents", [r["scope_entry"] for r in runs], note="pays torch's start-up, outside any step"))
            report.add(stat("scope: first lookup of tsp.step, tsp.profile_region", [r["lookup"] for r in runs], note="lazy API: lands where they are first used"))
        report.add(stat(f"{mode}: first profiled step (step 1)", first))
        report.add(stat(f"{mode}: later profiled step (step 5)", later))
        report.add(stat(f"{mode}: unprofiled step", plain))
        what = {
            "scope": "first vs later profiled step, schedule scope entered before the loop",
            "env": "first vs later profiled step, schedule only from TORCHSTEP_PROF_OVERRIDES",
        }[mode]
        report.targets.append(ratio_target(f"first_profiled_step_{mode}", later, first, LIMIT, what))
    report.notes.append(f"fresh interpreters: {counts['scope']} with a scope, {counts['env']} configured by the environment; min/max: per child")
    return report


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        _timing.main(run)
