"""The per-file summary cache (``traces/reading/cache.py``): an entry that is not what this code writes
(edited by hand, torn, another tool's) is read again from its trace, never a crash.

Real traces, ``summarize`` and ``report`` run as a person runs them, the cache in a folder of
the test's own (``TORCHSTEP_PROF_CACHE_DIR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from trace_factory import write_trace

from torchstep_prof.traces.reading.cache import _INFO_FIELDS

REPO = Path(__file__).resolve().parents[1]
FIELD = {name: index for index, name in enumerate(_INFO_FIELDS)}


def cli(*argv: object, cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120", TORCHSTEP_PROF_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, "-m", "torchstep_prof", *map(str, argv)], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("traces")
    for rank in range(2):
        write_trace(out, step=2, rank=rank, world_size=2, mm_s=0.005)
    return out


def _with(index: str, value: Any) -> Callable[[dict], Any]:
    def change(entry: dict) -> dict:
        info = list(entry["info"])
        info[FIELD[index]] = value
        return {**entry, "info": info}

    return change


MALFORMED: dict[str, Callable[[dict], Any]] = {
    "entry is a string": lambda entry: "x",
    "entry is a list": lambda entry: [1, 2],
    "info is missing": lambda entry: {k: v for k, v in entry.items() if k != "info"},
    "info is too short": lambda entry: {**entry, "info": entry["info"][:3]},
    "info is an object": lambda entry: {**entry, "info": {}},
    "role is null": _with("role", None),
    "step is a string": _with("step", "2"),
    "wall_ms is a string": _with("wall_ms", "fast"),
    "roles is a string": _with("roles", "actor"),
    "an operator's self_ms is a string": _with("top_ops", [["aten::mm", "x"]]),
    "an operator row is short": _with("top_ops", [["aten::mm"]]),
    "top_ops is a number": _with("top_ops", 5),
    "top is a string": lambda entry: {**entry, "top": "9"},
    "reason is a number": lambda entry: {"size": entry["size"], "mtime_ns": entry["mtime_ns"], "reason": 5},
}


@pytest.mark.parametrize("command", ["summarize", "report"])
def test_a_malformed_entry_is_read_again_from_its_trace(folder: Path, tmp_path: Path, command: str) -> None:
    cache = tmp_path / "cache"
    argv = [folder, "--json"] if command == "summarize" else [folder, "-o", tmp_path / "r.html"]
    plain = cli("summarize", folder, "--json", "--no-cache", cache=cache)
    assert plain.returncode == 0, plain.stderr
    assert cli(command, *argv, cache=cache).returncode == 0
    (path,) = cache.iterdir()
    good = json.loads(path.read_text())
    assert len(good["entries"]) == 2
    for what, change in MALFORMED.items():
        doc = json.loads(json.dumps(good))
        doc["entries"] = {key: change(entry) for key, entry in doc["entries"].items()}
        path.write_text(json.dumps(doc))
        done = cli(command, *argv, cache=cache)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (what, done.stderr)
        if command == "summarize":
            assert json.loads(done.stdout) == json.loads(plain.stdout), what
        else:
            assert "wrote" in done.stdout and "0 file(s) skipped" in done.stdout, what
        # The traces were read again, and the cache holds good entries again.
        assert json.loads(path.read_text())["entries"] == good["entries"], what


def test_a_second_run_takes_each_traces_summary_from_the_cache(folder: Path, tmp_path: Path) -> None:
    # Every field type a summary holds must round-trip (an Optional[float] once made every
    # entry a miss: warm runs read every trace again, slower than cold ones). The cache's
    # entries are given another wall time: a run that shows it took them from the cache.
    cache = tmp_path / "cache"
    first = cli("summarize", folder, "--json", cache=cache)
    assert first.returncode == 0, first.stderr
    (path,) = cache.iterdir()
    doc = json.loads(path.read_text())
    assert len(doc["entries"]) == 2
    for entry in doc["entries"].values():
        entry["info"][FIELD["wall_ms"]] = 12345.5
    path.write_text(json.dumps(doc))
    second = cli("summarize", folder, "--json", cache=cache)
    assert second.returncode == 0, second.stderr
    assert "12345.5" in second.stdout and "12345.5" not in first.stdout
    fresh = cli("summarize", folder, "--json", "--no-cache", cache=cache)
    assert json.loads(fresh.stdout) == json.loads(first.stdout)
