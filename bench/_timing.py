"""Shared helpers of the bench scripts: side-by-side timing, results as data, the printed table.

Every target is a ratio taken side by side in one process: each round times the baseline and the
candidate back to back (alternating which goes first), over many rounds, and the ratio is the
ratio of the two medians. The min/max printed next to it are those of the per-round ratios, so
the noise of a shared machine is visible instead of hidden in one number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import timeit
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

# Before the first profiler use in the process: no Kineto USDT lines on stderr.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
# The CPU torch wheel does not bring NumPy and says so once per process: noise in every table.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

SMOKE = False
"""Set by ``--smoke`` (the CI's bench smoke, ``make bench-smoke``): the run only has to reach its
table, so a script whose ``--quick`` sizes still take long (bench_scale's 2,000 traces) reads this
and shrinks them further; :func:`loop` and :func:`interleave` take fewer samples for every script.
Its timings mean nothing."""

# Variables that would change what regions do (the environment's config layer, the rank).
ENGINE_VARIABLES = (
    "TORCHSTEP_PROF_CONFIG",
    "TORCHSTEP_PROF_OVERRIDES",
    "TORCHSTEP_PROF_SUMMARY",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)


def clean_environment() -> None:
    """Drop the variables that would make the package profile something the bench did not ask for."""
    for name in ENGINE_VARIABLES:
        os.environ.pop(name, None)


# glibc's allocator, fixed: the 128 KiB tensors of a training step then come from the heap, and
# the heap's top is not given back to the system between steps. Left dynamic, both thresholds
# move with what the process freed before its loop (any import does): the same script, the
# same command, had 1 to 380 page faults a step (up to 0.7 ms of system time on a 4 ms step).
# The mmap threshold alone does not do it: freeing a step's tensors trims the heap's top (the
# trim threshold is 128 KiB once the mmap one is set), and the next step faults it back in.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(16 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def pin_allocator() -> None:
    """:data:`ALLOCATOR_ENV` in this process, from now on (``mallopt``; glibc only, else nothing)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    libc.mallopt(m_mmap_threshold, int(ALLOCATOR_ENV["MALLOC_MMAP_THRESHOLD_"]))
    libc.mallopt(m_trim_threshold, int(ALLOCATOR_ENV["MALLOC_TRIM_THRESHOLD_"]))


# --- results as data ------------------------------------------------------------------------


@dataclasses.dataclass
class Stat:
    """One measured quantity over repeated samples (seconds, bytes or a plain number)."""

    name: str
    median: float
    min: float
    max: float
    n: int
    unit: str = "s"  # "s", "B" or "" (a plain number, a ratio)
    note: str = ""


@dataclasses.dataclass
class Target:
    """A target of docs/performance.md: ``value <= limit`` passes.

    For ratios, ``value`` is the ratio of the medians and ``lo`` / ``hi`` the smallest and largest
    per-round ratio; for absolute targets (``unit`` "ms"), the min/max of the samples.
    """

    name: str
    value: float
    lo: float
    hi: float
    limit: float
    unit: str = "x"
    what: str = ""

    @property
    def passed(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict} {self.name} {self.value:.3g} (target <= {self.limit:g}{'' if self.unit == 'x' else ' ' + self.unit})"


@dataclasses.dataclass
class Report:
    bench: str
    stats: List[Stat] = dataclasses.field(default_factory=list)
    targets: List[Target] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0

    def add(self, stat: Stat) -> Stat:
        self.stats.append(stat)
        return stat

    def to_dict(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        for target, item in zip(self.targets, data["targets"]):
            item["passed"] = target.passed
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        targets = [Target(**{k: v for k, v in t.items() if k != "passed"}) for t in data["targets"]]
        return cls(
            bench=data["bench"],
            stats=[Stat(**s) for s in data["stats"]],
            targets=targets,
            notes=list(data["notes"]),
            wall_s=data["wall_s"],
        )


def stat(name: str, samples: Sequence[float], unit: str = "s", note: str = "") -> Stat:
    return Stat(name, statistics.median(samples), min(samples), max(samples), len(samples), unit, note)


def ratio_target(
    name: str, baseline: Sequence[float], candidate: Sequence[float], limit: float, what: str = ""
) -> Target:
    """``median(candidate) / median(baseline)``; lo/hi are the extreme per-round ratios (the
    samples are paired: sample i of each was taken in the same round)."""
    paired = [c / b for b, c in zip(baseline, candidate) if b > 0]
    return Target(
        name,
        statistics.median(candidate) / statistics.median(baseline),
        min(paired),
        max(paired),
        limit,
        "x",
        what,
    )


def ratio_stat(name: str, baseline: Sequence[float], candidate: Sequence[float], note: str = "") -> Stat:
    """An informative ratio (no target), in the same form as :func:`ratio_target`."""
    paired = [c / b for b, c in zip(baseline, candidate) if b > 0]
    return Stat(name, statistics.median(candidate) / statistics.median(baseline), min(paired), max(paired), len(paired), "", note)


# --- timing ---------------------------------------------------------------------------------


def loop(stmt: str, number: int, namespace: Dict[str, Any], setup: str = "pass") -> Callable[[], float]:
    """A sampler: seconds per execution of ``stmt``, timed over a ``timeit`` loop of ``number``.

    ``timeit`` inlines the statement in a compiled loop (15 ns an iteration here) and switches
    the garbage collector off while it runs.
    """
    timer = timeit.Timer(stmt, setup, globals=namespace)
    if SMOKE:
        number = max(1, number // 20)

    def sample() -> float:
        return timer.timeit(number) / number

    return sample


def interleave(samplers: Mapping[str, Callable[[], float]], rounds: int, warmup: int = 2) -> Dict[str, List[float]]:
    """Take one sample of every sampler per round, alternating the order round by round (a
    round goes a, b, c; the next c, b, a), so slow drifts of a shared machine hit all alike.

    ``warmup`` rounds run first and are thrown away.
    """
    if SMOKE:  # two rounds: every per-round ratio and min/max still has its samples
        rounds, warmup = min(rounds, 2), min(warmup, 1)
    names = list(samplers)
    results: Dict[str, List[float]] = {name: [] for name in names}
    for index in range(warmup + rounds):
        order = names if index % 2 == 0 else names[::-1]
        taken = {name: samplers[name]() for name in order}
        if index >= warmup:
            for name in names:
                results[name].append(taken[name])
    return results


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# --- printing -------------------------------------------------------------------------------


def fmt(value: float, unit: str) -> str:
    if unit == "s":
        if abs(value) < 1e-6:
            return f"{value * 1e9:.0f} ns"
        if abs(value) < 1e-3:
            return f"{value * 1e6:.2f} us"
        if abs(value) < 1.0:
            return f"{value * 1e3:.2f} ms"
        return f"{value:.3f} s"
    if unit == "B":
        if abs(value) >= 1 << 20:
            return f"{value / (1 << 20):.1f} MiB"
        if abs(value) >= 1 << 10:
            return f"{value / (1 << 10):.1f} KiB"
        return f"{value:.0f} B"
    if unit == "ms":
        return f"{value:.1f} ms"
    return f"{value:.3g}"


def print_report(report: Report, file: Any = None) -> None:
    out = file or sys.stdout
    rows = [(s.name, fmt(s.median, s.unit), fmt(s.min, s.unit), fmt(s.max, s.unit), str(s.n), s.note) for s in report.stats]
    rows += [
        (
            f"[target] {t.name}",
            fmt(t.value, t.unit),
            fmt(t.lo, t.unit),
            fmt(t.hi, t.unit),
            "",
            f"{t.what} (target <= {t.limit:g}{'' if t.unit == 'x' else ' ' + t.unit})",
        )
        for t in report.targets
    ]
    header = ("measurement", "median", "min", "max", "n", "")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(5)]
    print(f"== {report.bench} ({report.wall_s:.1f} s)", file=out)
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header[:5], widths)))
    print(line, file=out)
    print("-" * len(line), file=out)
    for row in rows:
        cells = "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row[:5], widths)))
        print(f"{cells}  {row[5]}".rstrip(), file=out)
    for note in report.notes:
        print(f"note: {note}", file=out)
    for target in report.targets:
        print(target.line(), file=out)
    out.flush()


