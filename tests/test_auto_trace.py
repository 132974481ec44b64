"""Slow steps trace themselves (``auto_trace``, docs/auto-trace.md): real jobs, real files.

A 2-rank torchrun (gloo) job whose rank 1 slows from step 120 traces the steps right after on
rank 1 and on rank 0, none before, and ``summarize`` names rank 1 and its extra operators; a
rank that stays slow is traced once, within the budget; jitter alone writes nothing. One
process watching its steps shows the decision in its metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dist_helpers import WORKERS, read_json, run_torchrun, worker_env
from torchstep_prof.naming import parse_trace_name

pytest.importorskip("prometheus_client", reason="the [metrics] extra (prometheus_client) is not installed")


def traced(folder: Path) -> dict[int, list[int]]:
    """Each rank's traced steps, from the file names."""
    found: dict[int, list[int]] = {}
    for path in sorted(folder.glob("*.json")) if folder.exists() else ():
        name = parse_trace_name(path)
        found.setdefault(name.rank, []).append(name.step)
    return {rank: sorted(steps) for rank, steps in found.items()}


def auto_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("auto trace:")]


def torchrun(tmp_path: Path, mode: str):
    launch = run_torchrun(WORKERS / "auto_trace_worker.py", 2, [str(tmp_path), mode], log_dir=tmp_path).check()
    for rank in (0, 1):
        result = read_json(tmp_path / f"result_rank{rank}.json")
        assert result["toolkit_collectives"] == [] and result["trace_errors"] == []  # never a collective
    return launch


def test_a_rank_that_slows_is_traced_with_a_peer_and_summarize_names_it(tmp_path):
    launch = torchrun(tmp_path, "slow")
    steps = traced(tmp_path / "traces")
    assert set(steps) == {0, 1} and steps[0] == steps[1], steps
    first, second = steps[1]
    assert second == first + 1 and 121 < first <= 140, steps  # right after the slowdown, none before
    lines = auto_lines(launch.output)
    decided = [line for line in lines if "rank 1:" in line]
    assert len(decided) == 1, lines
    assert decided[0].startswith("auto trace: step 12") and "x its median" in decided[0]
    assert decided[0].endswith(f"; traced steps {first}-{second} on ranks 1 and 0")
    assert any(
        line.startswith(f"auto trace: rank 0 traces steps {first}-{second} as a peer of rank 1") for line in lines
    )
    # Each trace says why it was taken.
    for path in (tmp_path / "traces").glob("*.json"):
        why = json.loads(path.read_text())["torchstep_prof"]["auto_trace"]
        assert why["metric"] == "train/compute" and why["rank"] == 1 and why["factor"] == 2.0
        assert why["value_ms"] > 2 * why["baseline_ms"] and 120 <= why["step"] < first
    # One capture recorded in the folder (the job's hourly budget counts these).
    assert len(list((tmp_path / "od").glob("auto-*.json"))) == 1
    summary = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", str(tmp_path / "traces")],
        capture_output=True, text=True, env=worker_env(), timeout=120,
    )  # fmt: skip
    assert summary.returncode == 0, summary.stderr
    text = " ".join(summary.stdout.split())  # the table wraps its lines
    assert "rank 1 arrived last" in text and "rank 1's extra time: aten::cumprod" in text, summary.stdout


def test_a_rank_that_stays_slow_is_traced_once_within_the_budget(tmp_path):
    launch = torchrun(tmp_path, "stays")
    steps = traced(tmp_path / "traces")
    assert steps.get(1) and len(steps[1]) == 2 and steps == {0: steps[1], 1: steps[1]}, steps
    assert 61 < steps[1][0] <= 80
    assert len(list((tmp_path / "od").glob("auto-*.json"))) == 1
    # Its later spikes are decisions too, each written down, none traced.
    refused = [line for line in auto_lines(launch.output) if "not traced" in line]
    assert refused and all("(budget: 1 captures in the last hour (max_traces_per_hour 1))" in r for r in refused)


def test_jitter_alone_writes_nothing(tmp_path):
    launch = torchrun(tmp_path, "jitter")
    assert traced(tmp_path / "traces") == {}
    assert auto_lines(launch.output) == []
    assert not list((tmp_path / "od").glob("auto-*.json")) and not (tmp_path / "od" / "request.json").exists()


