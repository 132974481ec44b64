"""Reading traces back: load, describe, scan, rank operators by self time."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trace_factory import (
    write_foreign,
    write_foreign_trace,
    write_not_json,
    write_trace,
    write_truncated,
)

from torchstep_prof.traces.reading.files import (
    OpTime,
    TraceFilter,
    TraceReadError,
    find_trace_files,
    load_trace,
    read_trace_info,
    scan_traces,
    started_at,
    top_ops,
)

BAD_NAME = "actor_update_step9_rank9-of-10_pid1_20260101000000000.json"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Traces of two ranks, a gzipped one, one described only by its name, and bad files."""
    root = tmp_path_factory.mktemp("traces")
    written = {
        "rank0": write_trace(root, step=1, rank=0, world_size=2, sleep_s=0.02),
        "rank1": write_trace(root, step=1, rank=1, world_size=2),
        "gz": write_trace(root, role="critic", stage="compute_values", step=2, gzip=True),
        "name_only": write_trace(root, role="ref", stage="fwd", step=3, metadata=False),
    }
    bad = {
        "truncated": write_truncated(root, written["rank0"].path, BAD_NAME),
        "not_json": write_not_json(root, "notes.json"),
        "foreign": write_foreign(root, "config.json"),
        "foreign_trace": write_foreign_trace(root, written["rank0"].path, "engine_trace.json"),
    }
    (root / "README.txt").write_text("not a trace: never read")
    return {"root": root, "written": written, "bad": bad}


def test_load_trace_reads_plain_and_gzipped_json(folder: dict) -> None:
    plain = load_trace(folder["written"]["rank0"].path)
    zipped = load_trace(folder["written"]["gz"].path)
    assert folder["written"]["gz"].path.read_bytes()[:2] == b"\x1f\x8b"
    for trace in (plain, zipped):
        assert isinstance(trace["traceEvents"], list) and "baseTimeNanoseconds" in trace


def test_load_trace_works_without_orjson(folder: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    with_orjson = load_trace(folder["written"]["rank0"].path)
    monkeypatch.setitem(sys.modules, "orjson", None)  # makes `import orjson` fail
    assert load_trace(folder["written"]["rank0"].path) == with_orjson


@pytest.mark.parametrize("kind", ["truncated", "not_json"])
def test_load_trace_names_the_file_it_cannot_parse(folder: dict, kind: str) -> None:
    path = folder["bad"][kind]
    with pytest.raises(TraceReadError, match="not valid JSON") as caught:
        load_trace(path)
    assert str(path) in str(caught.value)


def test_load_trace_rejects_json_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(TraceReadError, match="not a JSON object"):
        load_trace(path)


def test_load_trace_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceReadError, match="cannot read"):
        load_trace(tmp_path / "missing.json")


def test_trace_info_comes_from_the_metadata(folder: dict) -> None:
    written = folder["written"]["rank0"]
    trace = load_trace(written.path)
    info = read_trace_info(written.path)
    assert (info.role, info.stage, info.step, info.rank, info.world_size) == (
        "actor",
        "update",
        1,
        0,
        2,
    )
    step_event = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#1")
    assert info.wall_ms == pytest.approx(step_event["dur"] / 1000)
    assert info.wall_ms >= written.sleep_s * 1000
    assert info.base_time_ns == trace["baseTimeNanoseconds"]
    assert info.size_bytes == written.path.stat().st_size
    assert info.start_ns == pytest.approx(written.started_ns, abs=5e6)  # the trace's own clock
    assert info.top_ops == ()  # only computed when asked for


def test_trace_info_labels_are_the_sanitized_ones(folder: dict) -> None:
    info = read_trace_info(folder["written"]["gz"].path)
    assert (info.role, info.stage, info.step) == ("critic", "compute-values", 2)


def test_trace_info_falls_back_to_the_file_name(folder: dict) -> None:
    written = folder["written"]["name_only"]
    assert "torchstep_prof" not in load_trace(written.path)
    info = read_trace_info(written.path)
    assert (info.role, info.stage, info.step, info.rank, info.world_size) == ("ref", "fwd", 3, 0, 1)


