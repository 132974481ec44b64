"""to_dict / from_dict: exact round trips, strict structuring, every problem at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

import torchstep_prof
from strategies import configs, finish_hooks, schedules
from torchstep_prof.config.model import FinishHookConfig, OnDemandConfig, ProfilerConfig, ScheduleConfig
from torchstep_prof.config.converter import _converter, from_dict, schema, to_dict
from torchstep_prof.errors import ConfigError

ALL_TOP_KEYS = "enable, save_path, discrete, gzip, summary, process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans"
SCHEDULE_KEYS = "steps, skip_first, wait, warmup, active, repeat"
HOOK_KEYS = "cmd, ranks, all_ranks, per_node, node_wait_s, timeout_s, relocate, wait"
CONTENTS = "cpu, cuda, memory, shapes, stack, flops, modules, nvtx, memory_snapshot"


def _only_plain_data(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _only_plain_data(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_only_plain_data(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str))


@settings(max_examples=200, deadline=None)
@given(configs())
def test_dict_round_trip(cfg: ProfilerConfig) -> None:
    data = to_dict(cfg)
    assert _only_plain_data(data)  # lists, not tuples; nothing but JSON's types
    assert from_dict(data) == cfg
    assert from_dict(json.loads(json.dumps(data))) == cfg


@settings(max_examples=50, deadline=None)
@given(schedules(), finish_hooks())
def test_section_round_trip(schedule: ScheduleConfig, hook: FinishHookConfig) -> None:
    assert from_dict(to_dict(schedule), ScheduleConfig) == schedule
    assert from_dict(to_dict(hook), FinishHookConfig) == hook


def test_to_dict_keeps_none_and_every_key() -> None:
    data = to_dict(ProfilerConfig())
    assert data == {
        "enable": True,
        "save_path": "outputs/profile",
        "discrete": True,
        "gzip": False,
        "summary": True,
        "process_role": None,
        "ranks": [0],
        "all_ranks": False,
        "contents": [],
        "schedule": None,
        "finish_hook": None,
        "on_demand": None,
        "metrics": None,
        "auto_trace": None,
        "stall": None,
        "spans": None,
    }
    assert to_dict(OnDemandConfig(dir="/d")) == {"dir": "/d", "poll_s": 1.0}
    hook = to_dict(FinishHookConfig(cmd=("echo", "hi")))
    assert hook["cmd"] == ["echo", "hi"] and hook["timeout_s"] == 600.0 and hook["relocate"] == []


def test_from_dict_fills_defaults_and_makes_tuples() -> None:
    cfg = from_dict({"ranks": [0, 2], "schedule": {"steps": [1, 3]}, "finish_hook": {"cmd": ["a", "b"]}})
    assert cfg == ProfilerConfig(
        ranks=(0, 2), schedule=ScheduleConfig(steps=(1, 3)), finish_hook=FinishHookConfig(cmd=("a", "b"))
    )
    assert from_dict({}) == ProfilerConfig()
    assert from_dict({"schedule": {}}).schedule == ScheduleConfig()
    assert from_dict({"schedule": None, "finish_hook": None}) == ProfilerConfig()


def test_from_dict_rejects_other_classes() -> None:
    with pytest.raises(TypeError, match="from_dict builds one of"):
        from_dict({}, dict)


def test_schema_names_sections() -> None:
    assert schema(ProfilerConfig)["schedule"] is ScheduleConfig
    assert schema(ProfilerConfig)["finish_hook"] is FinishHookConfig
    assert schema(ProfilerConfig)["ranks"] is None
    assert list(schema(ScheduleConfig)) == SCHEDULE_KEYS.split(", ")


def test_converter_is_private() -> None:
    import cattrs

    assert _converter() is _converter()
    assert _converter() is not cattrs.global_converter


def test_importing_the_config_modules_does_not_import_cattrs_or_yaml() -> None:
    root = str(Path(torchstep_prof.__file__).resolve().parents[1])
    code = (
        "import sys; import torchstep_prof.config.model, torchstep_prof.config.converter, "
        "torchstep_prof.config.files, torchstep_prof.config.overrides, torchstep_prof.config.environment; "
        "print(sorted(m for m in ('cattrs', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": root}, cwd=root).stdout
    assert out.strip() == "[]"


# Each bad input with every line of the ConfigError it must raise, in order.
BAD_DICTS = [
    ({"enable": "yes"}, ["enable: must be true or false (got 'yes')"]),
    ({"enable": 1}, ["enable: must be true or false (got 1)"]),
    ({"all_ranks": None}, ["all_ranks: must be true or false (got None)"]),
    ({"save_path": ""}, ["save_path: must be a non-empty string (got '')"]),
    ({"save_path": 3}, ["save_path: must be a non-empty string (got 3)"]),
    ({"process_role": ""}, ["process_role: must be a non-empty string or null (got '')"]),
    ({"process_role": 3}, ["process_role: must be a non-empty string or null (got 3)"]),
    ({"ranks": [-1]}, ["ranks[0]: must be >= 0 (got -1)"]),
    ({"ranks": ["0"]}, ["ranks[0]: must be an integer (got '0')"]),
    ({"ranks": [1.5]}, ["ranks[0]: must be an integer (got 1.5)"]),
    ({"ranks": [1.0]}, ["ranks[0]: must be an integer (got 1.0)"]),
    ({"ranks": 0}, ["ranks: must be a list of integers (got 0)"]),
    ({"ranks": [1, 1]}, ["ranks: must not repeat a value (got [1, 1]; repeated [1])"]),
    ({"contents": ["gpu"]}, [f"contents: 'gpu' is not one of {CONTENTS}"]),
    ({"contents": "cpu"}, [f"contents: must be a list of names from {CONTENTS} (got 'cpu')"]),
    ({"schedul": {}}, ["schedul: unknown key (did you mean 'schedule'?)"]),
    ({"bogus": 1}, [f"bogus: unknown key (allowed: {ALL_TOP_KEYS})"]),
    ({1: 2}, [f"1: unknown key (allowed: {ALL_TOP_KEYS})"]),
    ({"schedule": {"wait": -1}}, ["schedule.wait: must be >= 0 (got -1)"]),
    ({"on_demand": {"poll_s": 0}}, ["on_demand.dir: required", "on_demand.poll_s: must be > 0 (got 0)"]),
    ({"on_demand": {"dir": "a\nb", "every": 1}}, ["on_demand.dir: must not hold '\\n' (got 'a\\nb'; allowed: a path "
                                                  "without '\"', '\\' or control characters)",
                                                  "on_demand.every: unknown key (allowed: dir, poll_s)"]),
    ({"schedule": {"active": 0}}, ["schedule.active: must be >= 1 (got 0)"]),
    ({"schedule": {"repeat": "1"}}, ["schedule.repeat: must be an integer (got '1')"]),
    ({"schedule": {"skip_first": 1.5}}, ["schedule.skip_first: must be an integer (got 1.5)"]),
    ({"schedule": {"warmup": True}}, ["schedule.warmup: must be an integer (got True)"]),
    ({"schedule": {"steps": []}}, ["schedule.steps: must list at least one value (got [])"]),
    ({"schedule": {"steps": 3}}, ["schedule.steps: must be a list of integers (got 3)"]),
    ({"schedule": {"steps": [-1]}}, ["schedule.steps[0]: must be >= 0 (got -1)"]),
    ({"schedule": {"steps": [2, 2]}}, ["schedule.steps: must not repeat a value (got [2, 2]; repeated [2])"]),
    (
        {"schedule": {"steps": [2], "wait": 1}},
        ["schedule.wait: cannot be combined with an explicit steps list (got 1; leave it at 0 or set steps to null)"],
    ),
    ({"schedule": {"step": [1]}}, ["schedule.step: unknown key (did you mean 'steps'?)"]),
    (
        {"schedule": [1, 3]},
        [f"schedule: must be a mapping or null (got [1, 3]; allowed keys: {SCHEDULE_KEYS})"],
    ),
    ({"finish_hook": {}}, ["finish_hook.cmd: required"]),
    ({"finish_hook": {"cmd": ""}}, ["finish_hook.cmd: must be a non-empty command (got '')"]),
    ({"finish_hook": {"cmd": []}}, ["finish_hook.cmd: must be a non-empty command (got [])"]),
    ({"finish_hook": {"cmd": ["echo", 1]}}, ["finish_hook.cmd[1]: must be a string (got 1)"]),
    ({"finish_hook": {"cmd": ["", "a"]}}, ["finish_hook.cmd[0]: must name a program (got '')"]),
    ({"finish_hook": {"cmd": 5}}, ["finish_hook.cmd: must be a string or a list of strings (got 5)"]),
    ({"finish_hook": {"cmd": "x", "timeout_s": 0}}, ["finish_hook.timeout_s: must be > 0 (got 0)"]),
    ({"finish_hook": {"cmd": "x", "node_wait_s": -1}}, ["finish_hook.node_wait_s: must be >= 0 (got -1)"]),
    (
        {"finish_hook": {"cmd": "x", "node_wait_s": "300"}},
        ["finish_hook.node_wait_s: must be a number of seconds (got '300')"],
    ),
    ({"finish_hook": {"cmd": "x", "per_node": "true"}}, ["finish_hook.per_node: must be true or false (got 'true')"]),
    ({"finish_hook": {"cmd": "x", "ranks": [-1]}}, ["finish_hook.ranks[0]: must be >= 0 (got -1)"]),
    ({"finish_hook": {"cmd": "x", "relocate": [""]}}, ["finish_hook.relocate[0]: must be a non-empty string (got '')"]),
    ({"finish_hook": {"cmd": "x", "relocat": []}}, ["finish_hook.relocat: unknown key (did you mean 'relocate'?)"]),
    (
        {"finish_hook": "echo hi"},
        [f"finish_hook: must be a mapping or null (got 'echo hi'; allowed keys: {HOOK_KEYS})"],
    ),
    ([], [f"the configuration must be a mapping of keys to values (got []; allowed keys: {ALL_TOP_KEYS})"]),
    (None, [f"the configuration must be a mapping of keys to values (got None; allowed keys: {ALL_TOP_KEYS})"]),
]


@pytest.mark.parametrize(("data", "expected"), BAD_DICTS, ids=[repr(d)[:60] for d, _ in BAD_DICTS])
def test_bad_dicts(data: object, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    assert [str(p) for p in info.value.problems] == expected
    assert isinstance(info.value, ValueError)


def test_every_problem_at_once_in_field_order() -> None:
    data = {
        "shedule": {"wait": 1},
        "ranks": [0, "1", -2],
        "contents": ["cpu", "gpu"],
        "schedule": {"wait": -1, "active": 0, "stepz": 1},
        "finish_hook": {"per_node": "yes", "timeout_s": -5},
        "gzip": "no",
    }
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    lines = [str(p) for p in info.value.problems]
    assert lines == [
        "gzip: must be true or false (got 'no')",
        "ranks[1]: must be an integer (got '1')",
        "ranks[2]: must be >= 0 (got -2)",
        f"contents: 'gpu' is not one of {CONTENTS}",
        "schedule.wait: must be >= 0 (got -1)",
        "schedule.active: must be >= 1 (got 0)",
        "schedule.stepz: unknown key (did you mean 'steps'?)",
        "finish_hook.cmd: required",
        "finish_hook.per_node: must be true or false (got 'yes')",
        "finish_hook.timeout_s: must be > 0 (got -5)",
        "shedule: unknown key (did you mean 'schedule'?)",
    ]
    message = str(info.value)
    assert message.startswith("11 problems in the configuration:\n")
    assert all(f"  {line}" in message.splitlines() for line in lines)


def test_problem_paths_are_structured() -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({"schedule": {"wait": -1}})
    (problem,) = info.value.problems
    assert (problem.path, problem.message) == ("schedule.wait", "must be >= 0 (got -1)")
