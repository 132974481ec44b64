"""The files a run leaves (docs/trace-files.md): names, sanitizing, collisions, gzip, metadata.

Every test here that uses ``save_dir`` also has each file it wrote checked by that fixture
(grammar, JSON, distributedInfo, the ``torchstep_prof`` object, one ProfilerStep row).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from trace_helpers import check_trace_file, everything_under, load_trace, range_names, trace_files

import torchstep_prof as tsp
from torchstep_prof import build_trace_name, parse_trace_name
from torchstep_prof.recording import session as _session
from torchstep_prof.naming import TRACE_NAME_PATTERN


def region(role="actor", stage="update", step=1):
    with tsp.profile_region(role, stage, step=step):
        torch.ones(4).add_(1)


def test_every_file_matches_the_name_grammar_and_round_trips(save_dir):
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    with tsp.schedule(steps=[1, 2]):
        for n in (1, 2):
            with tsp.step(n):
                region("rollout", "generate")
                region("actor", "compute_log_prob")
    after = dt.datetime.now(dt.timezone.utc)
    files = trace_files(save_dir)
    assert len(files) == 4
    for path in files:
        assert re.fullmatch(TRACE_NAME_PATTERN, path.name)
        name = parse_trace_name(path)
        assert build_trace_name(name) == path.name
        assert name.pid == os.getpid() and (name.rank, name.world_size) == (0, 1)
        assert before <= name.timestamp <= after  # UTC, the start of the trace
        assert re.search(r"_(\d{17})\.json$", path.name)


def test_records_describe_every_file_written(save_dir):
    with tsp.schedule(steps=[1]):
        region("actor", "compute_log_prob")
        region("ref", "compute_log_prob")
    written = tsp.records().traces
    assert sorted(Path(r.path).name for r in written) == [p.name for p in trace_files(save_dir)]
    for record in written:
        name = parse_trace_name(record.path)
        assert record.ok and record.error is None
        assert (record.role, record.stage, record.step, record.rank, record.world_size) == (
            name.role,
            name.stage,
            name.step,
            name.rank,
            name.world_size,
        )
        assert record.size_bytes == os.path.getsize(record.path)
        assert record.discrete is True


@pytest.mark.parametrize(
    ("role", "stage", "prefix", "raw_range"),
    [
        ("actor", "compute_log_prob", "actor_compute-log-prob_", "actor/compute_log_prob"),
        ("actor/rollout", "generate", "actor-rollout_generate_", "actor/rollout/generate"),
        ("actor", "update actor", "actor_update-actor_", "actor/update actor"),
        ("../../etc", "passwd", "etc_passwd_", "../../etc/passwd"),
        (".hidden", "stage", "hidden_stage_", ".hidden/stage"),
    ],
)
def test_labels_are_sanitized_in_names_and_kept_raw_in_ranges(save_dir, tmp_path, role, stage, prefix, raw_range):
    with tsp.schedule(steps=[1]):
        region(role, stage)
    [path] = trace_files(save_dir)
    assert path.name.startswith(prefix)
    assert raw_range in range_names(load_trace(path))
    # Nothing left save_path, nothing hidden in it.
    assert [p.name for p in tmp_path.iterdir()] == ["profile"]
    assert [p.name for p in save_dir.iterdir()] == [path.name]


def test_unsafe_characters_in_ranges_are_replaced_so_the_json_stays_valid(save_dir):
    nasty = 'say "hi" \\ caf\u00e9\n\ttab'
    with tsp.schedule(steps=[1]):
        with tsp.profile_region("actor", nasty, step=1):
            with tsp.profile_region("ref", nasty):  # a nested range with the same label
                torch.ones(2).add_(1)
    [path] = trace_files(save_dir)
    assert path.name.startswith("actor_say-hi-caf-tab_step1_")
    names = range_names(load_trace(path))  # loads: the file is valid JSON
    ours = [n for n in names if n.startswith(("actor/say", "ref/say"))]
    assert len(ours) == 2, names
    for name in ours:
        assert '"' not in name and "\\" not in name and name.isascii() and name.isprintable()


def test_a_label_with_nothing_left_is_named_by_its_code_points(save_dir):
    with tsp.schedule(steps=[1]):
        region("../..", "update")
        region("actor", "__")
    names = sorted(f"{parse_trace_name(p).role}_{parse_trace_name(p).stage}" for p in trace_files(save_dir))
    assert names == ["U+2E+2E+2F+2E+2E_update", "actor_U+5F+5F"]


def _freeze_trace_clock(monkeypatch, moment):
    """Make every trace start at the same millisecond (the clock the session reads)."""

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return moment

    monkeypatch.setattr(_session, "_dt", types.SimpleNamespace(datetime=Frozen, timezone=dt.timezone))


@pytest.mark.parametrize("gzipped", [False, True], ids=["json", "json.gz"])
def test_a_name_that_would_collide_gets_part_suffixes(save_dir, monkeypatch, gzipped):
    moment = dt.datetime(2026, 8, 14, 12, 27, 31, 89000, tzinfo=dt.timezone.utc)
    _freeze_trace_clock(monkeypatch, moment)
    with tsp.configure(gzip=gzipped), tsp.schedule(steps=[1]):
        for stage in ("update", "update", "update", "other"):
            region("actor", stage)
    ext = ".json.gz" if gzipped else ".json"
    base = f"actor_update_step1_rank0-of-1_pid{os.getpid()}_20260814122731089"
    names = sorted(p.name for p in trace_files(save_dir))
    assert names == sorted(
        [f"{base}{ext}", f"{base}_part1{ext}", f"{base}_part2{ext}", base.replace("_update_", "_other_") + ext]
    )
    assert [parse_trace_name(n).part for n in sorted(names)[1:]] == [0, 1, 2]
    # three different traces, none overwritten: each has its own trace_id
    ids = {load_trace(save_dir / n)["trace_id"] for n in names}
    assert len(ids) == 4


def test_plain_json_is_on_disk_when_flush_returns_and_when_the_scope_exits(save_dir):
    with tsp.schedule(steps=[1, 2]):
        region(step=1)
        assert tsp.flush() is True
        [path] = trace_files(save_dir)  # still inside the scope
        assert path.name.endswith(".json")
        check_trace_file(path)
        region(step=2)
    assert len(trace_files(save_dir)) == 2  # the scope's exit waited for the second write
    assert everything_under(save_dir) == trace_files(save_dir)  # no scratch or temporary file


def test_gzip_files_are_valid_gzip_json_on_disk_when_the_scope_exits(save_dir):
    with tsp.configure(gzip=True):
        with tsp.schedule(steps=[1, 2]):
            for n in (1, 2):
                with tsp.step(n):
                    region("rollout", "generate")
                    region("actor", "update")
        # the scope they were written under has exited: every one is on disk, whole
        files = trace_files(save_dir)
        assert len(files) == 4
        for path in files:
            assert path.name.endswith(".json.gz")
            assert path.read_bytes()[:2] == b"\x1f\x8b"
            with gzip.open(path, "rt") as handle:
                trace = json.load(handle)
            assert trace["torchstep_prof"]["step"] == parse_trace_name(path).step
            check_trace_file(path)
        assert all(r.ok and r.path.endswith(".json.gz") for r in tsp.records().traces)
        assert sorted(p.name for p in everything_under(save_dir)) == [p.name for p in files]


def test_save_path_is_created_on_first_use_and_the_files_are_flat(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    with tsp.configure(save_path=str(target), summary=False), tsp.schedule(steps=[1]):
        assert not target.exists()
        with tsp.step(1):
            region("actor", "update")
            region("critic", "update")
    files = everything_under(target)
    assert len(files) == 2 and all(p.is_file() and p.parent == target for p in files)
    for path in files:
        check_trace_file(path)


def test_distributed_info_and_metadata_carry_the_rank_without_a_process_group(save_dir, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with tsp.schedule(steps=[2]), tsp.ranks(3):
        region("ref", "compute_log_prob", step=2)
    [path] = trace_files(save_dir)
    assert "_step2_rank3-of-4_" in path.name
    trace = load_trace(path)
    assert trace["distributedInfo"]["rank"] == 3
    assert trace["distributedInfo"]["world_size"] == 4
    meta = dict(trace["torchstep_prof"])
    timeline = meta.pop("timeline")  # the spans for torchstep-prof timeline (docs/timeline.md)
    assert (timeline["rank"], timeline["world_size"], timeline["pid"]) == (3, 4, os.getpid())
    assert [s[:2] for s in timeline["spans"]] == [["ref", "compute_log_prob"]]
    assert meta == {
        "role": "ref",
        "stage": "compute-log-prob",
        "step": 2,
        "occurrence": 1,
        "rank": 3,
        "world_size": 4,
        "pid": os.getpid(),
        "discrete": True,
        "step_counted_by": "code",
        "step_means": "step 2 = the number the code gave (tsp.step(2), begin_step(2) or step=), "
        "or a region's entries counted from 1 when it gave none",
    }


def test_fused_metadata(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]), tsp.step(1):
        region("actor", "update", step=None)
        region("critic", "update", step=None)
    [path] = trace_files(save_dir)
    meta = dict(load_trace(path)["torchstep_prof"])
    timeline = meta.pop("timeline")
    assert sorted(s[:2] for s in timeline["spans"]) == [["actor", "update"], ["critic", "update"]]
    [(number, start, end)] = timeline["steps"]
    assert number == 1 and all(start <= s[2] <= s[3] <= end for s in timeline["spans"])
    assert meta == {
        "role": "actor-critic",
        "stage": "train",
        "step": 1,
        "occurrence": 1,
        "rank": 0,
        "world_size": 1,
        "pid": os.getpid(),
        "discrete": False,
        "step_counted_by": "code",
        "step_means": "step 1 = the number the code gave (tsp.step(1), begin_step(1) or step=), "
        "or a region's entries counted from 1 when it gave none",
    }


def test_pending_gzip_files_are_on_disk_at_interpreter_exit(tmp_path):
    """A run configured only through the environment never leaves a scope: the compressed
    files are still whole on disk when the process has exited."""
    save_path = tmp_path / "env-profile"
    script = textwrap.dedent(
        """
        import torch, torchstep_prof as tsp
        for n in (1, 2, 3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                torch.ones(64, 64).matmul(torch.ones(64, 64))
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(tsp.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    env["TORCHSTEP_PROF_OVERRIDES"] = f"schedule.steps=[1,3] gzip=true save_path={save_path}"
    env["TORCHSTEP_PROF_SUMMARY"] = "0"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "USDT" not in result.stderr  # Kineto's per-window lines are kept off the console
    files = trace_files(save_path)
    assert [parse_trace_name(p).step for p in files] == [1, 3]
    for path in files:
        assert path.name.endswith(".json.gz")
        check_trace_file(path)
    assert sorted(everything_under(save_path)) == files
