"""``summarize`` and ``report`` of 20,000 traces: several processes, and the per-file cache.

The folder: one real trace recorded by the engine (a ``trainer/forward`` region of three small MLP
training steps, ~110 KB; real regions are often MBs), cloned into 20,000 files (2,000 with ``--quick``, 100 with ``--smoke``) as a run of 8 ranks x 5 regions would
leave them (metadata, names and clocks rewritten). Each command runs in a fresh interpreter, as a
person runs it, with a cache folder of its own (``TORCHSTEP_PROF_CACHE_DIR``).

Printed side by side, in one run: ``summarize --json`` of 2,000 of the files with ``--jobs 1``
and ``--jobs N`` (N: the cores), no cache; of every file with the cache cold (the first run,
which reads every file and writes the cache) and warm (the second, which reads no trace);
``report`` with no cache and warm. Target: a warm run takes at
most 0.1x the cold one (10x faster), for both commands. The ``--jobs`` ratio is information (it
depends on the cores; on 2 busy cores it is small). Peak RSS of each command is printed too
(workers hold one file at a time each).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, ratio_stat, ratio_target, stat  # noqa: E402

RANKS = 8
REGIONS = (("rollout", "generate"), ("actor", "compute_log_prob"), ("ref", "compute_log_prob"),
           ("critic", "update"), ("actor", "update"))  # fmt: skip
WARM_LIMIT = 0.1
JOBS_FILES = 2000
TEMPLATE_STEPS = 3  # MLP steps in the cloned trace (~110 KB, as bench_report's): a small region



def make_template(folder: str) -> dict:
    import torchstep_prof as tsp

    mlp_step = _timing.make_mlp_step(optimizer=False)
    with tsp.configure(save_path=folder, summary=False), tsp.contents("cpu"), tsp.schedule(steps=[1]):
        with tsp.profile_region("trainer", "forward", step=1):
            for _ in range(TEMPLATE_STEPS):
                mlp_step()
    (path,) = Path(folder).glob("*.json")
    return json.loads(path.read_text())


def make_folder(folder: str, template: dict, files: int) -> int:
    from torchstep_prof.naming import TraceName, build_trace_name

    base_ns = int(template["baseTimeNanoseconds"])
    events = template["traceEvents"]
    count = 0
    step = 0
    while count < files:
        step += 1
        for index, (role, stage) in enumerate(REGIONS):
            for rank in range(RANKS):
                start_ns = base_ns + (step * len(REGIONS) + index) * 200_000_000 + rank * 1_000_000
                trace = dict(template, traceEvents=[
                    dict(e, name=f"ProfilerStep#{step}") if str(e.get("name", "")).startswith("ProfilerStep#") else e
                    for e in events
                ])  # fmt: skip
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
                if count == files:
                    return count
    return count


def run_cli(cache: str, *args: str) -> tuple[float, int]:
    return _timing.run_cli_measured(*args, extra_env={"TORCHSTEP_PROF_CACHE_DIR": cache}, timeout=900)


def run(quick: bool = False) -> Report:
    from torchstep_prof.traces.reading.parallel import default_jobs

    _timing.clean_environment()
    files = 100 if _timing.SMOKE else 2000 if quick else 20000  # --smoke: it runs, that is all
    jobs = default_jobs()
    report = Report("bench_scale")
    scratch = tempfile.mkdtemp(prefix="tsp-bench-scale-")
    try:
        folder = os.path.join(scratch, "profile")
        os.makedirs(folder)
        count = make_folder(folder, make_template(os.path.join(scratch, "template")), files)
        page = os.path.join(scratch, "report.html")
        # --jobs 1 vs N on 2,000 of the files (hard links): the ratio does not need 20,000.
        jobs_folder = os.path.join(scratch, "jobs")
        os.makedirs(jobs_folder)
        for path in sorted(Path(folder).iterdir())[:JOBS_FILES]:
            os.link(path, os.path.join(jobs_folder, path.name))
        jobs_count = min(count, JOBS_FILES)
        summarize = ("summarize", folder, "--json")
        times: dict[str, float] = {}
        peaks: dict[str, float] = {}
        # summarize --json and report read as many operators per trace: report's warm run reads
        # the cache summarize's cold run wrote ("report, cache cold" reads every file, no cache).
        runs = {
            f"summarize --jobs 1, no cache ({jobs_count} traces)": ("none", ("summarize", jobs_folder, "--json", "--jobs", "1", "--no-cache")),
            f"summarize --jobs {jobs}, no cache ({jobs_count} traces)": ("none", ("summarize", jobs_folder, "--json", "--jobs", str(jobs), "--no-cache")),
            f"summarize, cache cold ({count} traces)": ("c", (*summarize, "--jobs", str(jobs))),
            f"summarize, cache warm ({count} traces)": ("c", summarize),
            f"report, cache cold ({count} traces)": ("none", ("report", folder, "-o", page, "--no-cache")),
            f"report, cache warm ({count} traces)": ("c", ("report", folder, "-o", page)),
        }  # fmt: skip
        for name, (cache, args) in runs.items():
            times[name], peaks[name] = run_cli(os.path.join(scratch, f"cache-{cache}"), *args)
            report.add(stat(name, [times[name]]))
        report.add(ratio_stat(f"summarize --jobs {jobs} / --jobs 1 ({jobs_count} traces)",
                              [times[f"summarize --jobs 1, no cache ({jobs_count} traces)"]],
                              [times[f"summarize --jobs {jobs}, no cache ({jobs_count} traces)"]], "info"))  # fmt: skip
        for command in ("summarize", "report"):
            report.targets.append(
                ratio_target(f"{command} of {count} traces, cache warm / cold", [times[f"{command}, cache cold ({count} traces)"]],
                             [times[f"{command}, cache warm ({count} traces)"]], WARM_LIMIT, "a second run is >= 10x faster")  # fmt: skip
            )
        for name, peak in peaks.items():
            report.add(stat(f"peak RSS: {name}", [peak], unit="B"))
        sizes = [float(p.stat().st_size) for p in Path(folder).iterdir()]
        report.add(stat(f"trace file size ({count} files)", sizes, unit="B"))
        report.notes.append(f"one round; {jobs} core(s); seconds are the command's own (main()), interpreter start aside")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


if __name__ == "__main__":
    _timing.main(run)
