"""read_environment: the environment's layer wins over the code's config, is cached, names its source."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from torchstep_prof.config.model import FinishHookConfig, ProfilerConfig, ScheduleConfig
from torchstep_prof.config.files import dump_config
from torchstep_prof.config.variables import ENV_CONFIG, ENV_OVERRIDES, ENV_SUMMARY
from torchstep_prof.config.environment import (
    EnvironmentLayer,
    read_environment,
    summary_disabled,
)
from torchstep_prof.errors import ConfigError

CODE = ProfilerConfig(gzip=True, ranks=(3,), schedule=ScheduleConfig(wait=1, active=2),
                      finish_hook=FinishHookConfig(cmd="code-hook"))


def test_variable_names() -> None:
    assert (ENV_CONFIG, ENV_OVERRIDES, ENV_SUMMARY) == (
        "TORCHSTEP_PROF_CONFIG", "TORCHSTEP_PROF_OVERRIDES", "TORCHSTEP_PROF_SUMMARY")


@pytest.mark.parametrize("environ", [{}, {ENV_CONFIG: ""}, {ENV_OVERRIDES: "  "}, {"OTHER": "x"}])
def test_nothing_set_is_empty(environ: dict[str, str]) -> None:
    layer = read_environment(environ)
    assert layer.is_empty and not layer.sets_finish_hook
    assert layer.apply(CODE) is CODE


def test_overrides_apply_on_top_of_the_code() -> None:
    layer = read_environment({ENV_OVERRIDES: "schedule.repeat=3 ranks=[0,1] 'finish_hook.cmd=upload x'"})
    assert not layer.is_empty and layer.sets_finish_hook
    assert layer.apply(CODE) == ProfilerConfig(
        gzip=True, ranks=(0, 1), schedule=ScheduleConfig(wait=1, active=2, repeat=3),
        finish_hook=FinishHookConfig(cmd="upload x"),
    )
    assert layer.apply(ProfilerConfig()).schedule == ScheduleConfig(repeat=3)  # null section created


def test_the_spec_example() -> None:
    layer = read_environment({ENV_OVERRIDES: "schedule.steps=[2] ranks=[0,1] 'finish_hook.cmd=upload x'"})
    cfg = layer.apply(ProfilerConfig())
    assert cfg.schedule == ScheduleConfig(steps=(2,)) and cfg.ranks == (0, 1)
    assert cfg.finish_hook == FinishHookConfig(cmd="upload x")


def test_a_file_replaces_the_code_config_then_overrides_apply(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    dump_config(ProfilerConfig(schedule=ScheduleConfig(steps=(5,))), path)
    layer = read_environment({ENV_CONFIG: str(path)})
    assert layer.config_path == str(path) and not layer.sets_finish_hook
    assert layer.apply(CODE) == ProfilerConfig(schedule=ScheduleConfig(steps=(5,)))  # code's hook gone too
    layer = read_environment({ENV_CONFIG: str(path), ENV_OVERRIDES: "gzip=true"})
    assert layer.apply(CODE) == ProfilerConfig(schedule=ScheduleConfig(steps=(5,)), gzip=True)


@pytest.mark.parametrize(
    ("file_hook", "overrides", "expected"),
    [
        (False, "", False),
        (True, "", True),
        (False, "finish_hook.cmd=x", True),
        (None, "finish_hook.timeout_s=5", True),  # the hook's command comes from the code
        (None, "'finish_hook={cmd: x}'", True),
        (True, "finish_hook=null", False),
        (None, "finish_hook=null", False),
        (False, "finish_hook=null finish_hook.cmd=x", True),
        (None, "gzip=true", False),
    ],
)
def test_sets_finish_hook(tmp_path: Path, file_hook: bool | None, overrides: str, expected: bool) -> None:
    environ = {ENV_OVERRIDES: overrides}
    if file_hook is not None:  # None: no file
        path = tmp_path / "env.toml"
        dump_config(ProfilerConfig(finish_hook=FinishHookConfig(cmd="f") if file_hook else None), path)
        environ[ENV_CONFIG] = str(path)
    assert read_environment(environ).sets_finish_hook is expected


def test_a_layer_is_data() -> None:
    layer = read_environment({ENV_OVERRIDES: "gzip=true"})
    assert isinstance(layer, EnvironmentLayer)
    assert layer == read_environment({ENV_OVERRIDES: " gzip=true "})  # equal, cache or not
    with pytest.raises(AttributeError):
        layer.config = ProfilerConfig()  # type: ignore[misc]


def test_os_environ_is_read_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    monkeypatch.setenv(ENV_OVERRIDES, "discrete=false")
    assert read_environment().apply(ProfilerConfig()).discrete is False
    monkeypatch.delenv(ENV_OVERRIDES)
    assert read_environment().is_empty


def test_parsed_once_and_cached() -> None:
    environ = {ENV_OVERRIDES: "schedule.steps=[2] all_ranks=true"}
    first = read_environment(environ)
    assert read_environment(dict(environ)) is first
    assert read_environment({ENV_OVERRIDES: "all_ranks=true"}) is not first
    cfg = ProfilerConfig()
    assert first.apply(cfg) is first.apply(cfg)


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "env.json"
    dump_config(ProfilerConfig(gzip=True), path)
    environ = {ENV_CONFIG: str(path)}
    first = read_environment(environ)
    assert read_environment(environ) is first
    dump_config(ProfilerConfig(gzip=False, summary=False), path)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a newer mtime, whatever the clock
    assert read_environment(environ).apply(CODE) == ProfilerConfig(gzip=False, summary=False)


def test_reading_an_unchanged_environment_is_cheap(tmp_path: Path) -> None:
    path = tmp_path / "env.yaml"
    dump_config(ProfilerConfig(), path)
    environ = {ENV_CONFIG: str(path), ENV_OVERRIDES: "schedule.steps=[2]"}
    read_environment(environ)
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        read_environment(environ)
    per_call = (time.perf_counter() - start) / n
    # A few microseconds (one stat) in practice; the bound only catches a re-parse (~1 ms).
    assert per_call < 100e-6


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {ENV_OVERRIDES: "schedule.wait=-1 'x"},
            ["TORCHSTEP_PROF_OVERRIDES: cannot split \"schedule.wait=-1 'x\" like a shell command line "
             "(No closing quotation)"],
        ),
        (
            {ENV_OVERRIDES: "shedule.steps=[2] ranks=[1, noequals"},
            ["TORCHSTEP_PROF_OVERRIDES: shedule: unknown key in override 'shedule.steps=[2]' (did you mean 'schedule'?)",
             "TORCHSTEP_PROF_OVERRIDES: ranks: override 'ranks=[1,' has a value that is not valid YAML "
             "(expected the node content, but found '<stream end>' at column 4)",
             "TORCHSTEP_PROF_OVERRIDES: override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])"],
        ),
        (
            {ENV_CONFIG: "missing.toml"},
            ["TORCHSTEP_PROF_CONFIG: missing.toml: cannot be read (No such file or directory)"],
        ),
        (
            {ENV_CONFIG: "bad.yaml"},
            ["TORCHSTEP_PROF_CONFIG=bad.yaml: schedule.wait: must be >= 0 (got -1)",
             "TORCHSTEP_PROF_CONFIG=bad.yaml: colour: unknown key (allowed: enable, save_path, discrete, gzip, "
             "summary, process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans)"],
        ),
        (
            {ENV_CONFIG: "bad.yaml", ENV_OVERRIDES: "gzip=2 shedule.wait=1"},
            ["TORCHSTEP_PROF_CONFIG=bad.yaml: schedule.wait: must be >= 0 (got -1)",
             "TORCHSTEP_PROF_CONFIG=bad.yaml: colour: unknown key (allowed: enable, save_path, discrete, gzip, "
             "summary, process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans)",
             "TORCHSTEP_PROF_OVERRIDES: shedule: unknown key in override 'shedule.wait=1' (did you mean 'schedule'?)",
             "TORCHSTEP_PROF_OVERRIDES: gzip: must be true or false (got 2)"],
        ),
        (
            {ENV_CONFIG: "good.yaml", ENV_OVERRIDES: "schedule.steps=[-1]"},
            ["TORCHSTEP_PROF_OVERRIDES: schedule.steps[0]: must be >= 0 (got -1)"],
        ),
    ],
)
def test_a_bad_environment_names_its_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               environ: dict[str, str], expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text("schedule: {wait: -1}\ncolour: red\n")
    Path("good.yaml").write_text("schedule: {wait: 1}\n")
    for _ in range(2):  # a cached error is raised again, each time
        with pytest.raises(ConfigError) as info:
            read_environment(environ)
        assert [str(p) for p in info.value.problems] == expected


def test_five_bad_overrides_are_all_listed_as_apply_overrides_lists_them() -> None:
    # The malformed ones and the bad value of a well-formed one (`schedule.wait=-1`) together.
    import shlex

    from torchstep_prof.config.overrides import apply_overrides

    text = "schedule.wait=-1 noequals sav_path=x 'ranks=[a' gzip=maybe"
    expected = [
        "override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])",
        "sav_path: unknown key in override 'sav_path=x' (did you mean 'save_path'?)",
        "ranks: override 'ranks=[a' has a value that is not valid YAML (expected ',' or ']', but got "
        "'<stream end>' at column 3)",
        "gzip: must be true or false (got 'maybe')",
        "schedule.wait: must be >= 0 (got -1)",
    ]
    with pytest.raises(ConfigError) as direct:
        apply_overrides(ProfilerConfig(), shlex.split(text))
    assert [str(p) for p in direct.value.problems] == expected
    with pytest.raises(ConfigError) as info:
        read_environment({ENV_OVERRIDES: text})
    assert [str(p) for p in info.value.problems] == [f"TORCHSTEP_PROF_OVERRIDES: {line}" for line in expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("schedule.wait=-1 gzip=2 nosuch=1 ranks=[-2] finish_hook.timeout_s=-3",
         ["nosuch: unknown key in override 'nosuch=1' (allowed: enable, save_path, discrete, gzip, summary, "
          "process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans)",
          "gzip: must be true or false (got 2)",
          "ranks[0]: must be >= 0 (got -2)",
          "schedule.wait: must be >= 0 (got -1)",
          "finish_hook.timeout_s: must be > 0 (got -3)"]),
        ("finish_hook.timeout_s=-3", ["finish_hook.timeout_s: must be > 0 (got -3)"]),
        ("finish_hook.wait=maybe finish_hook.per_node=7",
         ["finish_hook.per_node: must be true or false (got 7)",
          "finish_hook.wait: must be true or false (got 'maybe')"]),
        ("gzip=true 'finish_hook.relocate=[1]' finish_hook.node_wait_s=-1",
         ["finish_hook.node_wait_s: must be >= 0 (got -1)",
          "finish_hook.relocate[0]: must be a non-empty string (got 1)"]),
    ],
    ids=["with-others", "timeout-alone", "two-booleans", "relocate"],
)
@pytest.mark.parametrize("entry", ["schedule", "region"])
def test_bad_hook_fields_raise_at_the_first_scope_even_when_the_code_has_no_hook(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: list[str], entry: str
) -> None:
    # Their command would come from the code's on_finish (deferred), their values are checked
    # now: every bad override is listed, as apply_overrides lists them (less the command it
    # asks for, which the code gives).
    import shlex

    import torchstep_prof as tsp
    from torchstep_prof.config.overrides import apply_overrides

    with pytest.raises(ConfigError) as direct:
        apply_overrides(ProfilerConfig(), shlex.split(text))
    assert [str(p) for p in direct.value.problems if p.path != "finish_hook.cmd"] == expected
    monkeypatch.setenv(ENV_OVERRIDES, text)
    with pytest.raises(ConfigError) as info:
        if entry == "schedule":
            with tsp.schedule(steps=[1]):
                pass
        else:
            with tsp.profile_region("actor", "update", step=1):
                pass
    assert [str(p) for p in info.value.problems] == [f"TORCHSTEP_PROF_OVERRIDES: {line}" for line in expected]


def test_good_hook_fields_still_wait_for_the_codes_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchstep_prof as tsp

    monkeypatch.setenv(ENV_OVERRIDES, "finish_hook.timeout_s=5 finish_hook.wait=true")
    with tsp.schedule(steps=[1]):
        assert tsp.effective_config().finish_hook is None
        with tsp.on_finish("echo done"):
            hook = tsp.effective_config().finish_hook
    assert hook == FinishHookConfig(cmd="echo done", timeout_s=5, wait=True)


def test_hook_tuning_waits_for_a_config_with_a_hook() -> None:
    # The layer is applied at every scope, also at those entered before the code's on_finish:
    # tuning the code's hook must not fail there for want of a command.
    layer = read_environment({ENV_OVERRIDES: "finish_hook.timeout_s=5 gzip=true"})
    assert layer.apply(CODE).finish_hook == FinishHookConfig(cmd="code-hook", timeout_s=5)
    no_hook = layer.apply(ProfilerConfig())
    assert no_hook.finish_hook is None and no_hook.gzip is True


def test_an_environment_schedule_replaces_the_code_schedule_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment's word wins: an explicit list over the code's cycle, and a cycle over a list.
    listed = read_environment({ENV_OVERRIDES: "schedule.steps=[2]"})
    assert listed.apply(ProfilerConfig(schedule=ScheduleConfig(wait=1, active=2))).schedule == ScheduleConfig(steps=(2,))
    cycled = read_environment({ENV_OVERRIDES: "schedule.active=3"})
    assert cycled.apply(ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3)))).schedule == ScheduleConfig(active=3)
    monkeypatch.chdir(tmp_path)
    Path("good.yaml").write_text("schedule: {wait: 1}\n")
    both = read_environment({ENV_CONFIG: "good.yaml", ENV_OVERRIDES: "schedule.steps=[2]"})
    assert both.apply(ProfilerConfig()).schedule == ScheduleConfig(steps=(2,))


@pytest.mark.parametrize(
    ("value", "disabled"),
    [("0", True), ("false", True), ("No", True), (" OFF ", True), ("1", False), ("true", False), ("", False),
     (None, False)],
)
def test_summary_disabled(value: str | None, disabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_SUMMARY, raising=False)
    if value is not None:
        monkeypatch.setenv(ENV_SUMMARY, value)
    assert summary_disabled() is disabled


_ENVIRONMENT_HOOK_SCRIPT = """
import sys, torch, torchstep_prof as tsp
if sys.argv[1] == "region":
    with tsp.step(1), tsp.profile_region("actor", "update"):
        torch.ones(2).add(1)
"""


@pytest.mark.parametrize("used", ["region", "import-only"])
def test_an_environment_hook_runs_at_exit_in_a_process_that_used_a_region_only(tmp_path: Path, used: str) -> None:
    # The import prepares what it can for the environment's schedule; a hook set through the
    # environment still belongs to a process that ran a scope or a region (an evaluation script
    # run with the training job's exported variables runs none of it).
    import subprocess
    import sys

    marker = tmp_path / "hook-ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env["TORCHSTEP_PROF_OVERRIDES"] = (
        f"schedule.steps=[1] save_path={tmp_path / 'profile'} summary=false "
        f"finish_hook.cmd='touch {marker}'"
    )
    result = subprocess.run(
        [sys.executable, "-c", _ENVIRONMENT_HOOK_SCRIPT, used], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists() is (used == "region"), result.stderr
