"""The console summary at exit: rows as data first (records()), rendered second."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

import torchstep_prof as tsp
from script_helpers import run_script as _run_script


def run_script(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    # Wide: every file name fits on its row, so ROW below reads whole rows.
    return _run_script(code, tmp_path, timeout=120, columns=250, **env)


REPO = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^(\S+)\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\S+ \S+|-)\s+(\S+)$")


def table_rows(text: str) -> list[list[str]]:
    """The trace lines of the summary (role, stage, step, rank, wall ms, size, file)."""
    return [list(m.groups()) for m in map(ROW.match, text.splitlines()) if m]


def files_of(rows: list[list[str]], names: list[str]) -> list[str]:
    """The file each row's shortened file cell names: exactly one of ``names`` ends with it."""
    found = []
    for row in rows:
        tail = row[-1].lstrip("…")
        matches = [name for name in names if name.endswith(tail)]
        assert len(matches) == 1, (row, matches)
        found.append(matches[0])
    return found


def test_rendered_rows_match_the_records_and_the_files(tmp_path):
    with tsp.schedule(steps=[1, 2]), tsp.configure(save_path=str(tmp_path), summary=False):
        for n in (1, 2):
            with tsp.step(n):
                with tsp.profile_region("actor", "compute_log_prob"):
                    torch.ones(4, 4).sum()
                with tsp.profile_region("critic", "update"):
                    torch.ones(4, 4).sum()
    data = tsp.records()
    buffer = io.StringIO()
    tsp.print_summary(data, Console(file=buffer, width=200))
    text = buffer.getvalue()
    rows = table_rows(text)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("actor", "compute-log-prob", "1", "0"),
        ("critic", "update", "1", "0"),
        ("actor", "compute-log-prob", "2", "0"),
        ("critic", "update", "2", "0"),
    ]
    assert files_of(rows, os.listdir(tmp_path)) == [os.path.basename(t.path) for t in data.traces]
    assert f"4 trace(s) written to {os.path.relpath(tmp_path)}" in text or f"to {tmp_path}" in text
    assert "profiling cost" in text
    assert "\x1b[" not in text  # a console writing to a buffer gets no colour codes


