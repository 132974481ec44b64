"""The span log (``tsp.spans``, the ``spans`` config section, ``run --spans``): what a process
leaves in the span folder, read back as ``torchstep-prof timeline`` reads it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import torchstep_prof as tsp
from torchstep_prof.timeline.reading import read_span_folder
from torchstep_prof.timeline.span_log import _safe, _SpanLog

from dist_helpers import worker_env
from script_helpers import run_script

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _lines(folder: Path) -> list[dict]:
    (path,) = list(folder.glob("spans-*.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bad_spans_arguments_name_the_key_the_value_and_what_is_allowed(tmp_path):
    with pytest.raises(tsp.ConfigError, match=r"spans\.dir: must be a non-empty string \(got ''\)"):
        tsp.spans("")
    with pytest.raises(tsp.ConfigError, match=r"spans\.enable: must be true or false \(got 'yes'\)"):
        tsp.spans("x", enable="yes")  # type: ignore[arg-type]
    config = tmp_path / "c.yaml"
    config.write_text("spans:\n  dir: 3\n  enabled: true\n")
    with pytest.raises(tsp.ConfigError) as caught:
        tsp.load_config(config)
    text = str(caught.value)
    assert "spans.dir: must be a non-empty string (got 3)" in text
    assert "spans.enabled: unknown key (did you mean 'enable'?)" in text
    assert tsp.from_dict({"spans": {"dir": "/shared/spans"}}).spans == tsp.SpansConfig(dir="/shared/spans")


def test_every_step_and_region_is_in_the_file_with_its_thread_and_the_file_ends_cleanly(tmp_path):
    result = run_script(
        """
        import contextvars, threading, time, torchstep_prof as tsp
        with tsp.configure(summary=False), tsp.spans("spans"):
            for n in range(5):
                with tsp.step(n):
                    with tsp.profile_region("actor", "update"):
                        with tsp.profile_region("actor", "inner"):
                            time.sleep(0.002)
                    def side():
                        with tsp.profile_region("loader", "fetch"):
                            time.sleep(0.001)
                    # A thread starts with an empty context: the scopes go with it by copy.
                    ctx = contextvars.copy_context()
                    t = threading.Thread(target=ctx.run, args=(side,), name="loader-thread"); t.start(); t.join()
        print("ok")
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = _lines(tmp_path / "spans")
    header, end = lines[0], lines[-1]
    assert header["kind"] == "process" and header["pid"] > 0 and header["host"] == socket.gethostname()
    assert header["rank"] == 0 and header["format"] == 1
    assert end["kind"] == "end"
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    assert process.ended
    assert [b.number for b in process.steps] == [0, 1, 2, 3, 4]
    by_label: dict[tuple[str, str], list] = {}
    for span in process.spans:
        by_label.setdefault((span.role, span.stage), []).append(span)
    assert {k: len(v) for k, v in by_label.items()} == {("actor", "update"): 5, ("actor", "inner"): 5, ("loader", "fetch"): 5}
    assert {s.thread for s in by_label["loader", "fetch"]} == {"loader-thread"}
    assert {s.thread for s in by_label["actor", "update"]} == {"MainThread"}
    for outer, inner, block in zip(by_label["actor", "update"], by_label["actor", "inner"], process.steps):
        assert block.start <= outer.start <= inner.start < inner.end <= outer.end <= block.end
        assert inner.end - inner.start >= 0.002
    assert abs(process.steps[0].start - time.time()) < 600  # wall clock seconds, not perf_counter's


