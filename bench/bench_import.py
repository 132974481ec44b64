"""What ``import torchstep_prof`` adds to ``import torch`` (docs/performance.md: under 50 ms).

The package loads its public names on first use (PEP 562), so a bare ``import torchstep_prof``
only moves the cost to the first ``tsp.profile_region``. The target therefore times the import
*and* the first lookup of the names training code uses (``schedule``, ``ranks``, ``contents``,
``on_finish``, ``configure``, ``step``, ``profile_region``, ``profiled``); the bare import and
the import of every name in ``__all__`` (``rich``, ``cattrs``... included) are printed beside it.

Fresh interpreters, alternating: one imports torch then torchstep_prof and times the second
step with ``time.perf_counter`` inside the child (the target); the other imports only torch.
The difference of the two children's whole run times (as the parent sees them) is printed as a
cross-check, noisier since it carries all of torch's import time. One more child runs with
``-X importtime`` to name the slowest modules the package import pulls in.
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
from _timing import ROOT, Report, Stat, Target, stat  # noqa: E402

LIMIT_MS = 50.0

TRAINING_NAMES = ("schedule", "ranks", "contents", "on_finish", "configure", "step", "profile_region", "profiled")

_WITH_PACKAGE = f"""
import json, time
TRAINING_NAMES = {TRAINING_NAMES!r}
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import torchstep_prof as tsp
t2 = time.perf_counter()
for name in TRAINING_NAMES:
    getattr(tsp, name)
t3 = time.perf_counter()
for name in tsp.__all__:
    getattr(tsp, name)
t4 = time.perf_counter()
print(json.dumps(dict(torch=t1 - t0, bare=t2 - t1, package=t3 - t1, all=t4 - t1)))
"""

_TORCH_ONLY = """
import json, time
t0 = time.perf_counter()
import torch
print(json.dumps({"torch": time.perf_counter() - t0}))
"""

_IMPORTTIME = f"""
import sys
TRAINING_NAMES = {TRAINING_NAMES!r}
import torch
sys.stderr.write("--- torchstep_prof ---\\n")
sys.stderr.flush()
import torchstep_prof as tsp
for name in TRAINING_NAMES:
    getattr(tsp, name)
"""


def _child_env(write_bytecode: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    # An installed package has its .pyc files: the first child writes any missing ones (even where
    # the caller's environment says not to), and the timed children only read them.
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _child(code: str, *flags: str, write_bytecode: bool = False) -> tuple[float, dict, str]:
    t0 = time.perf_counter()
    env = _child_env(write_bytecode)
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=120)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads(done.stdout.strip().splitlines()[-1]) if "-X" not in flags else {}
    return wall, data, done.stderr


def _slowest_modules(stderr: str, count: int = 6) -> tuple[float, list[tuple[str, float]]]:
    """(cumulative ms of everything imported after the marker, the ``count`` modules with the
    largest self time)."""
    after = stderr.split("--- torchstep_prof ---", 1)[-1]
    rows = []
    total = 0.0
    for text in after.splitlines():
        if not text.startswith("import time:") or "|" not in text:
            continue
        parts = [p.strip() for p in text[len("import time:") :].split("|")]
        try:
            self_us, cumulative_us = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        raw = text.split("|", 2)[2]
        rows.append((raw.strip(), self_us / 1000))
        if len(raw) - len(raw.lstrip()) == 1:  # a top-level import (nested ones are indented)
            total += cumulative_us / 1000
    rows.sort(key=lambda r: -r[1])
    return total, rows[:count]


def run(quick: bool = False) -> Report:
    count = 1 if _timing.SMOKE else 3 if quick else 7
    report = Report("bench_import")
    _child(_WITH_PACKAGE, write_bytecode=True)  # the OS file cache filled, and any missing .pyc written, before timing
    with_pkg_wall, torch_wall, package_s, torch_in_child, bare_s, all_s = [], [], [], [], [], []
    for index in range(count):
        order = (_WITH_PACKAGE, _TORCH_ONLY) if index % 2 == 0 else (_TORCH_ONLY, _WITH_PACKAGE)
        for code in order:
            wall, data, _ = _child(code)
            if code is _WITH_PACKAGE:
                with_pkg_wall.append(wall)
                package_s.append(data["package"])
                bare_s.append(data["bare"])
                all_s.append(data["all"])
                torch_in_child.append(data["torch"])
            else:
                torch_wall.append(wall)
    report.add(stat("import torch (in child)", torch_in_child))
    report.add(stat("bare `import torchstep_prof` after torch", bare_s, note="lazy: names load on first use"))
    report.add(stat("import + first use of the training names", package_s, note="the target"))
    report.add(stat("import + every name in __all__", all_s, note="info (CLI/config helpers too)"))
    report.add(stat("child run: torch only", torch_wall))
    report.add(stat("child run: torch + torchstep_prof", with_pkg_wall))
    added_wall = statistics.median(with_pkg_wall) - statistics.median(torch_wall)
    diffs = [a - b for a, b in zip(with_pkg_wall, torch_wall)]
    report.add(Stat("difference of child run medians", added_wall, min(diffs), max(diffs), len(diffs), "s", "cross-check (min/max: per pair)"))
    ms = [s * 1000 for s in package_s]
    report.targets.append(Target("import_added_ms", statistics.median(ms), min(ms), max(ms), LIMIT_MS, "ms", "import torchstep_prof + first use of the training names, after import torch"))
    _, _, stderr = _child(_IMPORTTIME, "-X", "importtime")
    total, slowest = _slowest_modules(stderr)
    report.notes.append(f"-X importtime (import + training names): {total:.1f} ms in all; largest self times: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in slowest))
    report.notes.append(f"median of {count} fresh interpreters of each kind, alternating")
    return report


if __name__ == "__main__":
    _timing.main(run)