def test_a_failed_trace_and_a_failed_hook_are_in_the_summary(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    # The failures warn on purpose: captured, so the test run shows no warning that looks like a fault.
    with pytest.warns(tsp.TorchstepProfWarning) as caught:
        with tsp.configure(save_path=str(blocker / "profile"), summary=False), tsp.schedule(steps=[1]):
            with tsp.on_finish("echo boom >&2; exit 3", wait=True):
                with tsp.step(1), tsp.profile_region("actor", "update"):
                    pass
    assert {type(w.message).__name__ for w in caught} == {"TraceWriteWarning", "FinishHookWarning"}
    buffer = io.StringIO()
    tsp.print_summary(tsp.records(), Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert "NOT WRITTEN" in text
    assert "hook on rank 0: failed, exit code 3" in text


def test_the_main_example_prints_a_summary_matching_the_files_on_disk(tmp_path):
    out = tmp_path / "profile"
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "rl_step.py"), "--save-path", str(out)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    on_disk = sorted(os.listdir(out))
    assert len(on_disk) == 10  # 5 regions x steps 2 and 3
    assert sorted(files_of(rows, on_disk)) == on_disk
    for _role, _stage, step, rank, *_ in rows:
        assert step in {"2", "3"} and rank == "0"
    assert "\x1b[" not in result.stdout  # piped to a log: no colour codes
    assert re.search(r"warm-up \d+", result.stdout)


JOB = """
    import torch
    import torchstep_prof as tsp
    with tsp.schedule(steps=[1, 2, 9]), tsp.configure(save_path="profile"{extra}):
        for n in (1, 2, 3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                torch.ones(2).sum()
    print("job done")
"""


def test_summary_false_and_the_environment_switch_turn_it_off(tmp_path):
    shown = run_script(JOB.format(extra=""), tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "trace(s) written" in shown.stdout
    assert "step 9 never ran" in shown.stdout

    off_in_code = run_script(JOB.format(extra=", summary=False"), tmp_path)
    assert off_in_code.returncode == 0 and "job done" in off_in_code.stdout
    assert "trace(s) written" not in off_in_code.stdout

    off_by_env = run_script(JOB.format(extra=""), tmp_path, TORCHSTEP_PROF_SUMMARY="0")
    assert off_by_env.returncode == 0 and "job done" in off_by_env.stdout
    assert "trace(s) written" not in off_by_env.stdout


def test_a_forked_child_prints_no_summary(tmp_path):
    code = """
        import os, sys, torch
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.configure(save_path="profile"):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                torch.ones(2).sum()
                pid = os.fork()
                if pid == 0:
                    print("child", os.getpid(), flush=True)
                    # The inherited Python atexit handlers (the summary's among them) run, then
                    # os._exit as multiprocessing's workers do: a forked child of a process that
                    # used Kineto can hang in Kineto's C++ exit handlers (a torch issue).
                    import atexit
                    atexit._run_exitfuncs()
                    os._exit(0)
                os.waitpid(pid, 0)
        print("parent", os.getpid(), flush=True)
    """
    result = run_script(code, tmp_path)
    assert result.returncode == 0, result.stderr
    parent_pid = re.search(r"^parent (\d+)$", result.stdout, re.M).group(1)
    titles = re.findall(r"torchstep_prof rank 0 of 1 \(pid (\d+)\)", result.stdout)
    assert titles == [parent_pid]
    assert all(f"pid{parent_pid}_" in name for name in os.listdir(tmp_path / "profile"))


def test_exit_summary_at_80_columns_in_a_log(tmp_path):
    """One line per trace, occ only when a region ran twice in a step, no line over 80
    columns, no trailing spaces, every region name whole on its line."""
    code = """
        import torch
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.configure(save_path="profile"):
            with tsp.step(1):
                for _ in range(2):
                    with tsp.profile_region("trainer", "optimizer-step"):
                        torch.ones(2).sum()
                with tsp.profile_region("learner", "compute-advantages"):
                    torch.ones(2).sum()
    """
    result = run_script(code, tmp_path, COLUMNS="80")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80, result.stdout
    assert not [line for line in lines if line != line.rstrip()]
    rows = [line.split() for line in lines if line.startswith(("trainer ", "learner "))]
    assert len(rows) == len(os.listdir(tmp_path / "profile")) == 3
    assert all(row[1] in ("optimizer-step", "compute-advantages") for row in rows)
    occurrence_column = "occ" in next(line for line in lines if line.startswith("role")).split()
    occurrences = [
        json.loads((tmp_path / "profile" / name).read_text())["torchstep_prof"].get("occurrence", 1)
        for name in os.listdir(tmp_path / "profile")
    ]
    assert occurrence_column == (max(occurrences) > 1)


def _records(folder: str, stages: list[str], occurrences: list[int]) -> "tsp.ProfilingRecords":
    pid = os.getpid()
    traces = tuple(
        tsp.TraceRecord(
            role="learner", stage=stage, step=3, rank=0, world_size=1, discrete=True,
            path=os.path.join(folder, f"learner_{stage}_step3_rank0-of-1_pid{pid}_2026120110{i:02d}31{i:03d}.json"),
            occurrence=occ, size_bytes=2048, wall_s=0.0123,
        )
        for i, (stage, occ) in enumerate(zip(stages, occurrences))
    )
    return tsp.ProfilingRecords(traces=traces)


def test_file_names_are_shortened_or_listed_below_when_narrow():
    data = _records("outputs/profile", ["compute-advantages", "optimizer-step", "optimizer-step"], [1, 1, 2])
    for width in (80, 60):
        buffer = io.StringIO()
        tsp.print_summary(data, Console(file=buffer, width=width))
        lines = buffer.getvalue().splitlines()
        assert max(map(len, lines)) <= width or width == 60 and all(
            len(line) <= width or line.startswith("  learner_") for line in lines
        )
        assert not [line for line in lines if line != line.rstrip()]
        rows = [line for line in lines if line.startswith("learner ")]
        assert len(rows) == 3 and [r.split()[3] for r in rows] == ["1", "1", "2"]  # occ
        names = [os.path.basename(t.path) for t in data.traces]
        if width == 80:  # the time of day tells the rows apart
            assert [r.split()[-1] for r in rows] == [f"…{n[-14:]}" for n in names]
        else:  # no room for a file column: the names, whole, under the table
            assert [line.strip() for line in lines if line.startswith("  learner_")] == names


def test_traces_started_in_the_same_millisecond_never_share_a_file_cell():
    # Two regions of one step, a third in the next step, all started in the same millisecond
    # (quick regions do): the time of day no longer tells their rows apart.
    pid = os.getpid()
    stamp = "20261201103107042"
    traces = tuple(
        tsp.TraceRecord(
            role=role, stage=stage, step=step, rank=0, world_size=1, discrete=True,
            path=os.path.join("outputs/profile", f"{role}_{stage}_step{step}_rank0-of-1_pid{pid}_{stamp}.json"),
            size_bytes=2048, wall_s=0.0123,
        )
        for role, stage, step in [("actor", "compute-log-prob", 1), ("critic", "update", 1), ("actor", "compute-log-prob", 2)]
    )  # fmt: skip
    later = tsp.TraceRecord(
        role="critic", stage="update", step=2, rank=0, world_size=1, discrete=True,
        path=f"outputs/profile/critic_update_step2_rank0-of-1_pid{pid}_20261201103107043.json",
        size_bytes=2048, wall_s=0.0123,
    )  # fmt: skip
    data = tsp.ProfilingRecords(traces=(*traces, later))
    buffer = io.StringIO()
    tsp.print_summary(data, Console(file=buffer, width=250))
    rows = table_rows(buffer.getvalue())
    cells = [row[-1] for row in rows]
    assert len(rows) == 4 and len(set(cells)) == 4, buffer.getvalue()
    names = [os.path.basename(t.path) for t in data.traces]
    assert files_of(rows, names) == names
    assert cells[-1] == "…103107043.json"  # a row whose time is its own keeps the short cell


LONG_ROLE = "-".join(["actor"] * 14)[:79] + "x"  # 80 characters: the longest label kept whole


@pytest.mark.parametrize("role", [LONG_ROLE, "r" * 46, "r" * 60, "p" + "-q" * 30])
def test_step_rank_wall_time_and_size_survive_long_roles_at_80_columns(role):
    pid = os.getpid()
    traces = tuple(
        tsp.TraceRecord(
            role=role, stage="compute-log-prob", step=1000 + i, rank=3, world_size=8, discrete=True,
            path=f"outputs/profile/{role}_compute-log-prob_step{1000 + i}_rank3-of-8_pid{pid}_202612011000{i:02d}31000.json",
            occurrence=1 + i, size_bytes=5_000_000, wall_s=4.9123,
        )
        for i in range(2)
    )  # fmt: skip
    buffer = io.StringIO()
    tsp.print_summary(tsp.ProfilingRecords(traces=traces), Console(file=buffer, width=80))
    text = buffer.getvalue()
    lines = text.splitlines()
    table = lines[1 : lines.index("files, in the order of the rows:")]
    assert max(map(len, table)) <= 80, text
    assert table[0].split() == ["role", "stage", "step", "occ", "rank", "wall", "ms", "size"], text
    rows = [line for line in table if "MiB" in line]
    assert len(rows) == 2, text
    for i, row in enumerate(rows):  # every number whole: nothing cut to "4.9 K…" or gone
        assert row.split()[-6:] == [str(1000 + i), str(1 + i), "3", "4912.3", "4.8", "MiB"], text
    # Only the role folds, after a "-" (or is cut with "…" when it has none): never mid-word.
    cells = [line[: table[0].index("stage")].rstrip() for line in table[2:]]
    assert all(cell.endswith(("-", "…")) or role.endswith(cell) for cell in cells if cell), text
    assert [line.strip() for line in lines if line.startswith("  ")] == [os.path.basename(t.path) for t in traces]


@pytest.mark.parametrize("columns", [80, 200])
def test_headers_stay_whole_over_short_labels(tmp_path, columns):
    """Role ``gpt``, stage ``fw``: narrower than their headers, which must still read whole."""
    code = """
        import torch
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.configure(save_path="profile"), tsp.step(1):
            with tsp.profile_region("gpt", "fw"):
                torch.ones(2).sum()
    """
    result = _run_script(code, tmp_path, timeout=120, columns=columns)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("ro"))
    assert header.split()[:4] == ["role", "stage", "step", "rank"], result.stdout
    assert "…" not in header
    assert [line.split()[:3] for line in lines if line.startswith("gpt ")] == [["gpt", "fw", "1"]]
    assert max(map(len, lines)) <= columns


def test_a_long_run_shows_its_longest_traces_and_names_the_command_for_the_rest(tmp_path):
    """30 traces in one step: the table holds the 20 longest, longest first, and says how many
    more there are and which command lists them; `ls` then lists every one."""
    code = """
        import time
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1]), tsp.configure(save_path="profile"), tsp.step(1):
            for i in range(30):
                with tsp.profile_region("loop", f"region{i:02d}"):
                    time.sleep(0.001 * (i % 7))
    """
    result = _run_script(code, tmp_path, timeout=120, columns=80)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("loop ")]
    assert len(rows) == 20, result.stdout
    walls = [float(row[4]) for row in rows]
    assert walls == sorted(walls, reverse=True)
    every = {}
    for name in os.listdir(tmp_path / "profile"):
        meta = json.loads((tmp_path / "profile" / name).read_text())["torchstep_prof"]
        every[meta["stage"]] = meta
    assert len(every) == 30
    assert "10 more not shown (the table holds the 20 longest): torchstep-prof ls profile" in lines
    listing = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "ls", "profile"], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert sum(line.startswith("loop ") or " loop " in line for line in listing.stdout.splitlines()) == 30


