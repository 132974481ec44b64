"""The background trace writer (docs/trace-files.md: writing leaves the training thread): the
block that ends a trace does not wait for the export, files are written in order, back-pressure
bounds what is pending, ``tsp.flush()``, writes at interpreter exit and during shutdown, and
``traceName`` naming the final file in valid JSON."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from trace_helpers import check_trace_file, everything_under, load_trace, trace_files

import torchstep_prof as tsp
from torchstep_prof import background, parse_trace_name
from torchstep_prof.writing.writer import MAX_PENDING

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = Path(tsp.__file__).resolve().parents[1]


def region(role="actor", stage="update", step=1, ops=1):
    with tsp.profile_region(role, stage, step=step):
        x = torch.ones(4)
        for _ in range(ops):
            x = x.add(1)


@pytest.fixture
def held_exports(save_dir, monkeypatch):
    """torch's real export, held on a gate until the test opens it; records which threads
    export. Only exports into ``save_dir`` are held (not the one-time warm-up)."""
    gate = threading.Event()
    threads: list[str] = []
    original = torch.profiler.profile.export_chrome_trace

    def held(self, path, *args, **kwargs):
        # The write's work folder is reached through /proc/self/fd: resolve it to see where it is.
        if os.path.realpath(path).startswith(str(save_dir)):
            threads.append(threading.current_thread().name)
            gate.wait(60)
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", held)
    try:
        yield gate, threads
    finally:
        gate.set()  # never leave the writer held for the next test
        tsp.flush()


def run_script(script: str, env_extra: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["TORCHSTEP_PROF_SUMMARY"] = "0"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=timeout
    )


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in everything_under(folder) if p.name.startswith("."))


# --- off the training thread, in order, bounded ------------------------------------------------


def test_the_block_that_ends_a_trace_does_not_wait_for_the_export(save_dir, held_exports):
    gate, threads = held_exports
    with tsp.schedule(steps=[1]):
        region(step=1)  # returns although the export is held
        assert trace_files(save_dir) == []
        assert tsp.flush(timeout=0.2) is False  # still held: flush says so and returns
        gate.set()
        assert tsp.flush() is True
        [path] = trace_files(save_dir)
        check_trace_file(path)
    assert threads == ["torchstep_prof-writer"]  # the export ran on the writer thread


def test_more_than_the_pending_limit_makes_the_next_trace_end_wait(save_dir, held_exports):
    gate, _ = held_exports
    ended: list[int] = []
    steps = list(range(1, MAX_PENDING + 4))

    def train():
        # scopes live in context variables: the thread enters its own
        with tsp.configure(save_path=str(save_dir), summary=False), tsp.schedule(steps=steps):
            for n in steps:
                region(step=n)
                ended.append(n)

    trainer = threading.Thread(target=train)
    trainer.start()
    deadline = time.monotonic() + 60
    while len(ended) < MAX_PENDING and time.monotonic() < deadline:
        time.sleep(0.01)
    trainer.join(0.5)
    # MAX_PENDING traces wait for the held writer; the next trace end waits with them
    assert ended == steps[:MAX_PENDING] and trainer.is_alive()
    gate.set()
    trainer.join(60)
    assert ended == steps
    records = tsp.records()
    assert [r.step for r in records.traces] == steps  # written in the order the traces ended
    assert all(r.ok for r in records.traces)
    assert records.costs.writer_wait_s > 0  # the summary says how long training waited
    stamps = [parse_trace_name(p).timestamp for p in sorted(trace_files(save_dir), key=lambda p: parse_trace_name(p).step)]
    assert stamps == sorted(stamps)


def test_the_scope_exit_waits_for_the_traces_recorded_under_it(save_dir, held_exports):
    gate, _ = held_exports
    threading.Timer(0.3, gate.set).start()
    with tsp.configure(gzip=True), tsp.schedule(steps=[1, 2]):
        region(step=1)
        region(step=2)
        assert trace_files(save_dir) == []
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [1, 2]
    assert temporaries(save_dir) == []


def test_flush_waits_for_background_work_the_hook_runner_registers():
    release, done = threading.Event(), threading.Event()
    hook = threading.Thread(target=lambda: (release.wait(60), done.set()))
    hook.start()
    unregister = background.add(background.HOOKS, functools.partial(background.wait_for_event, done))
    try:
        assert tsp.flush(timeout=0.2) is False
    finally:
        release.set()
    assert tsp.flush() is True
    assert done.is_set()
    unregister()


def test_flush_with_nothing_pending_returns_true_at_once():
    assert tsp.flush() is True
    assert tsp.flush(timeout=0) is True


# --- traceName and valid JSON ------------------------------------------------------------------


# (``traceName`` after a name clash: every file the ``save_dir`` fixture sees is checked by
# check_trace_file, test_trace_files_written.py's clash test included.)


@pytest.mark.parametrize("gzipped", [False, True], ids=["json", "gzip"])
def test_trace_name_is_absolute_for_a_relative_save_path(tmp_path, monkeypatch, gzipped):
    monkeypatch.chdir(tmp_path)
    with tsp.configure(save_path="rel/profile", gzip=gzipped, summary=False), tsp.schedule(steps=[1]):
        region(step=1)
    [path] = trace_files(tmp_path / "rel" / "profile")
    assert load_trace(path)["traceName"] == str(path)
    assert tsp.records().traces[0].path == os.path.join("rel/profile", path.name)


ODD_FOLDERS = ["with space", "it's $HOME", "caf\u00e9 \u6f22\u5b57", "a,b]}{[", "100%#!&;"]


@pytest.mark.parametrize("folder", ODD_FOLDERS)
def test_every_trace_written_parses_with_json_load_whatever_the_save_path(tmp_path, folder):
    save_path = tmp_path / folder
    other = threading.Event()

    def other_thread():  # a region of another thread: its span is spliced into the tail
        with tsp.configure(save_path=str(save_path), summary=False), tsp.schedule(steps=[1]):
            with tsp.profile_region("rollout", "generate", step=1):
                other.wait(30)

    with tsp.configure(save_path=str(save_path), summary=False), tsp.schedule(steps=[1, 2]), tsp.contents("shapes", "stack", "memory"):
        with tsp.profile_region("actor", "update", step=1):
            helper = threading.Thread(target=other_thread)
            helper.start()
            time.sleep(0.05)
            torch.ones(8, 8).matmul(torch.ones(8, 8))
            other.set()
            helper.join()
        region(step=2)
    paths = trace_files(save_path)
    assert len(paths) == 2
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            trace = json.load(handle)
        assert trace["traceName"] == str(path)
        check_trace_file(path)
    spans = [e for e in load_trace(paths[0])["traceEvents"] if e.get("name") == "rollout/generate"]
    assert len(spans) == 1
    assert temporaries(save_path) == []


# --- interpreter exit and shutdown (subprocesses) ----------------------------------------------


def test_every_pending_trace_is_on_disk_at_interpreter_exit(tmp_path):
    """Configured through the environment: no scope exit ever flushes; the process ends right
    after the last trace ended, with more traces queued than the pending limit."""
    save_path = tmp_path / "at-exit"
    result = run_script(
        """
        import torch, torchstep_prof as tsp
        for n in range(1, 11):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                x = torch.ones(4)
                for _ in range(3000 if n == 10 else 10):
                    x = x.add(1)
        """,
        {"TORCHSTEP_PROF_OVERRIDES": f"schedule.steps=[1,2,3,4,5,6,7,8,9,10] save_path={save_path}"},
    )
    assert result.returncode == 0, result.stderr
    files = trace_files(save_path)
    assert sorted(parse_trace_name(p).step for p in files) == list(range(1, 11))
    for path in files:
        check_trace_file(path)
    assert temporaries(save_path) == []


@pytest.mark.parametrize("started_before", [False, True], ids=["writer-not-started", "writer-running"])
def test_traces_ended_while_the_interpreter_shuts_down_are_written(tmp_path, started_before):
    """A training thread that outlives the main script ends its traces after shutdown began
    (gzip included: an executor would refuse the work then)."""
    save_path = tmp_path / "shutdown"
    result = run_script(
        f"""
        import threading, torch, torchstep_prof as tsp

        def step(n):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                torch.ones(64, 64).matmul(torch.ones(64, 64))

        def train():
            threading.main_thread().join()  # returns once the main script is over
            with tsp.configure(save_path={str(save_path)!r}, gzip=True, summary=False):
                with tsp.schedule(steps=[2, 3, 4]):
                    for n in (2, 3, 4):
                        step(n)

        if {started_before!r}:
            with tsp.configure(save_path={str(save_path)!r}, gzip=True, summary=False):
                with tsp.schedule(steps=[1]):
                    step(1)
        threading.Thread(target=train).start()
        """
    )
    assert result.returncode == 0, result.stderr
    assert "TraceWriteWarning" not in result.stderr and "cannot schedule" not in result.stderr, result.stderr
    files = trace_files(save_path)
    expected = [1, 2, 3, 4] if started_before else [2, 3, 4]
    assert sorted(parse_trace_name(p).step for p in files) == expected
    for path in files:
        assert path.name.endswith(".json.gz")
        check_trace_file(path)
    assert temporaries(save_path) == []


# --- what torch allows (the design rests on it) ------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "threads", "trainer-thread", "asyncio"])
def test_torch_exports_a_stopped_profiler_safely_while_the_next_one_records(tmp_path, mode):
    """Repeated in fresh processes: a crash here would be a segfault in one run of several."""
    for run in range(2):
        out = tmp_path / f"run{run}"
        out.mkdir()
        result = subprocess.run(
            [sys.executable, str(WORKERS / "export_while_recording.py"), mode, "20", str(out), "20"],
            env={**os.environ, "KINETO_LOG_LEVEL": "6"},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, (run, result.returncode, result.stdout, result.stderr[-3000:])
        assert "0 bad" in result.stdout
