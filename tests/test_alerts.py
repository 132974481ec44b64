"""``torchstep-prof alerts``: the rules it prints pass ``promtool check rules`` and fire as meant
under ``promtool test rules`` (tests/alert_rules_test.yml); thresholds are options."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dist_helpers import worker_env

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package `prometheus`)")
UNIT_TESTS = Path(__file__).resolve().parent / "alert_rules_test.yml"


def alerts(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "alerts", *options],
        capture_output=True, text=True, env=worker_env(), timeout=60,
    )  # fmt: skip


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=120)  # type: ignore[list-item]


@needs_promtool
def test_the_default_rules_fire_on_a_stuck_job_a_straggler_and_a_regression(tmp_path):
    printed = alerts()
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "rules.yml").write_text(printed.stdout)
    shutil.copy(UNIT_TESTS, tmp_path / "tests.yml")
    checked = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert checked.returncode == 0 and "SUCCESS: 3 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_thresholds_are_options(tmp_path):
    printed = alerts(
        "--selector", 'job="train"', "--stuck-after", "120", "--stuck-for", "30s", "--straggler-on", "actor/update",
        "--straggler-factor", "1.5", "--straggler-window", "2m", "--straggler-for", "1m", "--regression-factor", "2",
        "--regression-window", "15m", "--regression-for", "5m", "--severity", "page",
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    rules = {r["alert"]: r for r in yaml.safe_load(printed.stdout)["groups"][0]["rules"]}
    stuck, straggler, regressed = (rules[f"TorchstepProf{n}"] for n in ("JobStuck", "StragglerRank", "RegionRegressed"))
    assert stuck["expr"] == 'time() - max by (job) (torchstep_prof_last_step_timestamp_seconds{job="train"}) > 120'
    assert stuck["for"] == "30s" and straggler["for"] == "1m" and regressed["for"] == "5m"
    assert 'torchstep_prof_region_seconds_bucket{role="actor",stage="update",job="train"}[2m]' in straggler["expr"]
    assert "group_left 1.5 * histogram_quantile" in straggler["expr"]
    assert (
        "[15m])) / " in regressed["expr"]
        and ") > 2 * (" in regressed["expr"]
        and "[1h] offset 15m" in regressed["expr"]
    )
    assert {r["labels"]["severity"] for r in rules.values()} == {"page"}
    (tmp_path / "rules.yml").write_text(printed.stdout)
    checked = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--stuck-after", "0", "must be a whole number of seconds >= 1 (got '0')"),
        ("--straggler-for", "5 minutes", "must be a Prometheus duration such as 30s, 5m, 1h30m (got '5 minutes')"),
        ("--straggler-factor", "1", "must be a number > 1 (got '1')"),
        ("--regression-factor", "nan", "must be a number > 1 (got 'nan')"),
        ("--selector", 'job="a"} or vector(1)', "must be label matchers such as"),
        ("--straggler-on", "actor", "must be 'step' or a region as ROLE/STAGE (got 'actor')"),
    ],
)
def test_a_bad_option_is_refused_naming_it(option, value, message):
    printed = alerts(option, value)
    assert printed.returncode == 2 and printed.stdout == ""
    assert f"argument {option}: {message}" in printed.stderr


PROMETHEUS = shutil.which("prometheus")


@pytest.mark.distributed
@pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="prometheus is not installed (Debian package `prometheus`)")
def test_a_real_prometheus_fires_the_rules_on_a_real_job(tmp_path):
    """Prometheus scrapes a 2-rank job whose rank 1 slows (tests/workers/auto_trace_worker.py)
    and then stops stepping while it still serves: the straggler and stuck-job alerts fire for it."""
    import json
    import threading
    import time
    import urllib.parse
    import urllib.request

    from dist_helpers import WORKERS, free_port, run_torchrun
    from test_metrics_prometheus import _two_free_ports

    pytest.importorskip("prometheus_client", reason="prometheus_client (the [metrics] extra) is not installed")
    printed = alerts("--stuck-after", "4", "--stuck-for", "0s", "--straggler-on", "train/compute",
                     "--straggler-window", "15s", "--straggler-for", "0s")  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "rules.yml").write_text(printed.stdout)
    base, web_port = _two_free_ports(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
        "rule_files: [rules.yml]\n"
        "scrape_configs:\n  - job_name: train\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{base}', '127.0.0.1:{base + 1}']\n"
    )
    web = f"http://127.0.0.1:{web_port}"

    def query(promql: str) -> list[dict]:
        url = f"{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]

    out = tmp_path / "job"
    out.mkdir()
    launched: dict = {}
    log = open(tmp_path / "prometheus.log", "wb")
    server = subprocess.Popen(
        [PROMETHEUS, "--config.file=prometheus.yml", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    thread = threading.Thread(target=lambda: launched.update(launch=run_torchrun(
        WORKERS / "auto_trace_worker.py", 2, [str(out), "slow"], log_dir=out,
        env={"AUTO_TRACE_METRICS_PORT": str(base)}, timeout_s=300)))  # fmt: skip
    thread.start()
    fired: dict[str, set] = {}
    info: list[dict] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and thread.is_alive():
            try:
                for row in query('ALERTS{alertstate="firing"}'):
                    fired.setdefault(row["metric"]["alertname"], set()).add(row["metric"].get("rank", "-"))
                info = query("torchstep_prof_auto_trace_info")
            except OSError:
                time.sleep(0.5)
                continue
            if "TorchstepProfJobStuck" in fired and "TorchstepProfStragglerRank" in fired:
                break
            time.sleep(0.5)
    finally:
        (out / "release").write_text("go")
        thread.join(timeout=320)
        server.terminate()
        server.wait(timeout=30)
        log.close()
    launched["launch"].check()
    assert fired.get("TorchstepProfStragglerRank") == {"1"}, fired
    assert fired.get("TorchstepProfJobStuck") == {"-"}, fired  # one per job, not per rank
    # The newest automatic trace of each rank, by its file name: from the graph to the trace.
    names = {row["metric"]["rank"]: row["metric"]["file"] for row in info}
    assert set(names) == {"0", "1"} and all((out / "traces" / name).exists() for name in names.values()), info
