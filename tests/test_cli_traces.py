"""The trace subcommands end to end: summarize, merge, ls, hta; bad files; exit codes."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trace_factory import (
    assert_summary_shape,
    write_foreign,
    write_foreign_trace,
    write_not_json,
    write_ranks,
    write_trace,
    write_truncated,
)

from torchstep_prof.cli import main

REPO = Path(__file__).resolve().parents[1]
SLOW_RANK = 2
TRUNCATED = "actor_update_step1_rank7-of-8_pid1_20260101000000000.json"
BAD_NAMES = (TRUNCATED, "notes.json", "config.json", "engine_trace.json")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 ranks x 2 steps of one region (rank 2 sleeps in both), and four files that are not
    usable traces: truncated, not JSON, JSON that is not a trace, a trace that is not ours."""
    root = tmp_path_factory.mktemp("cli")
    written = write_ranks(root, world_size=4, steps=(1, 2), slow={SLOW_RANK: 0.12})
    write_truncated(root, written[0].path, TRUNCATED)
    write_not_json(root, "notes.json")
    write_foreign(root, "config.json")
    write_foreign_trace(root, written[0].path, "engine_trace.json")
    return root


def _run(capsys: pytest.CaptureFixture, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_bad_files_named(text: str) -> None:
    for name in BAD_NAMES:
        assert name in text, name


# --- summarize ---------------------------------------------------------------------------------


def test_summarize_json_flags_the_slow_rank(folder: Path, capsys) -> None:
    code, out, err = _run(capsys, "summarize", folder, "--json")
    assert code == 0
    doc = json.loads(out)
    assert_summary_shape(doc)
    assert [(g["step"], g["straggler"]) for g in doc["groups"]] == [(1, SLOW_RANK), (2, SLOW_RANK)]
    assert sorted(Path(p).name for p in doc["unreadable"]) == sorted(BAD_NAMES)
    _assert_bad_files_named(err)  # with the reasons, for people


def test_summarize_table(folder: Path, capsys) -> None:
    code, out, _ = _run(capsys, "summarize", folder, "--top", "2")
    assert code == 0
    # rank, wall ms, ratio to the median, the flag
    flagged = re.findall(r"^\s*(\d+)\s+[\d.]+\s+[\d.]+ straggler", out, flags=re.MULTILINE)
    assert flagged == [str(SLOW_RANK), str(SLOW_RANK)]  # one per step
    assert out.count("actor/update") == 2
    _assert_bad_files_named(out)


def test_summarize_filters_and_ratio(folder: Path, capsys) -> None:
    code, out, _ = _run(
        capsys,
        "summarize",
        folder,
        "--json",
        "--rank",
        "0",
        "--rank",
        "2",
        "--role",
        "actor",
        "--top",
        "0",
        "--straggler-ratio",
        "100",
    )
    assert code == 0
    doc = json.loads(out)
    assert [[r["rank"] for r in g["ranks"]] for g in doc["groups"]] == [[0, 2], [0, 2]]
    assert all(g["straggler"] is None for g in doc["groups"])  # 100x the median: nobody
    assert all(r["top_ops"] == [] for g in doc["groups"] for r in g["ranks"])
    # The truncated file is named for rank 7: the rank filter never opens it.
    assert TRUNCATED not in " ".join(doc["unreadable"])


def test_summarize_exit_codes(folder: Path, tmp_path: Path, capsys) -> None:
    assert _run(capsys, "summarize", tmp_path)[0] == 1  # empty folder
    code, _, err = _run(capsys, "summarize", folder, "--role", "critic")
    assert code == 1 and "matching the filters" in err
    bad_only = tmp_path / "bad"
    bad_only.mkdir()
    write_not_json(bad_only, "x.json")
    code, out, err = _run(capsys, "summarize", bad_only, "--json")
    assert code == 1 and json.loads(out)["unreadable"] == [str(bad_only / "x.json")]
    assert "1 file(s) skipped" in err
    code, _, err = _run(capsys, "summarize", tmp_path / "missing")
    assert code == 2 and "cannot read folder" in err
    with pytest.raises(SystemExit) as exited:
        main(["summarize", str(folder), "--straggler-ratio", "0.5"])
    assert exited.value.code == 2


def test_a_folder_of_span_files_only_points_to_timeline(tmp_path: Path, capsys) -> None:
    header = {"kind": "process", "format": 1, "host": "h", "pid": 7, "rank": 0, "world_size": 1, "start": 1.0}
    batch = {"kind": "batch", "thread": "MainThread", "rank": 0, "spans": [["actor", "update", 1.0, 2.0]],
             "steps": [[1, 1.0, 2.0]]}  # fmt: skip
    spans = tmp_path / "job" / "spans"
    spans.mkdir(parents=True)
    (spans / "spans-h-7.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(batch) + "\n")
    commands = [["summarize"], ["summarize", "--json"], ["merge", "-o", tmp_path / "m.json"]]
    if _has_plotly():
        commands.append(["report", "-o", tmp_path / "r.html"])
    for folder in (spans, spans.parent):  # the span folder itself, or a trace folder's spans/
        for command in commands:
            code, _, err = _run(capsys, command[0], folder, *command[1:])
            assert code == 1, command
            assert err.splitlines() == [
                f"torchstep-prof: no usable trace in {folder}",
                f"torchstep-prof: {spans} holds span files: torchstep-prof timeline {spans}",
            ], command
    # A filter that matches nothing is not a span log's sign; an empty folder has no hint.
    code, _, err = _run(capsys, "summarize", spans, "--role", "critic")
    assert code == 1 and "timeline" not in err
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "summarize", tmp_path / "empty")
    assert code == 1 and "timeline" not in err


def _has_plotly() -> bool:
    try:
        import plotly  # noqa: F401
    except ImportError:
        return False
    return True


def test_summarize_shows_a_progress_bar_on_a_terminal(
    folder: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchstep_prof.cli import _tracedir

    monkeypatch.setattr(_tracedir, "PROGRESS_MIN_FILES", 1)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, _ = _run(capsys, "summarize", folder, "--json")
    assert code == 0 and json.loads(out)["groups"]


def test_python_dash_m_exit_code(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    empty = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", str(tmp_path), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert empty.returncode == 1, empty.stderr
    assert json.loads(empty.stdout) == {
        "groups": [],
        "findings": [],
        "unreadable": [],
        "other_runs": [],
        "collectives": [],
        "memory": [],
    }
    assert "no usable trace" in empty.stderr


# --- merge -------------------------------------------------------------------------------------


def test_merge_command(folder: Path, tmp_path: Path, capsys) -> None:
    out_path = tmp_path / "step1.json.gz"
    code, out, err = _run(capsys, "merge", folder, "-o", out_path, "--step", "1")
    assert code == 0 and "merged 4 trace(s)" in out
    merged = json.loads(gzip.decompress(out_path.read_bytes()))
    names = sorted(
        e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"
    )
    assert names == [f"actor/update rank {r} step 1" for r in range(4)]
    assert "notes.json" in err


def test_merge_exit_codes(folder: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "merge", folder, "-o", tmp_path / "x.json", "--step", "9")
    assert code == 1 and not (tmp_path / "x.json").exists()
    code, _, err = _run(capsys, "merge", folder, "-o", tmp_path / "no" / "such" / "x.json")
    assert code == 1 and "cannot write" in err


# --- ls ----------------------------------------------------------------------------------------


def test_ls_lists_one_sorted_line_per_trace(folder: Path, capsys) -> None:
    code, out, err = _run(capsys, "ls", folder)
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == [
        "role", "stage", "step", "occ", "rank", "world", "pid", "wall_ms", "size", "path"
    ]
    fields = [line.split() for line in lines]
    assert [(f[0], f[1], int(f[2]), int(f[3]), int(f[4]), int(f[5])) for f in fields] == [
        ("actor", "update", step, 1, rank, 4) for step in (1, 2) for rank in range(4)
    ]
    assert {int(f[6]) for f in fields} == {os.getpid()}  # the factory's process wrote them
    assert all(Path(f[-1]).is_file() for f in fields)
    _assert_bad_files_named(err)


def test_ls_json_lines(folder: Path, capsys) -> None:
    code, out, _ = _run(capsys, "ls", folder, "--json", "--rank", "3")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [(r["step"], r["rank"]) for r in rows] == [(1, 3), (2, 3)]
    assert all(r["wall_ms"] > 0 and r["size"] > 0 for r in rows)


# --- hta ---------------------------------------------------------------------------------------


def _hta_args(folder: Path, out: Path, step: int = 1) -> list:
    return ["hta", folder, "--role", "actor", "--stage", "update", "--step", step, "-o", out]


def test_hta_links_one_trace_per_rank(folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "hta"
    code, stdout, err = _run(capsys, *_hta_args(folder, out))
    assert code == 0
    entries = sorted(out.iterdir())
    assert len(entries) == 4 and all(e.is_symlink() for e in entries)
    assert [e.name for e in entries] == sorted(p.name for p in folder.glob("*_step1_rank[0-3]-*"))
    assert all(e.resolve().parent == folder.resolve() for e in entries)
    assert [line.split(":")[0] for line in stdout.splitlines()] == [f"rank {r}" for r in range(4)]
    assert "notes.json" in err


def test_hta_copies_and_refuses_a_folder_holding_traces(
    folder: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "hta"
    assert _run(capsys, *_hta_args(folder, out), "--copy")[0] == 0
    assert all(e.is_file() and not e.is_symlink() for e in out.iterdir())
    code, _, err = _run(capsys, *_hta_args(folder, out, step=2))
    assert code == 2 and "--force" in err
    assert _run(capsys, *_hta_args(folder, out, step=2), "--force")[0] == 0
    assert all("_step2_" in e.name for e in out.iterdir()) and len(list(out.iterdir())) == 4
    code, _, err = _run(capsys, *_hta_args(folder, folder))
    assert code == 2 and "must differ" in err


def test_hta_keeps_the_newest_of_two_traces_of_a_rank(tmp_path: Path, capsys) -> None:
    source = tmp_path / "traces"
    older = write_trace(source, rank=1, world_size=2)
    newer = write_trace(source, rank=1, world_size=2)
    write_trace(source, rank=0, world_size=2)
    code, out, _ = _run(capsys, *_hta_args(source, tmp_path / "hta"))
    assert code == 0
    assert f"rank 1: 2 traces; keeping the newest, {newer.path}" in out
    assert str(older.path) in out  # named as ignored
    assert sorted(p.name for p in (tmp_path / "hta").iterdir()) == sorted(
        [newer.path.name, next(source.glob("*rank0-*")).name]
    )


def test_hta_writes_the_rank_hta_reads(tmp_path: Path, capsys) -> None:
    """A trace with no rank in its text would be rank 0 to HTA: it is copied with
    ``distributedInfo`` first, and one missing rank is warned about."""
    source = tmp_path / "traces"
    for rank in (0, 1, 3):
        write_trace(source, rank=rank, world_size=4, metadata=False, distributed_info=False)
    code, out, err = _run(capsys, *_hta_args(source, tmp_path / "hta"))
    assert code == 0 and "rank(s) 2 of 4" in err
    assert out.count("distributedInfo.rank set to") == 3
    for entry in sorted((tmp_path / "hta").iterdir()):
        text = entry.read_text()
        match = re.search(r'"rank":\s+(\d+)', text)  # what HTA searches for, first match wins
        expected = re.search(r"_rank(\d+)-of-", entry.name)[1]
        assert (match[1] if match else "0") == expected
        assert json.loads(text)["traceEvents"]


def test_hta_loads_the_folder(folder: Path, tmp_path: Path, capsys) -> None:
    hta = pytest.importorskip(
        "hta.trace_analysis",
        reason="HolisticTraceAnalysis is not installed (pip install HolisticTraceAnalysis)",
    )
    out = tmp_path / "hta"
    assert _run(capsys, *_hta_args(folder, out))[0] == 0
    analyzer = hta.TraceAnalysis(trace_dir=str(out))
    assert sorted(analyzer.t.traces) == [0, 1, 2, 3]


def test_hta_exit_code_without_a_match(folder: Path, tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, *_hta_args(folder, tmp_path / "hta", step=5))
    assert code == 1 and "no usable trace matching the filters" in err
    assert not (tmp_path / "hta").exists()


def test_hta_links_are_absolute(folder: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(folder.parent)
    out = tmp_path / "hta"
    assert _run(capsys, *_hta_args(Path(folder.name), out))[0] == 0
    assert all(os.path.isabs(os.readlink(e)) and e.resolve().is_file() for e in out.iterdir())


# --- occurrences, several runs, fused traces, layout, version ---------------------------------


@pytest.fixture(scope="module")
def micro(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks; trainer/forward ran twice in step 1 (gradient accumulation), the second
    occurrence slower on rank 1."""
    root = tmp_path_factory.mktemp("micro")
    for rank in (0, 1):
        write_trace(root, role="trainer", stage="forward", rank=rank, world_size=2, occurrence=1)
        write_trace(
            root, role="trainer", stage="forward", rank=rank, world_size=2, occurrence=2,
            sleep_s=0.08 if rank == 1 else 0.005,
        )
    return root


def test_occurrences_are_groups_never_ranks(micro: Path, capsys) -> None:
    code, out, _ = _run(capsys, "summarize", micro, "--json")
    doc = json.loads(out)
    assert_summary_shape(doc)
    assert [(g["occurrence"], [r["rank"] for r in g["ranks"]]) for g in doc["groups"]] == [
        (1, [0, 1]),
        (2, [0, 1]),
    ]
    assert all(r["pid"] == os.getpid() for g in doc["groups"] for r in g["ranks"])
    code, out, _ = _run(capsys, "summarize", micro)
    assert code == 0 and "occ" in out.splitlines()[1]
    assert "trainer/forward #2" in out


def test_merge_labels_occurrences_and_hta_takes_one(micro: Path, tmp_path: Path, capsys) -> None:
    code, _, _ = _run(capsys, "merge", micro, "-o", tmp_path / "m.json")
    merged = json.loads((tmp_path / "m.json").read_text())
    names = sorted(e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name")
    assert names == [
        "trainer/forward rank 0 step 1",
        "trainer/forward rank 0 step 1 #2",
        "trainer/forward rank 1 step 1",
        "trainer/forward rank 1 step 1 #2",
    ]
    args = ["hta", micro, "--role", "trainer", "--stage", "forward", "--step", 1]
    code, out, _ = _run(capsys, *args, "-o", tmp_path / "h1")
    assert code == 0 and "left out occurrence(s) 2" in out
    code, out, _ = _run(capsys, *args, "--occurrence", 2, "-o", tmp_path / "h2")
    assert code == 0 and "left out occurrence(s) 1" in out
    # An occurrence there is none of: said once, with the occurrences there are.
    code, out, err = _run(capsys, *args, "--occurrence", 3, "-o", tmp_path / "h3")
    assert code == 1 and out == "" and "linking" not in err
    assert err.strip() == (
        f"torchstep-prof: no trace of occurrence 3 of trainer/forward step 1 in {micro}; "
        "occurrence(s) here: 1, 2 (--occurrence K chooses)"
    )
    assert not (tmp_path / "h3").exists()
    for folder, occurrence in ((tmp_path / "h1", 1), (tmp_path / "h2", 2)):
        linked = sorted(folder.iterdir())
        assert len(linked) == 2
        assert {json.loads(p.read_text())["torchstep_prof"]["occurrence"] for p in linked} == {
            occurrence
        }


def test_several_runs_use_the_newest_and_pid_chooses(tmp_path: Path, capsys) -> None:
    for rank in (0, 1):
        write_trace(tmp_path, rank=rank, world_size=2, pid=100, sleep_s=0.05)
    for rank in (0, 1):
        write_trace(tmp_path, rank=rank, world_size=2, pid=200)
    code, out, err = _run(capsys, "summarize", tmp_path, "--json")
    doc = json.loads(out)
    assert code == 0
    assert [(r["rank"], r["pid"]) for r in doc["groups"][0]["ranks"]] == [(0, 200), (1, 200)]
    assert {(o["rank"], o["pid"], tuple(o["other_pids"])) for o in doc["other_runs"]} == {
        (0, 200, (100,)),
        (1, 200, (100,)),
    }
    assert "left out pid 100" in err and "--pid" in err
    code, out, _ = _run(capsys, "summarize", tmp_path, "--json", "--pid", "100")
    assert [r["pid"] for r in json.loads(out)["groups"][0]["ranks"]] == [100, 100]
    code, out, _ = _run(capsys, "ls", tmp_path, "--json")
    assert sorted(json.loads(line)["pid"] for line in out.splitlines()) == [100, 100, 200, 200]
    # A pid of no run: said once, naming the runs there are.
    for command in ("summarize", "ls", "merge", "report"):
        extra = ["-o", str(tmp_path / "out" / "x")] if command in ("merge", "report") else []
        code, out, err = _run(capsys, command, tmp_path, "--pid", "12345", *extra)
        assert code == 1, command
        assert err.strip() == (
            f"torchstep-prof: no trace of pid 12345 in {tmp_path}; pids here: 100, 200 (--pid chooses)"
        ), (command, err)
        assert "newest" not in out + err
    code, _, err = _run(capsys, "summarize", tmp_path, "--pid", "12345", "--rank", "1")
    assert code == 1 and "no trace of pid 12345 matching the other filters" in err
    assert "pids here: 100, 200" in err


def test_fused_traces_group_across_ranks_whatever_roles(tmp_path: Path, capsys) -> None:
    write_trace(
        tmp_path, role="eval-trainer", stage="train", rank=0, world_size=2, discrete=False,
        regions=("eval/run", "trainer/forward"),
    )
    write_trace(
        tmp_path, role="trainer", stage="train", rank=1, world_size=2, discrete=False,
        regions=("trainer/forward",),
    )
    code, out, _ = _run(capsys, "summarize", tmp_path, "--json")
    (group,) = json.loads(out)["groups"]
    assert group["role"] == "eval-trainer" and group["fused"] is True
    assert [(r["rank"], r["role"]) for r in group["ranks"]] == [(0, "eval-trainer"), (1, "trainer")]
    code, out, err = _run(
        capsys, "hta", tmp_path, "--role", "trainer", "--stage", "train", "--step", 1,
        "-o", tmp_path / "hta",
    )
    assert code == 0 and "no trace for rank" not in err
    assert len(list((tmp_path / "hta").iterdir())) == 2


REGIONS = ("trainer/optimizer-step", "learner/compute-advantages")


def test_summarize_table_at_80_columns_in_a_log(tmp_path: Path) -> None:
    for region in REGIONS:
        role, stage = region.split("/")
        write_ranks(tmp_path, world_size=3, role=role, stage=stage, slow={1: 0.03})
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80")
    result = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert not [line for line in lines if line != line.rstrip()]
    for region in REGIONS:
        assert any(region in line for line in lines), region
    # operator names stay on the line of their self time
    assert not [line for line in lines if line.strip().startswith("aten::")]


def test_version(capsys) -> None:
    from torchstep_prof import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"torchstep-prof {__version__}"
    result = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "--version"],
        env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0 and result.stdout.strip() == f"torchstep-prof {__version__}"


JOB = """
import torch
import torchstep_prof as tsp

with tsp.schedule(steps=[1]), tsp.configure(save_path={save_path!r}, summary=False):
    with tsp.step(1):
        for _ in range(2):  # gradient accumulation: two micro-batches
            with tsp.profile_region("trainer", "forward"):
                torch.ones(64, 64).mm(torch.ones(64, 64)).sum()
        with tsp.profile_region("trainer", "optimizer-step"):
            torch.ones(8).sum()
print("pid", __import__("os").getpid())
"""


def test_end_to_end_on_real_traces_of_two_runs(tmp_path: Path, capsys) -> None:
    """Two real runs of a loop with two micro-batches write into one folder: the CLI uses the
    newest run, names the other, and keeps the micro-batches apart."""
    save = tmp_path / "profile"
    script = tmp_path / "job.py"
    script.write_text(JOB.format(save_path=str(save)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env["PYTHONPATH"] = str(REPO)
    pids = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stderr
        pids.append(int(re.search(r"^pid (\d+)$", done.stdout, re.M)[1]))
    assert len(list(save.iterdir())) == 6

    code, out, err = _run(capsys, "summarize", save, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert_summary_shape(doc)
    assert {r["pid"] for g in doc["groups"] for r in g["ranks"]} == {pids[1]}
    assert [(o["rank"], o["pid"], o["other_pids"]) for o in doc["other_runs"]] == [
        (0, pids[1], [pids[0]])
    ]
    assert f"left out pid {pids[0]}" in err
    code, out, _ = _run(capsys, "summarize", save, "--json", "--pid", pids[0])
    assert {r["pid"] for g in json.loads(out)["groups"] for r in g["ranks"]} == {pids[0]}

    forward = [g for g in doc["groups"] if g["stage"] == "forward"]
    assert [(g["occurrence"], len(g["ranks"])) for g in forward] == [(1, 1), (2, 1)]
    code, _, _ = _run(capsys, "merge", save, "-o", tmp_path / "m.json")
    merged = json.loads((tmp_path / "m.json").read_text())
    tracks = sorted(i["track"] for i in merged["torchstep_prof_merge"]["inputs"])
    assert tracks == [
        "trainer/forward rank 0 step 1",
        "trainer/forward rank 0 step 1 #2",
        "trainer/optimizer-step rank 0 step 1",
    ]
