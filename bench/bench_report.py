"""``torchstep-prof report`` over 2000 traces: seconds and peak memory, beside ``summarize``.

The folder: one real trace recorded by the engine (an MLP step in ``actor/update``), cloned
into 2000 files as a run of 8 ranks x 5 regions x 50 steps would leave them (metadata, names and
clocks rewritten; rank 3 is 1.5x slower at every 10th step, so the page has findings). Each
command runs in a fresh interpreter, as a person runs it, and reports its own peak RSS.

Printed: the wall time of ``report DIR -o page.html`` and of ``summarize DIR --json`` (the
baseline: the same reading), their ratio, each one's peak RSS, the peak RSS of ``report`` of the
largest file alone (reading one file at a time keeps the 2000-file peak near it), and the page's
size. Information, not a test: docs/performance.md asks for "seconds" on 2000 traces.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, ratio_stat, stat  # noqa: E402

RANKS, STEPS = 8, 50
REGIONS = (("rollout", "generate"), ("actor", "compute_log_prob"), ("ref", "compute_log_prob"),
           ("critic", "update"), ("actor", "update"))  # fmt: skip
SLOW_RANK = 3



def make_template(folder: str) -> dict:
    import torchstep_prof as tsp

    mlp_step = _timing.make_mlp_step()
    with tsp.configure(save_path=folder, summary=False), tsp.contents("cpu"), tsp.schedule(steps=[1]):
        with tsp.profile_region("actor", "update", step=1):
            for _ in range(3):
                mlp_step()
    (path,) = Path(folder).glob("*.json")
    return json.loads(path.read_text())


def make_folder(folder: str, template: dict, step_count: int = STEPS) -> int:
    """2000 clones of ``template`` (40 per step), as an 8-rank run would leave them."""
    from torchstep_prof.naming import TraceName, build_trace_name

    steps = [e for e in template["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    base_ns = int(template["baseTimeNanoseconds"])
    count = 0
    for step in range(1, step_count + 1):
        for index, (role, stage) in enumerate(REGIONS):
            for rank in range(RANKS):
                trace = copy.copy(template)
                slow = rank == SLOW_RANK and step % 10 == 0
                events = []
                for event in template["traceEvents"]:
                    if event in steps:
                        event = dict(event, name=f"ProfilerStep#{step}", dur=event["dur"] * (1.5 if slow else 1.0))
                    events.append(event)
                trace["traceEvents"] = events
                start_ns = base_ns + (step * len(REGIONS) + index) * 200_000_000 + rank * 1_000_000
                trace["baseTimeNanoseconds"] = start_ns
                trace["torchstep_prof"] = dict(template["torchstep_prof"], role=role, stage=stage, step=step,
                                               rank=rank, world_size=RANKS, pid=1000 + rank)  # fmt: skip
                trace["distributedInfo"] = {"rank": rank, "world_size": RANKS}
                name = build_trace_name(
                    TraceName(role=role, stage=stage, step=step, rank=rank, world_size=RANKS, pid=1000 + rank,
                              timestamp=dt.datetime.fromtimestamp(start_ns / 1e9, dt.timezone.utc))  # fmt: skip
                )
                Path(folder, name).write_text(json.dumps(trace))
                count += 1
    return count


def run_cli(*args: str) -> tuple[float, int]:
    return _timing.run_cli_measured(*args)


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    rounds = 1 if quick else 3
    report = Report("bench_report")
    scratch = tempfile.mkdtemp(prefix="tsp-bench-report-")
    try:
        folder = os.path.join(scratch, "profile")
        os.makedirs(folder)
        # --smoke: 200 files (5 steps), enough to run every command to its table.
        steps = 5 if _timing.SMOKE else STEPS
        count = make_folder(folder, make_template(os.path.join(scratch, "template")), steps)
        largest = max(Path(folder).iterdir(), key=lambda p: p.stat().st_size)
        alone = os.path.join(scratch, "alone")
        os.makedirs(alone)
        shutil.copy(largest, alone)
        page = os.path.join(scratch, "report.html")
        times: dict[str, list[float]] = {"report": [], "summarize": []}
        peaks: dict[str, list[float]] = {"report": [], "summarize": [], "report_one": []}
        for index in range(rounds):
            order = ("report", "summarize") if index % 2 == 0 else ("summarize", "report")
            for name in order:
                args = ("report", folder, "-o", page) if name == "report" else ("summarize", folder, "--json")
                seconds, peak = run_cli(*args)
                times[name].append(seconds)
                peaks[name].append(float(peak))
            peaks["report_one"].append(float(run_cli("report", alone, "-o", page + ".one.html")[1]))
        report.add(stat(f"report of {count} traces (the command, interpreter start aside)", times["report"]))
        report.add(stat(f"summarize --json of {count} traces", times["summarize"]))
        report.add(ratio_stat("report / summarize --json", times["summarize"], times["report"], "info"))
        report.add(stat(f"peak RSS: report of {count} traces", peaks["report"], unit="B"))
        report.add(stat(f"peak RSS: summarize --json of {count} traces", peaks["summarize"], unit="B"))
        report.add(stat("peak RSS: report of the largest file alone", peaks["report_one"], unit="B"))
        report.add(ratio_stat(f"peak RSS: report of {count} / of the largest alone", peaks["report_one"], peaks["report"], "info"))
        report.add(stat("page size", [float(os.path.getsize(page))], unit="B"))
        sizes = [float(p.stat().st_size) for p in Path(folder).iterdir()]
        report.add(stat(f"trace file size ({count} files)", sizes, unit="B"))
        report.notes.append(f"{rounds} round(s), each command in a fresh interpreter; seconds are the command's own (main()), interpreter start aside")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


if __name__ == "__main__":
    _timing.main(run)