def test_spans_with_metrics_on_keep_the_metrics(tmp_path):
    result = run_script(
        """
        import torchstep_prof as tsp
        from torchstep_prof.region_metrics import recorder
        with tsp.configure(summary=False), tsp.spans("spans"), tsp.metrics(port=0, addr="127.0.0.1"):
            for n in range(4):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
        stats = recorder.snapshot()
        print(stats[("actor", "update")].count, stats[(None, None)].count)
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["4", "4"]
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    assert len(process.spans) == 4 and len(process.steps) == 4


def test_threads_recording_while_both_readers_drain_lose_and_split_no_span(tmp_path):
    # Each region's exit appends its span while the readers (the span log's write, the metrics'
    # fold, a scrape) take batches from the same lists, as fast as they can: every span must
    # reach both, whole (a batch cut mid-span would shift every later label and time).
    result = run_script(
        """
        import threading
        import torchstep_prof as tsp
        from torchstep_prof.region_metrics import recorder
        from torchstep_prof.timeline import span_log

        done = threading.Event()

        def read():
            while not done.is_set():
                span_log.flush_spans()
                recorder.snapshot()

        def work(k):
            for i in range(20000):
                with tsp.profile_region(f"role{k}", "stage"):
                    pass

        with tsp.configure(summary=False), tsp.spans("spans"), tsp.metrics(port=0, addr="127.0.0.1"):
            reader = threading.Thread(target=read)
            reader.start()
            workers = [threading.Thread(target=tsp.spans("spans")(tsp.metrics(port=0, addr="127.0.0.1")(work)), args=(k,)) for k in range(4)]
            for t in workers:
                t.start()
            for t in workers:
                t.join()
            done.set()
            reader.join()
        stats = recorder.snapshot()
        print(*(stats[(f"role{k}", "stage")].count for k in range(4)))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["20000"] * 4
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    by_role = {}
    for span in process.spans:
        assert span.stage == "stage" and span.start <= span.end, span
        by_role[span.role] = by_role.get(span.role, 0) + 1
    assert by_role == {f"role{k}": 20000 for k in range(4)}


def test_a_killed_process_keeps_its_finished_steps_and_the_ledger_marks_its_last_one_incomplete(tmp_path):
    spans = tmp_path / "spans"
    code = textwrap.dedent(
        """
        import sys, time, torchstep_prof as tsp
        hang_at = int(sys.argv[1])
        with tsp.configure(summary=False), tsp.spans(sys.argv[2]):
            for n in range(10):
                with tsp.step(n):
                    with tsp.profile_region(sys.argv[3], "work"):
                        time.sleep(60 if n == hang_at else 0.05)
                print(f"step {n} done", flush=True)
        """
    )
    script = tmp_path / "job.py"
    script.write_text(code)
    # Both at once: one run (a process started after every other one ended would be another run).
    steady = subprocess.Popen(
        [sys.executable, str(script), "-1", str(spans), "steady"], env=worker_env(), stdout=subprocess.PIPE, text=True
    )
    victim = subprocess.Popen(
        [sys.executable, str(script), "6", str(spans), "victim"], env=worker_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert victim.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if victim.stdout.readline().strip() == "step 5 done":
                break
        time.sleep(1.5)  # the span log writes twice a second
        assert steady.wait(timeout=120) == 0
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        steady.kill()
        steady.communicate()
    folder = read_span_folder(str(spans))
    killed = next(p for p in folder.processes if p.process_role is None and p.spans[0].role == "victim")
    assert not killed.ended
    assert [b.number for b in killed.steps] == [0, 1, 2, 3, 4, 5]
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "timeline", str(spans), "--json"],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    ledger = json.loads(out.stdout)
    # The two processes ran at different times: no anchor, one host, so one clock.
    steps = {s["number"]: s for s in ledger["steps"]}
    assert sorted(steps) == list(range(10))
    step6 = {p["process"]: p for p in steps[6]["processes"]}
    assert step6["victim"]["incomplete"] and not step6["steady"]["incomplete"]
    assert "incomplete: victim's span log ends in this step" in steps[6]["verdict"]
    assert [(p["name"], p["ended"], p["last_step"]) for p in ledger["processes"]] == [("steady", True, 9), ("victim", False, 5)]
    assert not any(p["incomplete"] for n in range(6) for p in steps[n]["processes"])


def test_a_link_planted_at_the_span_files_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    planted = tmp_path / f"spans-{_safe(socket.gethostname())}-{os.getpid()}.jsonl"
    planted.symlink_to(victim)
    log = _SpanLog(str(tmp_path), None)
    try:
        assert log._open()
        assert log.path is not None and log.path.endswith(f"-{os.getpid()}.1.jsonl")
    finally:
        if log.fd is not None:
            os.close(log.fd)
    assert victim.read_text() == "keep"


def test_run_spans_logs_a_plain_scripts_optimizer_steps(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "run", "--spans", str(tmp_path / "spans"),
         str(SCRIPTS / "optimizer_loop.py"), "4", "0.01"],
        cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    assert [b.number for b in process.steps] == [1, 2, 3, 4]


def test_with_metrics_on_too_each_steps_idle_time_is_a_prometheus_histogram_by_the_region_that_followed(tmp_path):
    pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (the [metrics] extra)")
    result = run_script(
        """
        import time, urllib.request, torchstep_prof as tsp
        from torchstep_prof.region_metrics import endpoint
        with tsp.configure(summary=False), tsp.spans("spans"), tsp.metrics(port=0, addr="127.0.0.1"):
            for n in range(5):
                with tsp.step(n):
                    with tsp.profile_region("rollout", "wait"):
                        time.sleep(0.01)
                    time.sleep(0.06)  # idle: before actor/update
                    with tsp.profile_region("actor", "update"):
                        with tsp.profile_region("actor", "inner"):  # nested: no idle of its own
                            time.sleep(0.01)
                    time.sleep(0.03)  # idle: before the step's end
            tsp.flush()
            host, port = endpoint()
            print(urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30).read().decode())
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    series = {}
    for line in result.stdout.splitlines():
        if line.startswith("torchstep_prof_idle_seconds_") and "_bucket" not in line:
            name, value = line.rsplit(" ", 1)
            labels = dict(kv.split("=") for kv in name[name.index("{") + 1 : -1].split(","))
            key = (name[: name.index("{")], labels["role"].strip('"'), labels["stage"].strip('"'))
            series[key] = float(value)
    assert series[("torchstep_prof_idle_seconds_count", "actor", "update")] == 5
    assert series[("torchstep_prof_idle_seconds_count", "step", "end")] == 5
    assert 5 * 0.06 <= series[("torchstep_prof_idle_seconds_sum", "actor", "update")] < 5 * 0.06 + 0.2
    assert 5 * 0.03 <= series[("torchstep_prof_idle_seconds_sum", "step", "end")] < 5 * 0.03 + 0.2
    assert series[("torchstep_prof_idle_seconds_sum", "rollout", "wait")] < 0.05  # the step starts with it
    assert ("torchstep_prof_idle_seconds_count", "actor", "inner") not in series


def test_the_callbacks_take_spans_as_a_folder(tmp_path):
    from torchstep_prof.integrations._driver import build_scopes

    with contextlib.ExitStack() as stack:
        for scope in build_scopes(None, None, None, None, {"spans": tmp_path / "spans", "summary": False}):
            stack.enter_context(scope)
        assert tsp.effective_config().spans == tsp.SpansConfig(dir=str(tmp_path / "spans"))
    with pytest.raises(tsp.ConfigError, match=r"spans\.dir: must be a non-empty string \(got ''\)"):
        build_scopes(None, None, None, None, {"spans": ""})


def test_spans_from_the_environment_and_an_unwritable_folder_warn_and_training_goes_on(tmp_path):
    (tmp_path / "not_a_folder").write_text("a file where the folder should be")
    result = run_script(
        """
        import torchstep_prof as tsp
        for n in range(3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
        tsp.flush()
        print("trained")
        """,
        tmp_path,
        TORCHSTEP_PROF_OVERRIDES="spans.dir=not_a_folder/spans summary=false",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "trained"
    assert "could not write the span log in 'not_a_folder/spans'" in result.stderr
    assert "spans are no longer recorded" in result.stderr
    ok = run_script(
        """
        import torchstep_prof as tsp
        for n in range(3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
        """,
        tmp_path,
        TORCHSTEP_PROF_OVERRIDES="spans.dir=spans",
    )
    assert ok.returncode == 0, ok.stderr
    (process,) = read_span_folder(str(tmp_path / "spans")).processes
    assert [b.number for b in process.steps] == [0, 1, 2] and process.ended


def test_one_span_log_a_process_a_second_folder_is_warned_about(tmp_path):
    result = run_script(
        """
        import torchstep_prof as tsp
        with tsp.configure(summary=False), tsp.spans("first"):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                pass
            with tsp.spans("second"), tsp.step(2), tsp.profile_region("actor", "update"):
                pass
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "spans already go to 'first'; 'second' is ignored (one span log a process)" in result.stderr
    assert not (tmp_path / "second").exists()
    (process,) = read_span_folder(str(tmp_path / "first")).processes
    assert [b.number for b in process.steps] == [1, 2]
