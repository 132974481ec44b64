"""The command line over a realistic folder: ``summarize`` and ``merge`` of 16 traces of 20 MLP
steps each (~1 MB of JSON per file), in time and peak memory, versus plain ``json.load`` of the
same 16 files.

The traces are real torch.profiler traces written by the engine: 4 steps x 4 ranks (the rank is
faked through ``RANK`` / ``WORLD_SIZE`` between regions), ``tsp.profile_region(..., step=n)``
around 20 MLP steps.

Time (interleaved rounds, in this process): what ``torchstep-prof summarize DIR`` does before
rendering (``scan_traces(DIR, top=5)`` then ``summarize``), what ``merge DIR -o OUT`` does
(``scan_traces`` then ``merge_traces`` to a temporary file), and ``json.load`` of each file in
turn. Ratios are information.

Memory (fresh interpreters, one per measurement): the peak RSS growth during the operation
(``/proc/self/clear_refs`` resets the high-water mark after the imports) and the tracemalloc
peak, in separate children. Target (tracemalloc: what the code holds, not what the allocator
keeps): ``summarize`` holds one file at a time, so over 16 files it peaks within 1.5x of
``summarize`` of the largest file alone (holding all 16 would be ~16x). The same ratio in RSS is
printed beside the one of plain ``json.load`` (16 files one by one vs the largest), which shows
how much RSS the allocator keeps from file to file on its own. The ``summarize`` peak against
plain ``json.load`` of the largest file is printed as information: the loader is orjson when
installed, whose parser holds a transient buffer several times the size of the file
while it parses (tracemalloc sees it), so that ratio measures the parser, not accumulation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import ROOT, Report, interleave, ratio_stat, ratio_target, stat  # noqa: E402

MEMORY_LIMIT = 1.5
RANKS = 4
STEPS = 4
WINDOW_STEPS = 20
OPS = ("json_load_largest", "json_load_all", "summarize_largest", "summarize", "merge")


# --- the operations (also run in the children) ------------------------------------------------


def _files(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("*.json"))


def op_json_load_all(folder: str) -> None:
    for path in _files(folder):
        with open(path) as handle:
            json.load(handle)


def op_json_load_largest(folder: str) -> None:
    with open(_largest(folder)) as handle:
        json.load(handle)


def _largest(folder: str) -> str:
    return max(_files(folder), key=os.path.getsize)


def op_summarize_largest(folder: str) -> None:
    from torchstep_prof.traces.analysis.summarize import summarize
    from torchstep_prof.traces.reading.files import scan_traces

    summarize(*scan_traces([_largest(folder)], top=5))


def op_summarize(folder: str) -> None:
    from torchstep_prof.traces.analysis.summarize import summarize
    from torchstep_prof.traces.reading.files import scan_traces

    infos, unreadable = scan_traces(folder, top=5)
    summary = summarize(infos, unreadable)
    if len(summary.groups) != STEPS or unreadable:
        raise RuntimeError(f"summarize found {len(summary.groups)} groups, {len(unreadable)} unreadable")


def op_merge(folder: str, out: str | None = None) -> None:
    from torchstep_prof.traces.analysis.merge import merge_traces
    from torchstep_prof.traces.reading.files import scan_traces

    infos, _ = scan_traces(folder)
    out = out or os.path.join(tempfile.gettempdir(), f"tsp-bench-merged-{os.getpid()}.json")
    try:
        merge_traces(infos, out)
    finally:
        if os.path.exists(out):
            os.unlink(out)


def _op(name: str):  # type: ignore[no-untyped-def]
    return globals()[f"op_{name}"]


# --- memory, in a fresh child ----------------------------------------------------------------


def _vm(field: str) -> int:
    for text in Path("/proc/self/status").read_text().splitlines():
        if text.startswith(field + ":"):
            return int(text.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(op: str, folder: str, how: str) -> None:
    import gc

    # Import everything the operations use first: the imports are not what is measured.
    import torchstep_prof.traces.analysis.merge  # noqa: F401
    import torchstep_prof.traces.analysis.summarize  # noqa: F401
    import torchstep_prof.traces.reading.files  # noqa: F401

    try:
        import orjson  # noqa: F401
    except ImportError:
        pass
    gc.collect()
    if how == "rss":
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        before = _vm("VmRSS")
        _op(op)(folder)
        peak = _vm("VmHWM") - before
    else:
        import tracemalloc

        tracemalloc.start()
        _op(op)(folder)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(json.dumps({"peak": peak}))


def _child_peak(op: str, folder: str, how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in _timing.ENGINE_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    done = subprocess.run(
        [sys.executable, __file__, "--child", op, folder, how], capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=180
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {op}/{how} failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])


def _rss_supported() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _vm("VmHWM")
        return True
    except (OSError, RuntimeError):
        return False


# --- the traces --------------------------------------------------------------------------------


def make_traces(folder: str) -> None:
    """16 real traces: 4 steps x 4 (faked) ranks, 20 MLP steps each."""
    import torchstep_prof as tsp
    from torchstep_prof.selection.steps import forget_occurrences
    from torchstep_prof.topology import forget_topology

    mlp_step = _timing.make_mlp_step()
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    try:
        with tsp.configure(save_path=folder, summary=False), tsp.contents("cpu"), tsp.ranks(all_ranks=True), tsp.schedule(
            steps=list(range(1, STEPS + 1))
        ):
            for step in range(1, STEPS + 1):
                for rank in range(RANKS):
                    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(RANKS)
                    forget_topology()
                    forget_occurrences()  # each faked rank is a process of its own
                    with tsp.profile_region("actor", "update", step=step):
                        for _ in range(WINDOW_STEPS + rank):  # ranks differ a little, as in life
                            mlp_step()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        forget_topology()


def run(quick: bool = False) -> Report:
    _timing.clean_environment()
    rounds = 3 if quick else 8
    report = Report("bench_cli")
    folder = tempfile.mkdtemp(prefix="tsp-bench-cli-")
    try:
        make_traces(folder)
        files = _files(folder)
        if len(files) != RANKS * STEPS:
            raise RuntimeError(f"expected {RANKS * STEPS} traces, found {len(files)}")
        sizes = [float(os.path.getsize(p)) for p in files]
        report.add(stat(f"trace file size ({len(files)} files)", sizes, unit="B"))

        def timed(name: str):  # type: ignore[no-untyped-def]
            import time

            def sample() -> float:
                t0 = time.perf_counter()
                _op(name)(folder)
                return time.perf_counter() - t0

            return sample

        samples = interleave({name: timed(name) for name in ("json_load_all", "summarize", "merge")}, rounds, warmup=1)
        report.add(stat("json.load of the 16 files, one by one", samples["json_load_all"]))
        report.add(stat("summarize: scan_traces(top=5) + summarize", samples["summarize"]))
        report.add(stat("merge: scan_traces + merge_traces", samples["merge"]))
        report.add(ratio_stat("summarize / json.load all", samples["json_load_all"], samples["summarize"], "info"))
        report.add(ratio_stat("merge / json.load all", samples["json_load_all"], samples["merge"], "info"))

        counts = 1 if quick else 3
        hows = ["tracemalloc"] + (["rss"] if _rss_supported() else [])
        peaks: dict[tuple[str, str], list[float]] = {}
        for index in range(counts):
            for op in OPS if index % 2 == 0 else OPS[::-1]:
                for how in hows:
                    peaks.setdefault((op, how), []).append(float(_child_peak(op, folder, how)))
        labels = {
            "json_load_largest": "json.load of the largest file",
            "json_load_all": "json.load of the 16 files, one by one",
            "summarize_largest": "summarize of the largest file alone",
            "summarize": "summarize of the 16 files",
            "merge": "merge of the 16 files",
        }
        for how in hows:
            for op in OPS:
                report.add(stat(f"peak {'RSS growth' if how == 'rss' else 'tracemalloc'}: {labels[op]}", peaks[(op, how)], unit="B"))
        for how in hows:
            largest = peaks[("json_load_largest", how)]
            report.add(ratio_stat(f"summarize of 16 / json.load of the largest ({how})", largest, peaks[("summarize", how)], "info: the loader's own cost"))
            report.add(ratio_stat(f"merge of 16 / json.load of the largest ({how})", largest, peaks[("merge", how)], "info"))
        if "rss" in hows:
            report.add(ratio_stat("summarize of 16 / of the largest alone (rss)", peaks[("summarize_largest", "rss")], peaks[("summarize", "rss")], "info"))
            report.add(
                ratio_stat("json.load of 16 / of the largest (rss)", peaks[("json_load_largest", "rss")], peaks[("json_load_all", "rss")], "info: allocator retention")
            )
        report.targets.append(
            ratio_target(
                "summarize_memory_one_file_at_a_time",
                peaks[("summarize_largest", "tracemalloc")],
                peaks[("summarize", "tracemalloc")],
                MEMORY_LIMIT,
                "peak tracemalloc: summarize of 16 files vs of the largest file alone",
            )
        )
        report.notes.append(f"time: {rounds} interleaved rounds; memory: {counts} fresh interpreter(s) per operation and method")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return report


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        _timing.main(run)