def test_labels_with_control_characters_print_escaped():
    traces = (
        tsp.TraceRecord(
            role="evil", stage="x", step=1, rank=0, world_size=1, discrete=True, path=None,
            error="boom\x1b[2J\nforged line",
        ),
    )  # fmt: skip
    buffer = io.StringIO()
    tsp.print_summary(tsp.ProfilingRecords(traces=traces), Console(file=buffer, width=120))
    text = buffer.getvalue()
    assert "\x1b" not in text and "forged line" not in text.split("\n")
    assert "boom\\x1b[2J\\nforged line" in text


def test_a_failing_hook_is_one_warning_line_and_one_summary_line(tmp_path):
    """A hook whose command holds a newline fails: one warning line, one line in the summary,
    each whole (the newline shown as \\n), and the summary does not say the failure twice."""
    code = """
        import torchstep_prof as tsp
        cmd = "echo 'oops' >&2; echo 'second\\nline' >/dev/null; exit 3"
        with tsp.configure(save_path="profile"), tsp.on_finish(cmd), tsp.schedule(steps=[1]), tsp.step(1):
            with tsp.profile_region("actor", "update"):
                pass
    """
    result = run_script(code, tmp_path)
    assert result.returncode == 0, result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if "exit code 3" in line]
    assert len(said) == 2, result.stdout + result.stderr
    (warning,) = [line for line in said if "FinishHookWarning" in line]
    assert "echo 'second\\nline' >/dev/null; exit 3" in warning
    (summary,) = [line for line in said if line.startswith("hook on rank 0")]
    assert summary.startswith("hook on rank 0: failed, exit code 3, ") and summary.endswith("; last stderr line: 'oops'")
    assert not [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("line' >/dev/null")]