def main(run: Callable[..., Report], argv: Optional[Sequence[str]] = None) -> Report:
    """The command line of every bench script: print the table; ``--json-out FILE`` also writes
    the results as data (what ``run_all.py`` collects); ``--quick`` takes fewer samples; ``--smoke``
    is ``--quick`` with the smallest sizes (see :data:`SMOKE`)."""
    global SMOKE
    parser = argparse.ArgumentParser(description=(run.__module__ or "").split(".")[-1])
    parser.add_argument("--json-out", help="also write the results as JSON to this file")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--smoke", action="store_true", help="--quick with the smallest sizes: it runs, timings mean nothing")
    args = parser.parse_args(argv)
    SMOKE = args.smoke
    t0 = time.perf_counter()
    report = run(quick=args.quick or args.smoke)
    report.wall_s = time.perf_counter() - t0
    print_report(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report.to_dict(), indent=1))
    return report


# --- the workload shared by several scripts -----------------------------------------------------


def make_mlp_step(width: int = 256, batch: int = 64, layers: int = 3, optimizer: bool = True) -> Callable[[], None]:
    """A small MLP training step: forward, backward, SGD update (one torch thread, so that two
    cores shared with other work give steadier numbers; both sides of every ratio run it alike).

    ``optimizer=False`` updates the weights by hand instead of with ``torch.optim.SGD``: making a
    ``torch.optim`` optimizer imports ``torch._dynamo`` and with it ``torch._inductor`` (~1 s),
    the very import that makes torch's first profiler start slow, so a process with an optimizer
    has paid that stall before its loop starts.
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    modules: List[Any] = []
    for index in range(layers):
        modules.append(torch.nn.Linear(width, width))
        if index < layers - 1:
            modules.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*modules)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    loss_fn = torch.nn.MSELoss()
    if not optimizer:
        params = list(model.parameters())

        def manual_step() -> None:
            for p in params:
                p.grad = None
            loss = loss_fn(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in params:
                    p.add_(p.grad, alpha=-1e-3)

        return manual_step
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3)

    def mlp_step() -> None:
        sgd.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        sgd.step()

    return mlp_step



# A command-line run in a fresh interpreter: its time inside ``main`` and its peak memory (VmHWM,
# not ru_maxrss: on Linux ru_maxrss keeps the forking parent's peak across exec).
_CLI_CHILD = """
import sys, time
from torchstep_prof.cli import main
t0 = time.perf_counter()
code = main(sys.argv[1:])
seconds = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
sys.stderr.write("BENCH %d %.6f %d\\n" % (code, seconds, hwm * 1024))
"""


def run_cli_measured(*args: str, extra_env: Optional[Mapping[str, str]] = None, timeout: float = 600) -> "tuple[float, int]":
    """Run ``torchstep-prof ARGS`` in a child interpreter; return (seconds in main, peak bytes)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra_env or {})
    done = subprocess.run([sys.executable, "-c", _CLI_CHILD, *args], capture_output=True, text=True, env=env,
                          timeout=timeout)  # fmt: skip
    line = next((ln for ln in done.stderr.splitlines() if ln.startswith("BENCH ")), None)
    if line is None or not line.split()[1] == "0":
        raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    _, _, seconds, peak = line.split()
    return float(seconds), int(peak)


def machine() -> Dict[str, str]:
    """nproc, CPU model, Python and torch versions, date (for RESULTS.md)."""
    import platform

    cpu = "unknown"
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                cpu = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover
        torch_version = "not installed"
    return {
        "nproc": str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch_version,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