def test_metadata_wins_over_the_file_name(folder: dict, tmp_path: Path) -> None:
    renamed = tmp_path / "actor_update_step7_rank5-of-8_pid1_20260101000000000.json"
    shutil.copy(folder["written"]["rank1"].path, renamed)
    info = read_trace_info(renamed)
    assert (info.step, info.rank, info.world_size) == (1, 1, 2)


def test_rank_falls_back_to_distributed_info(folder: dict) -> None:
    trace = load_trace(folder["written"]["rank1"].path)
    trace["torchstep_prof"] = {"role": "actor", "stage": "update", "step": 4}
    info = read_trace_info("elsewhere/trace.json", trace)
    assert (info.step, info.rank, info.world_size) == (4, 1, 2)


def test_wall_time_without_a_profiler_step_is_the_span_of_the_events() -> None:
    trace = {
        "torchstep_prof": {"role": "a", "stage": "b", "step": 1},
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {}},
            {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 1000, "dur": 500},
            {"ph": "X", "cat": "cpu_op", "name": "y", "pid": 1, "tid": 1, "ts": 3000, "dur": 2000},
        ],
    }
    info = read_trace_info("t.json", trace)
    assert info.wall_ms == pytest.approx(4.0)
    assert info.base_time_ns is None and info.start_ns is None


def test_a_json_without_trace_events_is_not_a_trace(folder: dict) -> None:
    with pytest.raises(TraceReadError, match="no traceEvents"):
        read_trace_info(folder["bad"]["foreign"])


def test_a_chrome_trace_that_is_not_ours_is_named_as_such(folder: dict) -> None:
    with pytest.raises(TraceReadError, match="not a torchstep_prof one"):
        read_trace_info(folder["bad"]["foreign_trace"])


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: object = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_top_ops_ranks_operators_by_self_time() -> None:
    trace = {
        "traceEvents": [
            _x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
            _x("aten::linear", 10, 300),  # self: 300 - 200 - 50 = 50
            _x("aten::addmm", 20, 200),
            _x("aten::t", 230, 50),
            _x("aten::addmm", 400, 100),  # a second call adds up: 300 in all
            _x("forward", 500, 400, cat="python_function"),  # not an operator
            _x("aten::mul", 510, 40, tid=2),  # another thread: not a child of anything here
            _x("actor/update", 600, 300),  # a region's range: cpu_op, but not an operator
            _x("aten::add", 610, 10),
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {}},
        ]
    }
    assert top_ops(trace, 10) == (
        OpTime(name="aten::addmm", self_ms=0.3),
        OpTime(name="aten::linear", self_ms=0.05),
        OpTime(name="aten::t", self_ms=0.05),
        OpTime(name="aten::mul", self_ms=0.04),
        OpTime(name="aten::add", self_ms=0.01),
    )
    assert [op.name for op in top_ops(trace, 2)] == ["aten::addmm", "aten::linear"]
    assert top_ops(trace, 0) == ()


def test_top_ops_of_a_real_trace(folder: dict) -> None:
    written = folder["written"]["rank0"]
    trace = load_trace(written.path)
    ops = top_ops(trace, 3)
    assert 1 <= len(ops) <= 3
    assert all(op.name.startswith("aten::") for op in ops)
    assert [op.self_ms for op in ops] == sorted((op.self_ms for op in ops), reverse=True)
    assert sum(op.self_ms for op in top_ops(trace, 100)) <= read_trace_info(written.path).wall_ms


def test_find_trace_files_lists_json_and_gz_only(folder: dict) -> None:
    names = [os.path.basename(p) for p in find_trace_files(folder["root"])]
    assert names == sorted(names)
    assert "README.txt" not in names
    assert folder["written"]["gz"].path.name in names and len(names) == 8


