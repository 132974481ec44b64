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
