"""``python -m torchstep_prof config``: print the effective config as YAML, check a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import torchstep_prof
from torchstep_prof.cli import main
from torchstep_prof.config.model import FinishHookConfig, ProfilerConfig, ScheduleConfig
from torchstep_prof.config.files import dump_config, load_config
from torchstep_prof.config.converter import to_dict
from torchstep_prof.config.variables import ENV_CONFIG, ENV_OVERRIDES

ROOT = Path(torchstep_prof.__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), environ.get("PYTHONPATH", "")])
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "torchstep_prof", "config", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=120)


# --- through a real `python -m torchstep_prof` (each pays for importing torch: keep them few) --


def test_prints_the_default_config(tmp_path: Path) -> None:
    result = run_cli(cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("enable: true\nsave_path: outputs/profile\n")
    assert yaml.safe_load(result.stdout) == to_dict(ProfilerConfig())


def test_prints_the_environment_layer(tmp_path: Path) -> None:
    dump_config(ProfilerConfig(gzip=True), tmp_path / "env.toml")
    result = run_cli(cwd=tmp_path, **{ENV_CONFIG: "env.toml",
                                      ENV_OVERRIDES: "schedule.steps=[2] 'finish_hook.cmd=upload x'"})
    assert result.returncode == 0, result.stderr
    expected = ProfilerConfig(gzip=True, schedule=ScheduleConfig(steps=(2,)), finish_hook=FinishHookConfig(cmd="upload x"))
    assert yaml.safe_load(result.stdout) == to_dict(expected)


def test_check_lists_every_problem_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("schedule:\n  wait: -1\n  active: 0\nrank: [0]\n")
    result = run_cli("--check", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "bad.yaml: schedule.wait: must be >= 0 (got -1)",
        "bad.yaml: schedule.active: must be >= 1 (got 0)",
        "bad.yaml: rank: unknown key (did you mean 'ranks'?)",
    ]


# --- in process: the same entry point, without a new interpreter per case -----------------------


@pytest.fixture
def in_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.delenv(ENV_OVERRIDES, raising=False)
    return tmp_path


def test_check_says_ok(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump_config(ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3))), in_dir / "good.json")
    assert main(["config", "--check", "good.json"]) == 0
    assert capsys.readouterr().out == "OK: good.json\n"


def test_a_bad_environment_exits_1_naming_the_variable(
    in_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_OVERRIDES, "schedule.wait=-1 shedule.active=2")
    assert main(["config"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [  # the well-formed override's bad value too
        "TORCHSTEP_PROF_OVERRIDES: shedule: unknown key in override 'shedule.active=2' (did you mean 'schedule'?)",
        "TORCHSTEP_PROF_OVERRIDES: schedule.wait: must be >= 0 (got -1)",
    ]
    monkeypatch.setenv(ENV_OVERRIDES, "schedule.wait=-1")
    assert main(["config"]) == 1
    assert capsys.readouterr().err == "TORCHSTEP_PROF_OVERRIDES: schedule.wait: must be >= 0 (got -1)\n"


def test_file_prints_that_files_config(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ProfilerConfig(ranks=(0, 2), finish_hook=FinishHookConfig(cmd=["up", "x"], timeout_s=30))
    dump_config(cfg, in_dir / "c.toml")
    assert main(["config", "--file", "c.toml"]) == 0
    printed = capsys.readouterr().out
    (in_dir / "printed.yaml").write_text(printed)
    assert load_config(in_dir / "printed.yaml") == cfg  # what is printed is itself a config file


@pytest.mark.parametrize(
    ("args", "stream", "expected"),
    [
        (["--check", "missing.yaml"], "out", ["missing.yaml: cannot be read (No such file or directory)"]),
        (["--check", "c.ini"], "out",
         ["c.ini: unknown config file format (got '.ini'; allowed: .json, .yaml, .yml, .toml)"]),
        (["--check", "broken.json"], "out", ["broken.json: invalid JSON at line 1, column 10: Expecting value"]),
        (["--file", "broken.json"], "err", ["broken.json: invalid JSON at line 1, column 10: Expecting value"]),
    ],
)
def test_file_problems(in_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], stream: str,
                       expected: list[str]) -> None:
    (in_dir / "c.ini").write_text("")
    (in_dir / "broken.json").write_text('{"gzip": }')
    assert main(["config", *args]) == 1
    captured = capsys.readouterr()
    assert getattr(captured, stream).splitlines() == expected


def test_file_and_check_are_exclusive(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["config", "--file", "a.yaml", "--check", "b.yaml"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
