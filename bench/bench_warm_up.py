"""torch.profiler's one-time start-up in a process, and what it consists of (information, no target).

Each sample is a fresh interpreter that imports torch and torchstep_prof, then times what
``warm_up_profiler`` (the throw-away window the engine runs before the first selected step) pays,
in parts:

* ``import torch._inductor``: the first ``torch.profiler`` start imports it (it registers the
  profiler's compile hooks); a process that made a ``torch.optim`` optimizer has paid it already;
* the window itself: Kineto's first start, its first range, stop and export of a tiny trace;
* the whole warm-up as the engine calls it, in a second child with nothing imported before it.

The numbers depend on the machine (its disk cache above all: ``torch._inductor`` is hundreds of
modules) and on how busy its cores are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import ROOT, Report, stat  # noqa: E402

_PARTS = """
import json, sys, time
import torch
import torchstep_prof
from torchstep_prof.recording.warm_up import warm_up_profiler
assert "torch._inductor" not in sys.modules
t0 = time.perf_counter()
import torch._inductor
t1 = time.perf_counter()
warm_up_profiler(("cpu",))
t2 = time.perf_counter()
print(json.dumps({"inductor": t1 - t0, "window": t2 - t1}))
"""

_WHOLE = """
import json, sys, time
import torch
import torchstep_prof
from torchstep_prof.recording.warm_up import warm_up_profiler
assert "torch._inductor" not in sys.modules
t0 = time.perf_counter()
warm_up_profiler(("cpu",))
print(json.dumps({"whole": time.perf_counter() - t0, "modules": len(sys.modules)}))
"""


def _child(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["KINETO_LOG_LEVEL"] = "6"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> Report:
    count = 1 if _timing.SMOKE else 3 if quick else 5
    report = Report("bench_warm_up")
    _child(_WHOLE)  # fill the OS file cache (and any missing .pyc) before timing
    inductor, window, whole = [], [], []
    started = time.perf_counter()
    for _ in range(count):
        parts = _child(_PARTS)
        inductor.append(parts["inductor"])
        window.append(parts["window"])
        whole.append(_child(_WHOLE)["whole"])
    report.add(stat("whole warm-up (as the engine runs it)", whole, note="once per process"))
    report.add(stat("  import torch._inductor", inductor, note="skipped when an optimizer imported it"))
    report.add(stat("  the throw-away window (start, range, stop, export)", window))
    report.notes.append(f"{count} fresh interpreters of each kind, alternating ({time.perf_counter() - started:.0f} s)")
    return report


if __name__ == "__main__":
    _timing.main(run)