def test_one_process_watching_its_steps_shows_the_decision_in_its_metrics(tmp_path):
    run = subprocess.run(
        [sys.executable, str(WORKERS / "auto_trace_step.py"), str(tmp_path)],
        capture_output=True, text=True, env=worker_env(), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    steps = traced(tmp_path / "traces")
    assert list(steps) == [0] and len(steps[0]) == 2 and 101 < steps[0][0] <= 110, steps
    line = auto_lines(run.stdout)
    assert len(line) == 1 and line[0].endswith(f"traced steps {steps[0][0]}-{steps[0][1]} on rank 0"), run.stdout
    metrics = (tmp_path / "metrics.txt").read_text()
    assert "torchstep_prof_auto_trace_decisions_total{node=" in metrics and 'outcome="traced"' in metrics
    info = next(row for row in metrics.splitlines() if row.startswith("torchstep_prof_auto_trace_info{"))
    newest = max((tmp_path / "traces").glob("*.json"), key=lambda p: parse_trace_name(p).step)
    assert f'file="{newest.name}"' in info and 'metric="step"' in info and info.endswith(" 1.0")
    gauge = next(row for row in metrics.splitlines() if row.startswith("torchstep_prof_last_step_timestamp_seconds{"))
    scraped_at = float((tmp_path / "time.txt").read_text())
    assert scraped_at - 5 < float(gauge.rsplit(" ", 1)[1]) <= scraped_at
    why = json.loads(newest.read_text())["torchstep_prof"]["auto_trace"]
    assert why["metric"] == "step" and 100 <= why["step"] < steps[0][0] and why["peers"] == []


SCRIPTS = Path(__file__).resolve().parent / "scripts"


def test_run_auto_trace_traces_a_plain_script_that_slows(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "run", "--auto-trace", "--on-demand", "od", "--metrics-port", "0",
         "--save-path", "traces", "--set", "auto_trace.baseline_steps=30", "--set", "auto_trace.min_ms=20",
         str(SCRIPTS / "slowing_loop.py"), "150", "100"],
        capture_output=True, text=True, env=worker_env(), timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    steps = traced(tmp_path / "traces")
    assert list(steps) == [0] and len(steps[0]) == 2 and 101 < steps[0][0] <= 110, steps
    assert any(line.endswith(f"traced steps {steps[0][0]}-{steps[0][1]} on rank 0") for line in auto_lines(run.stdout))


def test_run_auto_trace_needs_an_on_demand_folder(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "run", "--auto-trace", str(SCRIPTS / "slowing_loop.py"), "5", "9"],
        capture_output=True, text=True, env=worker_env(), timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2
    assert "--auto-trace (auto_trace) needs --on-demand DIR: its peers and its budget are kept there" in run.stderr


def test_the_callbacks_take_auto_trace_as_their_other_sections():
    import contextlib
    import warnings

    import torchstep_prof as tsp
    from torchstep_prof.integrations._driver import build_scopes

    for given, expected in ((True, tsp.AutoTraceConfig()), ({"factor": 3}, tsp.AutoTraceConfig(factor=3))):
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")  # off here (no metrics, no folder): said once, tested elsewhere
            for scope in build_scopes(None, None, None, None, {"auto_trace": given}):
                stack.enter_context(scope)
            assert tsp.effective_config().auto_trace == expected
    with pytest.raises(tsp.ConfigError, match=r"auto_trace.peers: must be >= 0 \(got -1\)"):
        build_scopes(None, None, None, None, {"auto_trace": {"peers": -1}})


def test_the_byte_budget_refuses_a_second_capture(tmp_path):
    run = subprocess.run(
        [sys.executable, str(WORKERS / "auto_trace_step.py"), str(tmp_path), "bytes"],
        capture_output=True, text=True, env=worker_env(), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    steps = traced(tmp_path / "traces")
    assert list(steps) == [0] and len(steps[0]) == 2 and 61 < steps[0][0] <= 70, steps
    lines = auto_lines(run.stdout)
    assert len(lines) == 2 and lines[0].endswith(f"traced steps {steps[0][0]}-{steps[0][1]} on rank 0"), lines
    written = sum(p.stat().st_size for p in (tmp_path / "traces").glob("*.json"))
    assert lines[1].startswith("auto trace: step 12") and lines[1].endswith(
        f"not traced (budget: {written} bytes of automatic traces written (max_bytes 1))"
    ), lines
    metrics = (tmp_path / "metrics.txt").read_text()
    assert 'outcome="skipped"' in metrics and 'outcome="traced"' in metrics
