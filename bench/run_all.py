"""Run every bench script, each in its own interpreter, and write ``bench/RESULTS.md``.

    python bench/run_all.py            # the full run (about 8-10 minutes on 2 cores, 6 of them
                                       # bench_scale's 20,000 traces)
    python bench/run_all.py --quick    # fewer rounds, a smoke run
    python bench/run_all.py --only bench_export --only bench_import
    python bench/run_all.py --smoke    # CI (`make bench-smoke`): every bench_*.py runs to its table

Prints each script's table as it finishes, then one table of every target. Exits 0 even when a
target fails or a script errors: it reports, it does not gate.

``--smoke`` is the exception, a check rather than a report: it runs every ``bench_*.py`` in this
folder (not only the list below) with the smallest sizes, writes no RESULTS.md (its timings mean
nothing, and a target may fail), and exits 1 when a script crashes, times out or prints no table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import ROOT, Report, fmt  # noqa: E402

BENCH = Path(__file__).resolve().parent
SCRIPTS = (
    "bench_idle_region",
    "bench_metrics_region",
    "bench_nested_range",
    "bench_profiled_step",
    "bench_export",
    "bench_trace_end",
    "bench_import",
    "bench_first_region",
    "bench_warm_up",
    "bench_cli",
    "bench_hook",
    "bench_run",
    "bench_on_demand",
    "bench_auto_trace",
    "bench_stall",
    "bench_scale",
    "bench_timeline",
)
TIMEOUT_S = 150  # per script
# bench_scale: 20,000 traces read twice; bench_run: two children under valgrind (2-3 minutes), then ~2 minutes of timing.
TIMEOUTS_S = {"bench_scale": 600, "bench_run": 600, "bench_stall": 600}
SMOKE_TIMEOUT_S = 240  # per script under --smoke: each takes seconds to ~1 min on 2 busy cores (a hang fails)


def smoke_scripts() -> tuple[str, ...]:
    """Every bench script of the folder, in the full run's order, then any it does not list."""
    found = sorted(path.stem for path in BENCH.glob("bench_*.py"))
    return tuple(name for name in SCRIPTS if name in found) + tuple(name for name in found if name not in SCRIPTS)


def run_script(name: str, quick: bool, smoke: bool = False) -> tuple[Report | None, str, float]:
    """(the script's results or None, its printed output, seconds it took)."""
    flags = ["--smoke"] if smoke else ["--quick"] if quick else []
    timeout = SMOKE_TIMEOUT_S if smoke else TIMEOUTS_S.get(name, TIMEOUT_S)
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory(prefix="tsp-bench-") as scratch:
        out = Path(scratch) / f"{name}.json"
        command = [sys.executable, str(BENCH / f"{name}.py"), "--json-out", str(out)] + flags
        t0 = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return None, text + f"\n{name}: timed out after {timeout} s", time.perf_counter() - t0
        elapsed = time.perf_counter() - t0
        output = done.stdout
        if done.returncode != 0 or not out.exists():
            return None, output + f"\n{name}: exited {done.returncode}\n{done.stderr[-3000:]}", elapsed
        return Report.from_dict(json.loads(out.read_text())), output, elapsed


def _git_state() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "torchstep_prof"], capture_output=True, text=True, cwd=ROOT, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes in torchstep_prof/' if dirty else ''}" if head else "unknown"


def _range(lo: float, hi: float, unit: str) -> str:
    return f"{fmt(lo, unit)} – {fmt(hi, unit)}"


def write_results(reports: list[tuple[str, Report | None, str, float]], path: Path, quick: bool) -> None:
    info = _timing.machine()
    lines = [
        "# Benchmark results",
        "",
        "Written by `python bench/run_all.py` (`make bench`). Every ratio is taken side by side in one",
        "process (or one invocation), interleaving baseline and candidate round by round; *measured*",
        "is the ratio of the medians, *min – max* the extremes of the per-round (or per-child) ratios,",
        "which show the noise of the machine. [docs/performance.md](../docs/performance.md) states the targets.",
        "",
        f"- machine: {info['nproc']} CPU(s), {info['cpu']}",
        f"- Python {info['python']}, torch {info['torch']}",
        f"- date: {info['date']}; code: {_git_state()}{'; --quick run' if quick else ''}",
        "",
        "| target | what | measured | min – max | target | result |",
        "|---|---|---|---|---|---|",
    ]
    for name, report, _, _ in reports:
        if report is None:
            lines.append(f"| {name} | the script failed (see its output) | – | – | – | ERROR |")
            continue
        for t in report.targets:
            limit = f"<= {t.limit:g}{'' if t.unit == 'x' else ' ' + t.unit}"
            lines.append(
                f"| `{t.name}` | {t.what} | {fmt(t.value, t.unit)} | {_range(t.lo, t.hi, t.unit)} | {limit} | "
                f"{'PASS' if t.passed else '**FAIL**'} |"
            )
    lines += ["", "## Each script's table", ""]
    for name, _report, output, elapsed in reports:
        lines += [f"### {name} ({elapsed:.0f} s)", "", "```", output.rstrip(), "```", ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--smoke", action="store_true", help="check every bench_*.py runs to its table (CI); exits 1 if one fails")
    parser.add_argument("--only", action="append", choices=SCRIPTS, help="run only this script (repeatable)")
    parser.add_argument("--results", default=str(BENCH / "RESULTS.md"), help="where to write the markdown (default bench/RESULTS.md)")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(args.only or smoke_scripts())
    t0 = time.perf_counter()
    reports = []
    for name in args.only or SCRIPTS:
        report, output, elapsed = run_script(name, args.quick)
        print(output.rstrip(), flush=True)
        print(flush=True)
        reports.append((name, report, output, elapsed))
    total = time.perf_counter() - t0

    rows = [("target", "measured", "min", "max", "limit", "result")]
    for name, report, _, _ in reports:
        if report is None:
            rows.append((name, "-", "-", "-", "-", "ERROR"))
            continue
        for t in report.targets:
            rows.append((t.name, fmt(t.value, t.unit), fmt(t.lo, t.unit), fmt(t.hi, t.unit), f"<= {t.limit:g}", "PASS" if t.passed else "FAIL"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"== all targets ({total:.0f} s)")
    for index, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if index == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    write_results(reports, Path(args.results), args.quick)
    print(f"wrote {args.results}")
    return 0  # a report, not a gate


def smoke(names: tuple[str, ...] | list[str]) -> int:
    """Run each script with ``--smoke``; 1 when one crashed, timed out or printed no table."""
    t0 = time.perf_counter()
    failed = []
    for name in names:
        report, output, elapsed = run_script(name, quick=True, smoke=True)
        # The table's first line is "== <bench> (<s> s)" (_timing.print_report).
        if report is None or f"== {report.bench} (" not in output:
            failed.append(name)
            print(output.rstrip(), flush=True)
        print(f"bench smoke: {name} {'FAILED' if name in failed else 'ran'} ({elapsed:.0f} s)", flush=True)
    total = time.perf_counter() - t0
    if failed:
        print(f"bench smoke: {len(failed)} of {len(names)} script(s) failed: {', '.join(failed)} ({total:.0f} s)")
        return 1
    print(f"bench smoke: all {len(names)} scripts ran to their tables ({total:.0f} s; timings not checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
