"""``torchstep-prof report``: the page a person opens, checked in real headless Chromium.

The folders are real torch.profiler traces: fabricated ones with a known straggler (rank 2 of
step 2 spends 80 ms more in ``aten::mm``), and the traces ``examples/rl_step.py`` writes on two
ranks. Every command runs in a subprocess, as a person runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser import colored_pixels, probe_page, screenshot
from trace_factory import assert_summary_shape, write_not_json, write_trace, write_truncated

from torchstep_prof.traces.report.text import axis_labels

plotly = pytest.importorskip("plotly", reason="plotly is not installed (the [report] extra)")

ROOT = Path(__file__).resolve().parents[1]
BAR, STRAGGLER = "#4C78A8", "#D62728"
SLOW_RANK, SLOW_STEP = 2, 2


def cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torchstep_prof", *args] if code is None else [
        sys.executable, "-c", code, *args
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def straggler_dir(tmp_path_factory) -> Path:
    """4 ranks x steps 1-2 of actor/update (rank 2 slow in aten::mm at step 2), rollout/generate
    on ranks 0-1, and two files that are not usable traces."""
    folder = tmp_path_factory.mktemp("straggler")
    write_trace(tmp_path_factory.mktemp("warmup"))  # the first trace of a process is slower
    for step in (1, SLOW_STEP):
        for rank in range(4):
            slow = rank == SLOW_RANK and step == SLOW_STEP
            write_trace(folder, step=step, rank=rank, world_size=4, sleep_s=0.03, mm_s=0.08 if slow else 0.0)
        for rank in range(2):
            write_trace(folder, role="rollout", stage="generate", step=step, rank=rank, world_size=4, sleep_s=0.01)
    source = next(folder.glob("actor_update_step1_rank0*"))
    write_truncated(folder, source, "actor_update_step9_rank0-of-4_pid1_20260101000000000.json")
    write_not_json(folder, "notes.json")
    return folder


@pytest.fixture(scope="module")
def straggler_page(straggler_dir, tmp_path_factory) -> Path:
    page = tmp_path_factory.mktemp("page") / "report.html"
    done = cli("report", str(straggler_dir), "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert f"wrote {page}: 12 trace(s), 4 group(s)" in done.stdout
    return page


@pytest.fixture(scope="module")
def straggler_probe(straggler_page) -> dict:
    return probe_page(straggler_page)


@pytest.fixture(scope="module")
def straggler_shot(straggler_page, tmp_path_factory) -> Path:
    return screenshot(straggler_page, tmp_path_factory.mktemp("shot") / "page.png")


def figures(page: Path) -> list[dict]:
    match = re.search(r'<script type="application/json" id="tsp-figures">(.*?)</script>', page.read_text(), re.S)
    assert match
    return json.loads(match[1].replace("<\\/", "</"))


def with_figures(page: Path, figs: list[dict], out: Path) -> Path:
    text = page.read_text()
    start = text.index('id="tsp-figures">') + len('id="tsp-figures">')
    end = text.index("</script>", start)
    out.write_text(text[:start] + json.dumps(figs).replace("</", "<\\/") + text[end:])
    return out


# --- findings, in summarize --json and on the page ---------------------------------------------


def test_summarize_json_findings_name_the_slow_rank_and_operator(straggler_dir):
    done = cli("summarize", str(straggler_dir), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert_summary_shape(doc)
    found = [f for f in doc["findings"] if (f["role"], f["stage"], f["step"]) == ("actor", "update", SLOW_STEP)]
    assert len(found) == 1, doc["findings"]
    finding = found[0]
    assert set(finding) == {"role", "stage", "step", "occurrence", "rank", "wall_ms", "median_ms", "ratio", "ops"}
    assert finding["rank"] == SLOW_RANK and finding["occurrence"] == 1
    group = next(g for g in doc["groups"] if (g["role"], g["stage"], g["step"]) == ("actor", "update", SLOW_STEP))
    assert group["straggler"] == SLOW_RANK
    assert finding["median_ms"] == group["median_ms"]
    assert finding["wall_ms"] == max(r["wall_ms"] for r in group["ranks"] if r["rank"] == SLOW_RANK)
    assert finding["ratio"] == pytest.approx(finding["wall_ms"] / finding["median_ms"], abs=1e-3)
    top = finding["ops"][0]
    assert set(top) == {"name", "self_ms", "median_self_ms", "delta_ms"}
    assert top["name"] == "aten::mm" and top["delta_ms"] > 40  # 80 ms of extra matmuls
    assert top["delta_ms"] == pytest.approx(top["self_ms"] - top["median_self_ms"], abs=2e-3)
    deltas = [abs(op["delta_ms"]) for op in finding["ops"]]
    assert deltas == sorted(deltas, reverse=True)


def test_page_says_what_stands_out_first_and_what_was_skipped(straggler_page, straggler_dir):
    text = straggler_page.read_text()
    stands_out = text.index("What stands out")
    sentence = re.search(r"rank 2&#x27;s actor/update step 2 is (\d+\.\d)x slower than the median \((\d+) ms vs (\d+) ms\), mostly in aten::mm \(\+(\d+) ms\)", text)
    assert sentence, text[stands_out : stands_out + 2000]
    assert stands_out < text.index("Step 1</h2>")
    assert "Read <b>12</b> trace(s)" in text
    assert "Skipped 2 file(s)" in text
    assert "notes.json</code>: not valid JSON" in text
    assert "actor_update_step9_rank0-of-4_pid1_20260101000000000.json</code>: not valid JSON" in text


def test_page_opens_offline(straggler_page):
    text = straggler_page.read_text()
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", text, re.I)
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs() in text  # the whole library, inlined


def test_every_figure_is_a_valid_plotly_figure(straggler_page):
    import plotly.graph_objects as go

    figs = figures(straggler_page)
    assert len(figs) == 2 + 4 + 2  # a timeline per step, a chart per group, one per region
    for fig in figs:
        go.Figure(fig)  # plotly's own validation: raises on any property it does not know
    timeline = figs[0]
    hover = timeline["data"][0]["hovertemplate"]
    assert all(f"%{{customdata[{i}]}}" in hover for i in range(7))
    # A bar with a base: plotly's %{x} is where it ends, never its duration.
    assert "%{x" not in hover and "%{customdata[6]} ms, from %{base:.2f} ms" in hover
    role, stage, step, _, rank, file, duration = timeline["data"][0]["customdata"][0]
    assert (role, stage, step) == ("actor", "update", 1) and rank == 0
    assert file.startswith("actor_update_step1_rank0-of-4_pid") and file.endswith(".json")
    for trace in timeline["data"]:
        for row, x in zip(trace["customdata"], trace["x"]):
            assert re.fullmatch(r"\d+\.\d\d", row[6]) and abs(float(row[6]) - x) < 0.0051


# --- in a real browser ---------------------------------------------------------------------------


def test_page_loads_in_chromium_with_every_chart_drawn(straggler_probe):
    probe = straggler_probe
    assert probe["errors"] == []
    charts = probe["charts"]
    assert probe["total"] == probe["drawn"] == len(charts) == 8
    kinds = [c["kind"] for c in charts]
    assert kinds.count("timeline") == 2 and kinds.count("group") == 4 and kinds.count("ops") == 2
    for chart in charts:
        assert chart["svg"] >= 1 and chart["bars"] >= 1, chart
    groups = [c for c in charts if c["kind"] == "group"]
    assert sorted(c["bars"] for c in groups) == [2, 2, 4, 4]  # one bar per rank
    timelines = [c for c in charts if c["kind"] == "timeline"]
    assert all(c["bars"] == 6 for c in timelines)  # one bar per trace of the step
    assert all("rank 3 pid" in c["text"] and "actor/update" in c["text"] for c in timelines)
    straggling = [c for c in groups if "straggler" in c["text"]]
    assert len(straggling) >= 1 and all("median" in c["text"] for c in groups)
    # Nothing cut at a chart's edges, and the median's label never on a bar.
    assert [c["cut"] for c in charts] == [[]] * len(charts)
    assert [c["over_bars"] for c in groups] == [[]] * len(groups)


def test_screenshot_shows_the_bars_and_fails_on_an_empty_chart(straggler_page, straggler_probe, straggler_shot, tmp_path):
    first = next(c for c in straggler_probe["charts"] if c["kind"] == "group")  # actor/update step 1
    assert colored_pixels(straggler_shot, first["rect"], BAR) > 2000

    # The same page with that chart's bars gone: the same check must fail.
    figs = figures(straggler_page)
    figs[first["fig"]]["data"] = []
    empty = with_figures(straggler_page, figs, tmp_path / "empty.html")
    assert colored_pixels(screenshot(empty, tmp_path / "empty.png"), first["rect"], BAR) == 0


def test_screenshot_marks_the_straggler_in_red(straggler_probe, straggler_shot):
    slow = next(c for c in straggler_probe["charts"] if c["card"] == f"g-actor-update-{SLOW_STEP}-1")
    assert "straggler" in slow["text"]
    assert slow["rect"][1] + slow["rect"][3] <= 3200, "the chart is below the screenshot"
    assert colored_pixels(straggler_shot, slow["rect"], STRAGGLER) > 500


# --- the command's exits -----------------------------------------------------------------------


def test_without_plotly_report_exits_2_naming_the_install_command(straggler_dir, tmp_path):
    out = tmp_path / "r.html"
    hide_plotly = (
        "import sys\n"
        "sys.modules['plotly'] = None  # import plotly now raises ImportError, as when not installed\n"
        "from torchstep_prof.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = cli("report", str(straggler_dir), "-o", str(out), code=hide_plotly)
    assert done.returncode == 2, done.stderr
    assert "pip install 'plotly>=5.5,<8' (the [report] extra)" in done.stderr
    assert not out.exists()
    # summarize, ls and the rest do not need the extra.
    assert cli("ls", str(straggler_dir), code=hide_plotly).returncode == 0


def test_a_folder_with_no_usable_trace_exits_1(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    write_not_json(folder, "a.json")
    out = tmp_path / "r.html"
    done = cli("report", str(folder), "-o", str(out))
    assert done.returncode == 1
    assert "no usable trace" in done.stderr and "a.json" in done.stderr
    assert not out.exists()


def test_filters_choose_what_the_page_shows(straggler_dir, tmp_path):
    out = tmp_path / "r.html"
    done = cli("report", str(straggler_dir), "-o", str(out), "--role", "actor", "--step", "2", "--rank", "0", "--rank", "2")
    assert done.returncode == 0, done.stderr
    figs = figures(out)
    assert len(figs) == 1 + 1 + 1  # step 2's timeline, actor/update step 2, the actor region
    assert figs[1]["data"][0]["x"] == ["rank 0", "rank 2"]
    assert "Filters: --role actor, --step 2, --rank 0, --rank 2" in out.read_text()
    pid = os.getpid()  # the factory wrote every trace in this process
    assert cli("report", str(straggler_dir), "-o", str(out), "--pid", str(pid)).returncode == 0
    done = cli("report", str(straggler_dir), "-o", str(tmp_path / "none.html"), "--pid", str(pid + 1))
    # The pids the folder's trace names hold (the truncated file's pid1 too: it is not opened).
    assert done.returncode == 1 and f"no trace of pid {pid + 1} in {straggler_dir}; pids here: 1, {pid} (--pid chooses)" in done.stderr


# --- real traces from the example ----------------------------------------------------------------


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory) -> Path:
    """``examples/rl_step.py`` run as ranks 0 and 1 of 2 at once (discrete traces of steps 2, 3).

    One thread each: two processes with two intra-op threads each on two cores spin for tens of
    milliseconds per small op here.
    """
    folder = tmp_path_factory.mktemp("example") / "profile"
    env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", TORCHSTEP_PROF_OVERRIDES="all_ranks=true", TORCHSTEP_PROF_SUMMARY="0")
    runs = [
        subprocess.Popen(
            [sys.executable, "examples/rl_step.py", "--save-path", str(folder)],
            cwd=ROOT, env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    return folder


def test_report_of_real_example_traces_draws_every_chart(example_dir, tmp_path):
    page = tmp_path / "example.html"
    done = cli("report", str(example_dir), "-o", str(page))
    assert done.returncode == 0, done.stderr
    traces = len(list(example_dir.glob("*.json")))
    assert traces == 2 * 2 * 5  # 2 ranks, steps 2 and 3, five regions
    probe = probe_page(page, window=(1280, 900))
    assert probe["errors"] == []
    charts = probe["charts"]
    assert probe["drawn"] == len(charts) == 2 + 10 + 5
    # Charts far below the window wait until they scroll into view: long pages stay responsive.
    assert 1 <= probe["drawn_at_load"] < len(charts)
    assert all(c["bars"] >= 1 for c in charts), charts
    assert [c["bars"] for c in charts if c["kind"] == "timeline"] == [10, 10]
    text = page.read_text()
    assert "Step 2</h2>" in text and "Step 3</h2>" in text
    assert "critic/update step 3" in text and "aten::" in text


def test_report_does_not_import_torch(straggler_dir, tmp_path):
    check = (
        "import sys\n"
        "from torchstep_prof.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('torch imported' if 'torch' in sys.modules else 'no torch')\n"
        "sys.exit(code)\n"
    )
    done = cli("report", str(straggler_dir), "-o", str(tmp_path / "r.html"), code=check)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("no torch")


@pytest.fixture(scope="module")
def fused_dir(tmp_path_factory) -> Path:
    """``examples/rl_step.py --fused`` run as ranks 0 and 1 of 2 at once: one trace per rank of
    steps 2 and 3, each holding the step's five regions."""
    folder = tmp_path_factory.mktemp("fused") / "profile"
    env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", TORCHSTEP_PROF_OVERRIDES="all_ranks=true", TORCHSTEP_PROF_SUMMARY="0")
    runs = [
        subprocess.Popen(
            [sys.executable, "examples/rl_step.py", "--fused", "--save-path", str(folder)],
            cwd=ROOT, env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    return folder


FUSED_REGIONS = {"rollout/generate", "actor/compute-log-prob", "ref/compute-log-prob", "critic/update", "actor/update"}


def test_report_of_fused_traces_draws_each_region_inside_its_step(fused_dir, tmp_path):
    page = tmp_path / "fused.html"
    done = cli("report", str(fused_dir), "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert f"wrote {page}: 4 trace(s), 2 group(s)" in done.stdout  # traces, not bars
    figs = figures(page)
    timelines = [f for f in figs if f["layout"].get("barmode") == "overlay"]
    assert len(timelines) == 2
    for timeline in timelines:
        whole, *regions = timeline["data"]
        assert whole["name"] == "rollout-actor-ref-critic/train (whole step)"
        assert {t["name"] for t in regions} == FUSED_REGIONS
        assert sorted(whole["y"]) == sorted(set(whole["y"])) and len(whole["y"]) == 2  # a row per rank
        step = {y: (b, b + x) for y, x, b in zip(whole["y"], whole["x"], whole["base"])}
        for trace in regions:
            assert sorted(trace["y"]) == sorted(step)  # each region in each rank's row
            for y, x, b, row in zip(trace["y"], trace["x"], trace["base"], trace["customdata"]):
                start, end = step[y]
                assert start - 1e-3 <= b and b + x <= end + 1e-3, (trace["name"], y)  # inside its step
                assert f"{row[0]}/{row[1]}" == trace["name"] and abs(float(row[6]) - x) < 0.0051
        # The regions run one after the other, in the order the example enters them.
        order = sorted(regions, key=lambda t: t["base"][0])
        assert [t["name"] for t in order] == ["rollout/generate", "actor/compute-log-prob", "ref/compute-log-prob", "critic/update", "actor/update"]
    text = page.read_text()
    cards = re.findall(r'<section id="regions">.*', text, re.S)[0]
    for region in FUSED_REGIONS:  # per region its top operators, read inside the fused traces
        assert f"<h3>{region}</h3>" in cards, region
    assert "<h3>rollout-actor-ref-critic/train (whole fused step)</h3>" in cards
    ops = [f for f in figs if f["layout"]["xaxis"]["title"]["text"] == "self ms"]
    assert len(ops) == len(FUSED_REGIONS) + 1
    assert all(any(name.startswith("aten::") for name in fig["data"][0]["y"]) for fig in ops)
    probe = probe_page(page, window=(1280, 900))
    assert probe["errors"] == [] and probe["drawn"] == len(probe["charts"])
    drawn = [c for c in probe["charts"] if c["kind"] == "timeline"]
    assert [c["bars"] for c in drawn] == [12, 12]  # per rank: the step and its five regions
    assert all("actor/update" in c["text"] and "rank 1 pid" in c["text"] for c in drawn)


# --- names from a trace are text, never markup --------------------------------------------------

HOSTILE = {"aten::mm": "<!--<script>", "aten::relu": 'my::<a href="https://example.com/x">op</a> & co'}


@pytest.fixture(scope="module")
def hostile_page(tmp_path_factory) -> Path:
    """A real trace whose operators were renamed to markup (an operator's name is free text; a
    name with a "/" and no "::" would be a region range)."""
    folder = tmp_path_factory.mktemp("hostile")
    path = write_trace(folder, mm_s=0.01).path
    trace = json.loads(path.read_text())
    for event in trace["traceEvents"]:
        event["name"] = HOSTILE.get(event.get("name"), event.get("name"))
    path.write_text(json.dumps(trace))
    page = folder / "report.html"
    done = cli("report", str(folder), "-o", str(page), "--top", "100")  # every operator
    assert done.returncode == 0, done.stderr
    return page


def test_operator_names_with_markup_are_text_in_the_page_and_its_charts(hostile_page):
    text = hostile_page.read_text()
    script = text[text.index('id="tsp-figures">') :]
    script = script[: script.index("</script>")]
    assert "<" not in script.split(">", 1)[1] and "&" not in script  # nothing for the HTML parser
    probe = probe_page(hostile_page)
    assert probe["errors"] == []
    assert probe["total"] == probe["drawn"] == len(probe["charts"]) >= 3
    (ops,) = [c for c in probe["charts"] if c["kind"] == "ops"]
    # The names as they are, shown as text (a long one cut in the middle on the axis, whole in
    # the hover): no link, no comment swallowing the rest.
    (long_label,) = axis_labels([HOSTILE["aten::relu"]])
    assert "<!--<script>" in ops["text"] and long_label in ops["text"] and "<a href=" in long_label
    assert all(c["links"] == 0 for c in probe["charts"])
    assert '<a href="https://example.com/x">' not in text


# --- one rank: what `make report` makes -----------------------------------------------------------

LONG_OP = "autograd::engine::evaluate_function: AddmmBackward0 of a very long name"


@pytest.fixture(scope="module")
def one_rank_page(tmp_path_factory) -> Path:
    """``examples/rl_step.py`` as ``make report`` runs it (one rank, steps 2 and 3), one of its
    operators renamed to a long name, and the traces of an earlier run (another pid) beside them."""
    folder = tmp_path_factory.mktemp("one") / "profile"
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHSTEP_PROF_SUMMARY="0")
    done = subprocess.run(
        [sys.executable, "examples/rl_step.py", "--save-path", str(folder)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path in folder.glob("actor_update_*.json"):
        trace = json.loads(path.read_text())
        for event in trace["traceEvents"]:
            if event.get("name") == "aten::mm":
                event["name"] = LONG_OP
        path.write_text(json.dumps(trace))
    earlier = next(folder.glob("critic_update_step2_*.json"))
    trace = json.loads(earlier.read_text())
    trace["torchstep_prof"]["pid"] = 1
    (folder / re.sub(r"_pid\d+_\d+", "_pid1_20260101000000000", earlier.name)).write_text(json.dumps(trace))
    page = folder.parent / "report.html"
    done = cli("report", str(folder), "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert "(--pid chooses)" in done.stderr  # the command line warns in its words
    return page


def test_one_rank_shows_each_steps_regions_and_how_steps_vary(one_rank_page):
    text = one_rank_page.read_text().split("</head>", 1)[1]  # the page, plotly.js aside
    assert "One rank: stragglers are found by comparing ranks" in text
    assert '<section id="steps"><h2>Steps</h2>' in text and "Step 2</h2>" not in text
    # The page says in its own words which run it shows, never the command line's warning.
    assert "--pid chooses" not in text and "warning:" not in text
    assert re.search(r"several runs: the page shows the newest of each rank \(rank 0 pid \d+\) and leaves out 1 trace\(s\) of pid 1", text)
    spread = re.findall(r"<tr><td>([a-z/-]+)</td><td>2</td><td>[\d.]+</td><td>[\d.]+</td><td>[\d.]+ \(step [23]\)</td></tr>", text)
    assert sorted(spread) == sorted(FUSED_REGIONS)  # each region over its two steps
    figs = figures(one_rank_page)
    timeline, stacked = figs[0], figs[1]
    assert {y for trace in timeline["data"] for y in trace["y"]} == {"step 2", "step 3"}
    assert {trace["name"] for trace in timeline["data"]} == FUSED_REGIONS
    assert timeline["layout"]["xaxis"]["title"]["text"] == "ms since the step's start"
    for trace in timeline["data"]:  # each step from its own start
        assert min(trace["base"]) >= 0
    assert stacked["layout"]["barmode"] == "stack" and {t["name"] for t in stacked["data"]} == FUSED_REGIONS
    assert all(t["x"] == ["step 2", "step 3"] and all(y > 0 for y in t["y"]) for t in stacked["data"])
    colors = {t["name"]: t["marker"]["color"] for t in timeline["data"]}
    assert colors == {t["name"]: t["marker"]["color"] for t in stacked["data"]}  # one color per region


def test_one_rank_page_in_chromium_draws_no_one_bar_charts_and_cuts_no_text(one_rank_page):
    probe = probe_page(one_rank_page)
    assert probe["errors"] == []
    charts = probe["charts"]
    assert probe["total"] == probe["drawn"] == len(charts) == 1 + 1 + 5
    assert [c["kind"] for c in charts] == ["timeline", "steps"] + ["ops"] * 5  # no chart per group
    assert charts[0]["bars"] == 10 and "step 2" in charts[0]["text"] and "step 3" in charts[0]["text"]
    assert charts[1]["bars"] == 10  # five regions stacked in each of two steps
    assert all(c["bars"] >= 2 for c in charts)
    # Long names cut in the middle, never at their start; every title whole.
    assert [c["cut"] for c in charts] == [[]] * len(charts)
    # Other regions' top operators may hold real autograd::engine names too: find the long one by its label.
    (label,) = axis_labels([LONG_OP])
    assert label.startswith("autograd::engine") and label.endswith("long name") and label != LONG_OP
    (actor,) = [c for c in charts if c["kind"] == "ops" and label in c["text"]]
    assert "self ms" in actor["text"]


def test_one_rank_of_many_steps_keeps_the_slowest_on_its_timeline_and_every_step_in_its_chart(tmp_path):
    from torchstep_prof.traces.report.steps import TIMELINE_STEPS

    folder = tmp_path / "many"
    steps = range(1, TIMELINE_STEPS + 6)
    slow = {3, 17, 44}
    for step in steps:
        write_trace(folder, step=step, sleep_s=0.03 if step in slow else 0.001)
    page = tmp_path / "many.html"
    done = cli("report", str(folder), "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert f"The timeline shows the {TIMELINE_STEPS} slowest of the {len(steps)} steps." in page.read_text()
    timeline, stacked = figures(page)[:2]
    rows = [int(y.split()[1]) for y in timeline["data"][0]["y"]]
    assert len(rows) == TIMELINE_STEPS and rows == sorted(rows) and slow <= set(rows)
    assert stacked["data"][0]["x"] == [f"step {step}" for step in steps]