def test_scan_reports_bad_files_and_keeps_going(folder: dict) -> None:
    infos, unreadable = scan_traces(folder["root"], top=2)
    assert [(i.role, i.stage, i.step, i.rank) for i in infos] == [
        ("actor", "update", 1, 0),
        ("actor", "update", 1, 1),
        ("critic", "compute-values", 2, 0),
        ("ref", "fwd", 3, 0),
    ]
    assert all(0 < len(i.top_ops) <= 2 for i in infos)
    assert sorted(u.path for u in unreadable) == sorted(str(p) for p in folder["bad"].values())
    reasons = {Path(u.path).name: u.reason for u in unreadable}
    assert "not valid JSON" in reasons[BAD_NAME]
    assert "not a torchstep_prof one" in reasons["engine_trace.json"]


def test_scan_filters_and_skips_files_whose_names_do_not_match(folder: dict) -> None:
    infos, unreadable = scan_traces(folder["root"], TraceFilter(ranks=[1]))
    assert [i.path for i in infos] == [str(folder["written"]["rank1"].path)]
    # The truncated file is named for rank 9: never opened. Unnamed files still are.
    assert str(folder["bad"]["truncated"]) not in {u.path for u in unreadable}
    assert str(folder["bad"]["not_json"]) in {u.path for u in unreadable}


def test_filters_compare_sanitized_labels(folder: dict) -> None:
    filters = TraceFilter(roles=["critic"], stages=["compute_values"], steps=[2])
    assert filters.stages == ("compute-values",)
    infos, _ = scan_traces(folder["root"], filters)
    assert [i.path for i in infos] == [str(folder["written"]["gz"].path)]
    # A label with nothing left matches the files it names, by its code points.
    assert TraceFilter(roles=["///"]).roles == ("U+2F+2F+2F",)


def test_scan_recursive_and_lists_of_paths(folder: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from torchstep_prof.cli import main

    nested = tmp_path / "node1"
    nested.mkdir()
    shutil.copy(folder["written"]["rank1"].path, nested)
    assert scan_traces(tmp_path) == ([], [])
    capsys.readouterr()
    assert main(["summarize", str(tmp_path), "-r", "--json"]) == 0
    assert [r["rank"] for g in json.loads(capsys.readouterr().out)["groups"] for r in g["ranks"]] == [1]
    infos, unreadable = scan_traces([folder["written"]["gz"].path, folder["bad"]["foreign"]])
    assert len(infos) == 1 and len(unreadable) == 1


def test_started_at_prefers_the_trace_clock(folder: dict, tmp_path: Path) -> None:
    written = folder["written"]["rank0"]
    info = read_trace_info(written.path)
    assert started_at(info) == pytest.approx(written.started_ns / 1e9, abs=0.005)
    trace = load_trace(written.path)
    del trace["baseTimeNanoseconds"]
    no_clock = read_trace_info(written.path, trace)
    assert started_at(no_clock) == pytest.approx(written.started_ns / 1e9, abs=0.002)  # name


def test_gzip_detected_by_content_not_name(folder: dict, tmp_path: Path) -> None:
    path = tmp_path / "actor_update_step1_rank0-of-1_pid1_20260101000000000.json"
    path.write_bytes(gzip.compress(folder["written"]["rank1"].path.read_bytes()))
    assert json.dumps(load_trace(path)) == json.dumps(load_trace(folder["written"]["rank1"].path))


def test_occurrence_pid_and_fused_roles_come_from_the_trace(tmp_path: Path) -> None:
    second = write_trace(tmp_path, role="trainer", stage="forward", occurrence=2, pid=4242)
    info = read_trace_info(second.path)
    assert (info.occurrence, info.pid, info.fused, info.roles) == (2, 4242, False, ("trainer",))
    older = read_trace_info(write_trace(tmp_path / "old", role="ref", stage="fwd").path)
    assert older.occurrence == 1  # written before occurrences existed
    fused = write_trace(
        tmp_path / "fused", role="eval-trainer", stage="train", discrete=False,
        regions=("eval/run", "trainer/forward"),
    )
    info = read_trace_info(fused.path)
    assert info.fused and info.roles == ("eval", "trainer")
    assert TraceFilter(roles=["trainer"]).matches(info)
    assert not TraceFilter(roles=["critic"]).matches(info)
    assert TraceFilter(pids=[os.getpid()]).matches(info)
    assert not TraceFilter(pids=[1]).matches(info)


@pytest.mark.parametrize(
    "content",
    [
        b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # RecursionError
        b"\x1f\x8b" + b"garbage" * 20,  # BadGzipFile
        b'{"a": "caf\xe9"}',  # UnicodeDecodeError
        b"[1, 2, 3]",
        b"",
    ],
)
def test_load_trace_turns_any_failure_into_a_trace_read_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceReadError, match="bad.json"):
        load_trace(path)
    infos, unreadable = scan_traces(tmp_path)
    assert infos == [] and [u.path for u in unreadable] == [str(path)]


