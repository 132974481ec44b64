"""Any file the parser cannot handle is named and skipped by every trace
command, and absurd values (a ts of 1e300, negative durations, NaN) do not wreck the tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trace_factory import write_absurd, write_bad_files, write_ranks

REPO = Path(__file__).resolve().parents[1]
WIDTH = 80


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("robust")
    written = write_ranks(root, world_size=2, steps=(1,))
    bad = write_bad_files(root, written[0].path)
    absurd = {
        "huge_ts": write_absurd(root, written[0].path, ts=1e300),
        "negative_dur": write_absurd(root, written[0].path, dur=-5),
        "nan": write_absurd(root, written[0].path, dur=float("nan"), ts=float("nan")),
    }
    return {"root": root, "written": written, "bad": bad, "absurd": absurd}


def _cli(*argv: object, columns: int = WIDTH) -> subprocess.CompletedProcess[str]:
    """The command in a subprocess whose stdout is a pipe (a log), as users run it."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS=str(columns))
    return subprocess.run(
        [sys.executable, "-m", "torchstep_prof", *map(str, argv)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_bad_named(folder: dict, text: str) -> None:
    for kind, path in folder["bad"].items():
        assert f"skipped {path}" in text or f"{path}:" in text, kind


def test_summarize_names_and_skips_every_bad_file(folder: dict) -> None:
    result = _cli("summarize", folder["root"], "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # A ts of 1e300 or NaN makes a file corrupt (docs/cli.md), a negative duration does not.
    absurd = [str(folder["absurd"][kind]) for kind in ("huge_ts", "nan")]
    expected = [str(p) for p in folder["bad"].values()] + absurd
    assert sorted(doc["unreadable"]) == sorted(expected)
    _assert_bad_named(folder, result.stderr)
    assert "RecursionError" in result.stderr  # the deep file's reason says what happened
    walls = [r["wall_ms"] for g in doc["groups"] for r in g["ranks"]]
    assert all(0 <= w < 1e14 for w in walls), walls  # finite, never 1e297 or NaN


@pytest.mark.parametrize("command", ["ls", "summarize"])
def test_tables_stay_within_80_columns_with_absurd_values(folder: dict, command: str) -> None:
    result = _cli(command, folder["root"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The negative duration is a row; 1e300 and NaN are skipped files, named on stderr (ls) or
    # under the table (summarize).
    assert any("absurd-dur " in line or line.endswith("absurd-dur") for line in lines), result.stdout
    named = result.stdout if command == "summarize" else result.stderr
    assert all(f"absurd-{kind}_" in named for kind in ("ts", "dur-ts")), named
    if command == "summarize":  # ls and the skipped list print whole paths, never folded
        table = result.stdout.split("Skipped")[0].splitlines()
        assert max(map(len, table)) <= WIDTH, result.stdout
    assert not [line for line in lines if line != line.rstrip()]
    assert "nan" not in result.stdout.lower()


def test_merge_and_hta_skip_the_bad_files(folder: dict, tmp_path: Path) -> None:
    merged = _cli("merge", folder["root"], "-o", tmp_path / "m.json")
    assert merged.returncode == 0, merged.stderr
    _assert_bad_named(folder, merged.stderr)
    def no_constant(name: str) -> None:
        raise AssertionError(f"{name} in the merged trace: not strict JSON")

    doc = json.loads((tmp_path / "m.json").read_text(), parse_constant=no_constant)
    tracks = [i["track"] for i in doc["torchstep_prof_merge"]["inputs"]]
    assert "actor/update rank 0 step 1" in tracks and "actor/update rank 1 step 1" in tracks
    hta = _cli(
        "hta", folder["root"], "--role", "actor", "--stage", "update", "--step", 1,
        "-o", tmp_path / "hta",
    )
    assert hta.returncode == 0, hta.stderr
    _assert_bad_named(folder, hta.stderr)
    assert len(list((tmp_path / "hta").iterdir())) == 2


def test_only_bad_files_exit_1_naming_each(folder: dict, tmp_path: Path) -> None:
    bad_only = tmp_path / "bad"
    write_bad_files(bad_only, folder["written"][0].path)
    for command in ("ls", "summarize"):
        result = _cli(command, bad_only)
        assert result.returncode == 1, (command, result.stderr)
        assert "Traceback" not in result.stderr
        assert "7 file(s) skipped" in result.stderr


def test_no_trace_command_imports_torch(folder: dict, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from torchstep_prof.cli import main\n"
        f"root = {str(folder['root'])!r}\n"
        "for argv in (['ls', root], ['summarize', root, '--json'],\n"
        f"             ['merge', root, '-o', {str(tmp_path / 'm.json')!r}],\n"
        "             ['hta', root, '--role', 'actor', '--stage', 'update', '--step', '1',\n"
        f"              '-o', {str(tmp_path / 'hta')!r}]):\n"
        "    assert main(argv) == 0, argv\n"
        "print('torch' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False"


# --- absurd clocks: a base time or a start no date can be written for ---------------------------


def _with_clock(directory: Path, source: Path, stage: str, base: object = None, step_ts: object = None) -> Path:
    """A copy of the real trace ``source`` under a trace name of stage ``stage``, with its
    ``baseTimeNanoseconds`` and/or its ``ProfilerStep`` range's ``ts`` replaced."""
    trace = json.loads(source.read_text())
    if base is not None:
        trace["baseTimeNanoseconds"] = base
    if step_ts is not None:
        for event in trace["traceEvents"]:
            if str(event.get("name", "")).startswith("ProfilerStep#"):
                event["ts"] = step_ts
    trace["torchstep_prof"] = dict(trace["torchstep_prof"], stage=stage, rank=0, world_size=2)
    path = directory / f"actor_{stage}_step1_rank0-of-2_pid1_20260101000000000.json"
    path.write_text(json.dumps(trace))  # json writes NaN as such
    return path


def test_an_absurd_base_time_is_named_and_skipped_by_every_command(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    written = write_ranks(root, world_size=2, steps=(1,))
    bad = {
        _with_clock(root, written[0].path, "huge-base", base=10**300): "absurd baseTimeNanoseconds",
        _with_clock(root, written[0].path, "nan-base", base=float("nan")): "absurd baseTimeNanoseconds",
        _with_clock(root, written[0].path, "text-base", base="soon"): "absurd baseTimeNanoseconds",
        _with_clock(root, written[0].path, "before-1970", step_ts=-1e16): "absurd start time",
    }

    def assert_named(result: subprocess.CompletedProcess[str]) -> None:
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr
        for path, reason in bad.items():
            assert f"{path}: {reason}" in result.stdout + result.stderr, (path, result.stderr)

    assert_named(_cli("ls", root))
    summary = _cli("summarize", root, "--json")
    assert_named(summary)
    assert sorted(json.loads(summary.stdout)["unreadable"]) == sorted(map(str, bad))
    assert_named(_cli("summarize", root))
    merged = _cli("merge", root, "-o", tmp_path / "m.json")
    assert_named(merged)
    doc = json.loads((tmp_path / "m.json").read_text())
    assert len(doc["torchstep_prof_merge"]["inputs"]) == 2  # the two sane ranks only
    # The output's clock is the sane traces' one: not stretched to an absurd base.
    assert doc["baseTimeNanoseconds"] == min(
        json.loads(w.path.read_text())["baseTimeNanoseconds"] for w in written
    )
    hta = _cli("hta", root, "--role", "actor", "--stage", "huge-base", "--step", 1, "-o", tmp_path / "h")
    assert hta.returncode == 1 and f"skipped {next(iter(bad))}" in hta.stderr
    assert "Traceback" not in hta.stderr
    pytest.importorskip("plotly", reason="plotly is not installed (the [report] extra)")
    page = tmp_path / "r.html"
    report = _cli("report", root, "-o", page)
    assert_named(report)
    text = page.read_text()
    assert all(f"{path.name}</code>: absurd" in text for path in bad)


# --- special files named *.json: never opened for reading, always named --------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs fifos and /dev/zero")
def test_special_files_are_named_and_skipped_without_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "traces"
    write_ranks(root, world_size=2, steps=(1,))
    (root / "sub").mkdir()
    os.symlink(root / "deleted.json", root / "gone.json")
    os.symlink("/dev/zero", root / "zero.json")
    os.mkfifo(root / "pipe.json")
    os.mkfifo(root / "sub" / "pipe.json")  # only read with -r
    os.mkdir(root / "folder.json")  # a folder is not a file: not named
    reasons = {
        root / "gone.json": "a symbolic link to nothing",
        root / "zero.json": "not a regular file (a character device)",
        root / "pipe.json": "not a regular file (a named pipe)",
    }

    def check(result: subprocess.CompletedProcess[str], expected: dict) -> None:
        assert result.returncode == 0, result.stderr
        text = result.stdout + result.stderr
        for path, reason in expected.items():
            assert f"{path}: {reason}" in text, (path, text)
        assert "folder.json" not in text

    # A hang (reading a fifo or /dev/zero) fails on the subprocess timeout instead of stalling.
    check(_cli("ls", root), reasons)
    doc = _cli("summarize", root, "--json")
    check(doc, reasons)
    assert sorted(json.loads(doc.stdout)["unreadable"]) == sorted(map(str, reasons))
    check(_cli("summarize", root), reasons)
    check(_cli("summarize", root, "-r"), {**reasons, root / "sub" / "pipe.json": "not a regular file (a named pipe)"})
    check(_cli("merge", root, "-o", tmp_path / "m.json"), reasons)
    pytest.importorskip("plotly", reason="plotly is not installed (the [report] extra)")
    page = tmp_path / "r.html"
    check(_cli("report", root, "-o", page), reasons)
    assert "zero.json</code>: not a regular file (a character device)" in page.read_text()


# --- long labels: the numbers survive at 80 columns, only the label folds ------------------------

LONG_ROLE = "-".join(["actor"] * 14)[:79] + "x"  # 80 characters, as long as the library writes


def _folded_at_separators(lines: list[str], text: str) -> bool:
    """Whether ``text`` is printed as consecutive ``lines`` broken only after a separator."""
    for start in range(len(lines)):
        joined, end = "", start
        while len(joined) < len(text) and end < len(lines):
            joined += lines[end]
            end += 1
        if joined == text:
            return all(line.endswith(("-", "/", " ")) for line in lines[start : end - 1])
    return False


def test_summarize_keeps_step_rank_and_wall_time_with_an_80_character_role(tmp_path: Path) -> None:
    write_ranks(tmp_path, world_size=2, steps=(1000,), role=LONG_ROLE, stage="compute-log-prob", slow={1: 0.02})
    write_ranks(tmp_path, world_size=2, steps=(7,), role="r" * 80, stage="update")
    doc = json.loads(_cli("summarize", tmp_path, "--json").stdout)
    result = _cli("summarize", tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    table = result.stdout.split("top ops (self ms):")[0].splitlines()[:-1]
    assert max(map(len, lines)) <= WIDTH, result.stdout
    header = next(line for line in table if line.startswith("region"))
    assert header.split() == ["region", "step", "rank", "wall", "ms", "x", "median"], result.stdout
    from torchstep_prof.traces.analysis.summarize import format_ms

    for group in doc["groups"]:
        # Each rank's row holds its rank and whole wall time; the group's first row, the step too.
        # The JSON's wall is rounded to 3 decimals, the table's cell from the unrounded value:
        # 7.2504 ms is "7.25" there and "7.3" here, so either neighbour of the JSON value is right.
        rows = [[str(rank["rank"]), {format_ms(rank["wall_ms"] + d) for d in (-5e-4, 0, 5e-4)}] for rank in group["ranks"]]
        for rank_cell, walls in rows:
            assert any(_holds_in_a_row(line, [rank_cell, wall]) for line in table for wall in walls), result.stdout
        assert any(_holds_in_a_row(line, [str(group["step"]), rank_cell, wall])
                   for line in table for rank_cell, walls in rows for wall in walls), result.stdout  # fmt: skip
    # Region names fold after a "-" or "/" only, in the table and in the headings below it.
    assert _folded_at_separators([line.split("  ")[0] for line in table], f"{LONG_ROLE}/compute-log-prob")
    heading = f"{LONG_ROLE}/compute-log-prob step 1000, top ops (self ms):"
    assert _folded_at_separators(lines, heading), result.stdout
    assert not [line for line in lines if line != line.rstrip()]


def _holds_in_a_row(line: str, cells: list[str]) -> bool:
    words = line.split()
    return any(words[i : i + len(cells)] == cells for i in range(len(words)))


def test_absurd_event_times_are_named_as_skipped_by_every_command(folder: dict, tmp_path: Path) -> None:
    """A trace whose events carry a ts of 1e300 (or NaN) is no 0.0 ms row: ls,
    summarize, merge and report name it as skipped, saying why."""
    huge, nan = folder["absurd"]["huge_ts"], folder["absurd"]["nan"]
    runs = {
        "ls": _cli("ls", folder["root"]),
        "summarize": _cli("summarize", folder["root"]),
        "merge": _cli("merge", folder["root"], "-o", tmp_path / "m.json"),
        "report": _cli("report", folder["root"], "-o", tmp_path / "r.html"),
    }
    for command, result in runs.items():
        assert result.returncode == 0, (command, result.stderr)
        # summarize's table lists its skipped files under the table, the others on stderr.
        text = result.stdout if command == "summarize" else result.stderr
        prefix = "" if command == "summarize" else "skipped "
        for path in (huge, nan):
            assert f"{prefix}{path}: absurd times" in text, (command, text)
    assert "ts=1e+300" in runs["ls"].stderr
    ls_rows = runs["ls"].stdout
    assert str(huge) not in ls_rows and str(nan) not in ls_rows
    summary = runs["summarize"].stdout
    assert f"{huge}: absurd times" in summary.replace("\n", "")  # listed under the table
    doc = json.loads((tmp_path / "m.json").read_text())
    assert str(huge) not in [i["file"] for i in doc["torchstep_prof_merge"]["inputs"]]
    page = (tmp_path / "r.html").read_text()
    assert f"{huge.name}</code>: absurd times" in page
