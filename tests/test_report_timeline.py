"""The job's span files in ``report`` (a Gantt of every process per step) and in ``merge`` (one clock).

A real torchrun job (2 gloo ranks, actor and ref in each, rank 1's ref 0.4 s slower) writes its
traces to a folder and its span files to ``spans/`` under it. Rank 1 is then moved to a node
whose clock is 2 s ahead: its span file's times and its traces' base times +2 s, its host
renamed (as tests/test_timeline.py does). The report is opened in headless Chromium; the merged
trace is read back as JSON.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from browser import probe_page
from dist_helpers import WORKERS, run_torchrun

plotly = pytest.importorskip("plotly", reason="plotly is not installed (the [report] extra)")

ROOT = Path(__file__).resolve().parents[1]
SHIFT_S = 2.0
FAST, SLOW = "actor+ref rank 0", "actor+ref rank 1"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torchstep_prof", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The job's folder: traces of steps 1-3, span files of steps 0-3 in ``spans/``."""
    folder = tmp_path_factory.mktemp("job")
    out = folder / "out"  # traces of steps 1-3 in OUT, span files in OUT/spans
    arguments = [str(out / "spans"), "4", "1", "0.4", str(out), "1", "2", "3"]
    run_torchrun(WORKERS / "timeline_worker.py", 2, arguments, log_dir=folder).check()
    return folder / "out"


@pytest.fixture(scope="module")
def shifted(job, tmp_path_factory) -> Path:
    """The job with rank 1 on a node whose clock is 2 s ahead (its spans and its traces)."""
    folder = tmp_path_factory.mktemp("shifted") / "out"
    shutil.copytree(job, folder)
    spans = folder / "spans"
    rank1 = next(p for p in spans.iterdir() if json.loads(p.read_text().splitlines()[0])["rank"] == 1)
    lines = []
    for line in rank1.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "process":
            record["host"] = "node-b"
        for key in ("spans", "steps", "anchors"):
            for item in record.get(key, ()):
                item[-2] += SHIFT_S
                item[-1] += SHIFT_S
        lines.append(json.dumps(record))
    rank1.write_text("\n".join(lines) + "\n")
    for trace in folder.glob("*rank1-of-2*.json"):
        data = json.loads(trace.read_text())
        data["baseTimeNanoseconds"] += int(SHIFT_S * 1e9)
        trace.write_text(json.dumps(data))
    return folder


def figures(page: Path) -> list[dict]:
    match = re.search(r'<script type="application/json" id="tsp-figures">(.*?)</script>', page.read_text(), re.S)
    assert match
    return json.loads(match[1])


def test_the_report_draws_every_process_per_step_with_what_each_idle_gap_waited_for(shifted, tmp_path):
    page = tmp_path / "report.html"
    done = cli("report", str(shifted), "-o", str(page))  # the spans are found in DIR/spans
    assert done.returncode == 0, done.stderr
    assert f"the timeline of 2 process(es) from {shifted / 'spans'}" in done.stdout
    assert "another job" not in done.stderr and 'class="warning"' not in page.read_text()
    host = socket.gethostname()
    fast, slow = f"{FAST}@{host}", f"{SLOW}@node-b"
    html = page.read_text()
    verdicts = re.findall(r"<li>(step \d+: [^<]*)</li>", html)
    assert len(verdicts) == 4
    # Regions are named as the page's tables name them (the trace names' labels).
    assert all("waiting for ref/compute-log-prob" in v for v in verdicts[1:]), verdicts
    assert "compute_log_prob" not in html
    assert "the 3 slowest steps of 4" in html

    probe = probe_page(page)
    assert probe["errors"] == []
    assert probe["drawn"] == len(probe["charts"])
    gantts = [c for c in probe["charts"] if c["kind"] == "gantt"]
    assert len(gantts) == 3
    assert len({c["card"] for c in gantts} - {"timeline-step-0"}) >= 2
    specs = figures(page)
    for chart in gantts:
        spec = specs[chart["fig"]]
        assert spec["layout"]["yaxis"]["categoryarray"] == sorted([fast, slow], reverse=True)  # one row each
        drawn = chart["text"]
        assert fast in drawn and slow in drawn
        if chart["card"] == "timeline-step-0":
            continue  # step 0 holds the ranks' start-up skew
        # The fast rank's wait for the slow rank's ref, labelled on its gap, as drawn.
        assert f"idle: waited for ref/compute-log-prob on {slow}" in drawn
        assert chart["bars"] >= 7  # 3 regions per rank and at least the labelled gap
        idle = next(t for t in spec["data"] if t["name"] == "idle")
        waits = [x for x, y, text in zip(idle["x"], idle["y"], idle["text"]) if "waited for ref" in text and y == fast]
        assert waits and 300 < max(waits) < 600  # ms: the 0.4 s extra, not the 2 s shift
        path = next(t for t in spec["data"] if t["name"] == "critical path")
        assert slow in path["y"] and "ref/compute-log-prob" in json.dumps(path["customdata"])
    assert re.search(r"critical path: [^<]*ref/compute-log-prob \(actor\+ref rank 1@node-b", html)