def test_absurd_times_give_a_finite_wall_time(tmp_path: Path) -> None:
    from trace_factory import write_absurd

    source = write_trace(tmp_path / "src", sleep_s=0.01)
    info = read_trace_info(write_absurd(tmp_path, source.path, dur=-5))
    assert 0 <= info.wall_ms < 1e14  # a negative duration is ignored like a missing one
    # Times that are no time make the file corrupt (docs/cli.md, absurd values): named, never a 0.0 ms row.
    for changes in ({"ts": 1e300}, {"dur": float("nan")}, {"dur": 1e300}):
        path = write_absurd(tmp_path, source.path, **changes)
        with pytest.raises(TraceReadError, match=r"absurd times \(2 event\(s\)"):
            read_trace_info(path)


# --- a gzip that inflates far past its size ------------------------------------------------------

BOMB_MIB = 256


def _gzip_padded(source: Path, out: Path, mib: int) -> Path:
    """``source``'s JSON with ``mib`` MiB of spaces after its first ``{``: still a valid trace,
    about a thousand times smaller gzipped (written a MiB at a time)."""
    text = source.read_bytes()
    with gzip.open(out, "wb", compresslevel=6) as zipped:
        zipped.write(text[:1])
        for _ in range(mib):
            zipped.write(b" " * (1 << 20))
        zipped.write(text[1:])
    return out


def test_a_gzip_inflating_past_the_limit_is_skipped_naming_it_in_bounded_memory(folder: dict, tmp_path: Path) -> None:
    from torchstep_prof.traces.reading.loading import inflate_limit

    root = tmp_path / "bomb"
    root.mkdir()
    good = shutil.copy(folder["written"]["rank0"].path, root)
    name = Path(good).name.replace("step1", "step7").replace(".json", ".json.gz")
    bomb = _gzip_padded(Path(good), root / name, BOMB_MIB)
    assert bomb.stat().st_size * 1000 < BOMB_MIB << 20 and inflate_limit(bomb.stat().st_size) < BOMB_MIB << 20
    # The same padding under the limit is read: the limit, not the padding, skips the file.
    small = _gzip_padded(Path(good), tmp_path / "small.json.gz", 8)
    assert read_trace_info(small).step == 1
    code = (
        "import sys\n"
        "from torchstep_prof.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "# VmHWM: this process's own peak (ru_maxrss carries the parent's over fork and exec)\n"
        "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
        "print('peak MiB', int(hwm.split()[1]) // 1024)\n"
        "sys.exit(code)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", code, "summarize", str(root), "--no-cache", "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"skipped {bomb}: a gzip that inflates past 64.0 MiB, the most a" in done.stderr
    assert "gunzip it to read it whole" in done.stderr
    doc = json.loads(done.stdout[: done.stdout.rindex("peak MiB")])
    assert doc["unreadable"] == [str(bomb)] and [g["step"] for g in doc["groups"]] == [1]
    # Inflated whole, the file needs over 256 MiB; read a MiB at a time up to the limit, far less.
    peak = int(done.stdout.rsplit("peak MiB", 1)[1])
    assert peak < BOMB_MIB, done.stdout[-200:]
