"""relocate_traces moves other tools' trace files into save_path without overwriting anything."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from torchstep_prof.errors import FinishHookWarning
from torchstep_prof.hook.relocate import relocate_traces, relocated_name


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def engines(tmp_path):
    """Two fake inference-engine folders, with trace and non-trace files."""
    first, second = tmp_path / "vllm", tmp_path / "sglang"
    _write(first / "host.11.pt.trace.json", "first-plain")
    _write(first / "host.11.1755.pt.trace.json.gz", "first-gz")
    _write(first / "notes.txt", "not a trace")
    _write(first / "nested" / "inner.json", "below the top level")
    (first / "folder.json").mkdir()  # a folder named like a trace is not a file
    _write(second / "host.11.pt.trace.json", "second-plain")  # same name as in the first folder
    _write(second / "metrics.json", "any json")
    return first, second


def test_files_land_in_save_path_with_the_documented_names(tmp_path, engines):
    first, second = engines
    save_path = tmp_path / "profile"

    moved = relocate_traces([first, str(second)], save_path, rank=1, world_size=4)

    names = [os.path.basename(p) for p in moved]
    assert names == [
        "relocated_rank1-of-4_host.11.1755.pt.trace.json.gz",
        "relocated_rank1-of-4_host.11.pt.trace.json",
        "relocated_rank1-of-4_host.11.pt.trace_part1.json",  # the clash, not an overwrite
        "relocated_rank1-of-4_metrics.json",
    ]
    assert sorted(os.listdir(save_path)) == sorted(names)
    assert [Path(p).read_text() for p in moved] == ["first-gz", "first-plain", "second-plain", "any json"]
    assert all(os.path.dirname(p) == str(save_path) for p in moved)


def test_other_files_stay_where_they_are(tmp_path, engines):
    first, second = engines
    relocate_traces([first, second], tmp_path / "profile", rank=0, world_size=1)
    assert sorted(os.listdir(first)) == ["folder.json", "nested", "notes.txt"]
    assert (first / "nested" / "inner.json").read_text() == "below the top level"
    assert os.listdir(second) == []


def test_an_existing_file_is_never_overwritten(tmp_path, engines):
    first, _ = engines
    save_path = tmp_path / "profile"
    taken = _write(save_path / relocated_name("host.11.pt.trace.json", 0, 2), "already here")
    part1 = _write(save_path / "relocated_rank0-of-2_host.11.pt.trace_part1.json", "taken too")

    moved = relocate_traces([first], save_path, rank=0, world_size=2)

    assert (taken.read_text(), part1.read_text()) == ("already here", "taken too")
    part2 = save_path / "relocated_rank0-of-2_host.11.pt.trace_part2.json"
    assert str(part2) in moved and part2.read_text() == "first-plain"


def test_a_missing_directory_warns_and_the_others_still_move(tmp_path, engines):
    first, _ = engines
    with pytest.warns(FinishHookWarning, match="not a directory"):
        moved = relocate_traces([tmp_path / "never-created", first], tmp_path / "profile", rank=0, world_size=1)
    assert len(moved) == 2


def test_save_path_itself_is_skipped(tmp_path):
    save_path = tmp_path / "profile"
    own = _write(save_path / "actor_update_step1_rank0-of-1_pid7_20260814122731089.json", "{}")
    with pytest.warns(FinishHookWarning, match="save_path itself"):
        assert relocate_traces([save_path], save_path, rank=0, world_size=1) == ()
    assert own.exists()


def test_moves_across_filesystems(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second filesystem")
    with tempfile.TemporaryDirectory(dir=shm) as engine:
        _write(Path(engine) / "far.pt.trace.json", "from another filesystem")
        moved = relocate_traces([engine], tmp_path / "profile", rank=0, world_size=1)
        assert os.listdir(engine) == []
    assert [Path(p).read_text() for p in moved] == ["from another filesystem"]
    assert os.listdir(tmp_path / "profile") == ["relocated_rank0-of-1_far.pt.trace.json"]  # no staging left


def test_filesystems_without_hard_links_still_never_overwrite(tmp_path, engines, monkeypatch):
    def no_hard_links(src, dst, **kwargs):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_hard_links)
    first, second = engines
    moved = relocate_traces([first, second], tmp_path / "profile", rank=0, world_size=1)
    assert [Path(p).read_text() for p in moved] == ["first-gz", "first-plain", "second-plain", "any json"]