def test_without_span_files_the_report_has_no_timeline(job, tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(job, traces, ignore=shutil.ignore_patterns("spans"))
    page = tmp_path / "report.html"
    done = cli("report", str(traces), "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert "timeline" not in done.stdout
    assert 'id="timeline"' not in page.read_text()
    assert not any(f["layout"].get("uniformtext") for f in figures(page))
    missing = cli("report", str(traces), "-o", str(page), "--spans", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert "--spans" in missing.stderr and "not a folder" in missing.stderr


def test_span_labels_are_named_as_traces_name_them_and_hosts_are_escaped_on_the_page(shifted, tmp_path):
    folder = tmp_path / "out"
    shutil.copytree(shifted, folder)
    spans = folder / "spans"
    rank1 = next(p for p in spans.iterdir() if json.loads(p.read_text().splitlines()[0])["rank"] == 1)
    hostile = "<img src=x onerror=alert(1)>\x1b[31m"
    text = rank1.read_text().replace('"ref", "compute_log_prob"', json.dumps("ref") + ", " + json.dumps(hostile))
    text = text.replace('"host": "node-b"', '"host": ' + json.dumps(hostile))
    assert hostile not in text and json.dumps(hostile)[1:-1] in text
    rank1.write_text(text)  # the slow rank's slow region: on the critical path
    page = tmp_path / "report.html"
    assert cli("report", str(folder), "-o", str(page)).returncode == 0
    html = page.read_text()
    assert "<img src=x" not in html and "\x1b" not in html
    # The region as a trace file would name it; the host (a process's name) escaped as text.
    assert "ref/img-src=x-onerror=alert-1-31m (actor+ref rank 1@&lt;img src=x onerror=alert(1)&gt;\\x1b[31m" in html
    probe = probe_page(page)
    assert probe["errors"] == []
    drawn = " ".join(c["text"] for c in probe["charts"] if c["kind"] == "gantt")
    assert "ref/img-src=x-onerror=alert-1-31m" in drawn
    assert "actor+ref rank 1@<img src=x onerror=alert(1)>\\x1b[31m" in drawn  # a row's name, shown as text


def test_span_files_of_another_job_are_warned_about_above_their_gantt(job, tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(job, traces, ignore=shutil.ignore_patterns("spans"))
    other = tmp_path / "other"
    other.mkdir()
    for span_file in (job / "spans").iterdir():  # the same job's shape, other processes
        header, rest = span_file.read_text().split("\n", 1)
        record = json.loads(header)
        record["pid"] += 100000
        (other / f"spans-other-{record['pid']}.jsonl").write_text(json.dumps(record) + "\n" + rest)
    warning = f"the span files in {other} are of another job: no trace's process is in them"
    page = tmp_path / "report.html"
    done = cli("report", str(traces), "-o", str(page), "--spans", str(other))
    assert done.returncode == 0, done.stderr
    assert f"warning: {warning} (the traces' pids: " in done.stderr
    html = page.read_text()
    section = html[html.index('<section id="timeline">') :]
    shown = section.index('<p class="warning">Warning: ' + warning.replace("'", "&#x27;"))
    assert shown < section.index('class="card gantt"')  # said above the Gantt, which is still drawn
    # Found by themselves in DIR/spans, they are warned about alike; merge says it too.
    shutil.copytree(other, traces / "spans")
    done = cli("report", str(traces), "-o", str(page))
    assert done.returncode == 0 and warning.replace(str(other), str(traces / "spans")) in done.stderr
    assert 'class="warning"' in page.read_text()
    done = cli("merge", str(traces), "-o", str(tmp_path / "merged.json"))
    assert done.returncode == 0 and "are of another job" in done.stderr


def _starts(merged: dict) -> dict[tuple[int, str], float]:
    """Each track's first event, in seconds since the epoch, by (rank, track name)."""
    base_us = merged["baseTimeNanoseconds"] / 1000
    first: dict[int, float] = {}
    for event in merged["traceEvents"]:
        if event.get("ph") == "X":
            first[event["pid"]] = min(first.get(event["pid"], float("inf")), event["ts"])
    return {
        (i["rank"], i["track"]): (base_us + first[i["pid"]]) / 1e6 for i in merged["torchstep_prof_merge"]["inputs"]
    }


def test_merge_moves_each_process_onto_one_clock_by_its_estimated_offset(shifted, tmp_path):
    raw_dir = tmp_path / "raw"
    shutil.copytree(shifted, raw_dir, ignore=shutil.ignore_patterns("spans"))
    done = cli("merge", str(raw_dir), "-o", str(tmp_path / "raw.json"))
    assert done.returncode == 0, done.stderr
    assert "clocks" not in done.stdout
    raw = json.loads((tmp_path / "raw.json").read_text())
    assert "clock" not in raw["torchstep_prof_merge"]

    done = cli("merge", str(shifted), "-o", str(tmp_path / "aligned.json"))
    assert done.returncode == 0, done.stderr
    assert f"clocks from {shifted / 'spans'}: 18 of 18 trace(s) aligned" in done.stdout
    aligned = json.loads((tmp_path / "aligned.json").read_text())
    about = aligned["torchstep_prof_merge"]
    assert about["clock"]["spans"] == str(shifted / "spans")
    clocks = {i["rank"]: i["clock"] for i in about["inputs"]}
    assert all(c["aligned"] for c in clocks.values())
    offset = clocks[1]["offset_s"] - clocks[0]["offset_s"]
    bound = clocks[1]["bound_s"] + clocks[0]["bound_s"]
    assert abs(offset - SHIFT_S) <= bound < 0.05
    assert clocks[1]["process"] == f"{SLOW}@node-b"

    before, after = _starts(raw), _starts(aligned)
    tracks = [t for t in before if t[0] == 1]
    assert len(tracks) == 9
    for rank1 in tracks:
        rank0 = (0, rank1[1].replace("rank 1", "rank 0"))
        moved = (before[rank1] - before[rank0]) - (after[rank1] - after[rank0])
        assert abs(moved - SHIFT_S) <= bound + 1e-5, (rank1, moved)

    # A process no span file names keeps its own clock, and the metadata says so.
    partial = tmp_path / "partial"
    partial.mkdir()
    for span_file in (shifted / "spans").iterdir():
        if json.loads(span_file.read_text().splitlines()[0])["rank"] == 0:
            shutil.copy(span_file, partial)
    done = cli("merge", str(raw_dir), "-o", str(tmp_path / "partial.json"), "--spans", str(partial))
    assert done.returncode == 0, done.stderr
    assert re.search(r"9 of 18 trace\(s\) aligned \([^)]*\); not aligned: no span file of pid \d+ rank 1$", done.stdout)
    merged = json.loads((tmp_path / "partial.json").read_text())
    for entry in merged["torchstep_prof_merge"]["inputs"]:
        if entry["rank"] == 1:
            assert entry["clock"]["aligned"] is False
            assert re.fullmatch(r"not aligned: no span file of pid \d+ rank 1", entry["clock"]["reason"])
    kept = _starts(merged)
    for rank1 in tracks:
        rank0 = (0, rank1[1].replace("rank 1", "rank 0"))
        assert (kept[rank1] - kept[rank0]) == pytest.approx(before[rank1] - before[rank0], abs=1e-5)


def test_a_process_no_anchor_links_is_named_under_clocks_on_the_page(shifted, tmp_path):
    """Rank 1 on another node with its anchors dropped: nothing links its clock to rank 0's, and
    the page says so under "Clocks:" (its row is labelled not aligned), as `timeline` does."""
    folder = tmp_path / "out"
    shutil.copytree(shifted, folder)
    rank1 = next(p for p in (folder / "spans").iterdir() if json.loads(p.read_text().splitlines()[0])["rank"] == 1)
    lines = [json.loads(line) for line in rank1.read_text().splitlines()]
    for record in lines:
        record.pop("anchors", None)
    rank1.write_text("".join(json.dumps(record) + "\n" for record in lines))
    page = tmp_path / "report.html"
    done = cli("report", str(folder), "-o", str(page))
    assert done.returncode == 0, done.stderr
    notes = re.search(r'<ul class="clock-notes">(.*?)</ul>', page.read_text(), re.S)
    assert notes is not None, "no clock notes on the page"
    assert "rank 1" in notes.group(1) and "anchor" in notes.group(1)


def _rank_gaps(page: Path) -> list[float]:
    """Per step's timeline (a row per rank), how far rank 1's first bar starts after rank 0's, in ms."""
    gaps = []
    for spec in figures(page):
        if not re.match(r"ms since \d{4}-", spec["layout"].get("xaxis", {}).get("title", {}).get("text", "")):
            continue  # not a step's timeline on wall-clock time
        first: dict[str, float] = {}
        for trace in spec["data"]:
            for label, base in zip(trace["y"], trace["base"]):
                rank = label.split()[1]
                first[rank] = min(first.get(rank, float("inf")), base)
        gaps.append(first["1"] - first["0"])
    return gaps


def test_the_step_timelines_put_each_rank_on_the_job_clock_when_the_span_files_give_it(job, shifted, tmp_path):
    """Rank 1's traces and spans 2 s ahead: with the span files, its bars are moved back by its
    estimated offset (where the unshifted job has them) and the page prints the bound; without
    them, the bars stay 2 s off and the page says the clocks are unaligned."""
    pages = {}
    for name, folder, spans in (("raw", job, True), ("aligned", shifted, True), ("own", shifted, False)):
        traces = tmp_path / name
        shutil.copytree(folder, traces, ignore=None if spans else shutil.ignore_patterns("spans"))
        pages[name] = tmp_path / f"{name}.html"
        done = cli("report", str(traces), "-o", str(pages[name]))
        assert done.returncode == 0, done.stderr
    raw, aligned, own = (_rank_gaps(pages[name]) for name in ("raw", "aligned", "own"))
    assert len(raw) == len(aligned) == len(own) == 3  # the traced steps 1-3
    merged = cli("merge", str(tmp_path / "aligned"), "-o", str(tmp_path / "merged.json"))
    bound_ms = max(
        i["clock"]["bound_s"] for i in json.loads((tmp_path / "merged.json").read_text())["torchstep_prof_merge"]["inputs"]
    ) * 2000  # fmt: skip
    assert merged.returncode == 0 and bound_ms < 50
    for before, moved, kept in zip(raw, aligned, own):
        assert abs(moved - before) <= bound_ms + 0.01, (moved, before)
        assert abs(kept - before - SHIFT_S * 1000) <= 1.0, (kept, before)

    html = pages["aligned"].read_text()
    lines = re.findall(r'<p class="meta clocks">(.*?)</p>', html)
    assert len(lines) == 3
    assert all(
        re.fullmatch(
            rf"Each rank moved onto one clock, actor\+ref rank \d@[^:]+&#x27;s: clocks from {re.escape(str(tmp_path / 'aligned' / 'spans'))}: "
            r"\d+ of \d+ trace\(s\) aligned \(offsets right within \d+\.\d{3} ms\)\.",
            line,
        )
        for line in lines
    ), lines
    unaligned = re.findall(r'<p class="meta clocks">(.*?)</p>', pages["own"].read_text())
    assert len(unaligned) == 3 and all("the clocks are unaligned" in line for line in unaligned)
    probe = probe_page(pages["aligned"])
    assert probe["errors"] == []
    timelines = [c for c in probe["charts"] if c["kind"] == "timeline"]
    assert len(timelines) == 3 and all(c["bars"] >= 6 for c in timelines)
