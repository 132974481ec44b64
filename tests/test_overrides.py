"""apply_overrides / parse_each: YAML values, null sections created, exact errors, all or nothing."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, settings

from strategies import TYPED_TEXT, configs
from torchstep_prof.config.model import FinishHookConfig, ProfilerConfig, ScheduleConfig
from torchstep_prof.config.converter import to_dict
from torchstep_prof.errors import ConfigError
from torchstep_prof.config.overrides import Override, apply_overrides, parse_each

TOP_KEYS = "enable, save_path, discrete, gzip, summary, process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans"


def test_the_spec_example() -> None:
    cfg = apply_overrides(ProfilerConfig(), ["schedule.steps=[1,3]", "all_ranks=true", "finish_hook.cmd=echo hi"])
    assert cfg == ProfilerConfig(
        schedule=ScheduleConfig(steps=(1, 3)), all_ranks=True, finish_hook=FinishHookConfig(cmd="echo hi")
    )


@pytest.mark.parametrize(
    ("override", "field", "value"),
    [
        ("save_path=/x", "save_path", "/x"),
        ("save_path='/with space'", "save_path", "/with space"),
        ("save_path=2024-01-01", "save_path", "2024-01-01"),  # YAML would make it a date
        ("process_role='actor'", "process_role", "actor"),
        ("process_role=null", "process_role", None),
        ("ranks=[0, 2]", "ranks", (0, 2)),
        ("ranks=[]", "ranks", ()),
        ("contents=[cpu, shapes]", "contents", ("cpu", "shapes")),
        ("gzip=false", "gzip", False),
        ("discrete=False", "discrete", False),
    ],
)
def test_values_parse_as_yaml(override: str, field: str, value: object) -> None:
    assert getattr(apply_overrides(ProfilerConfig(gzip=True, process_role="r"), [override]), field) == value


@pytest.mark.parametrize(
    ("value", "cmd"),
    [
        ("echo hi", "echo hi"),
        ("upload x && echo 'done'", "upload x && echo 'done'"),
        ("echo a: b", "echo a: b"),  # YAML reads a mapping; a command is what was meant
        ("'echo # not a comment'", "echo # not a comment"),
        ("[echo, hi]", ("echo", "hi")),
        ("a=b", "a=b"),  # only the first '=' separates key and value
    ],
)
def test_a_string_stays_a_string(value: str, cmd: object) -> None:
    assert apply_overrides(ProfilerConfig(), [f"finish_hook.cmd={value}"]).finish_hook.cmd == cmd


def test_a_field_of_a_null_section_creates_it_with_defaults() -> None:
    cfg = apply_overrides(ProfilerConfig(), ["schedule.wait=2"])
    assert cfg.schedule == ScheduleConfig(wait=2)
    hook = apply_overrides(ProfilerConfig(), ["finish_hook.cmd=up", "finish_hook.timeout_s=5"]).finish_hook
    assert hook == FinishHookConfig(cmd="up", timeout_s=5)


def test_fields_merge_into_an_existing_section() -> None:
    base = ProfilerConfig(schedule=ScheduleConfig(wait=1, active=2))
    assert apply_overrides(base, ["schedule.repeat=3"]).schedule == ScheduleConfig(wait=1, active=2, repeat=3)


def test_whole_sections_are_replaced_or_removed() -> None:
    base = ProfilerConfig(schedule=ScheduleConfig(wait=1), finish_hook=FinishHookConfig(cmd="x"))
    cfg = apply_overrides(base, ["schedule={steps: [2]}", "finish_hook=null"])
    assert cfg.schedule == ScheduleConfig(steps=(2,)) and cfg.finish_hook is None


def test_later_overrides_win_and_the_input_is_untouched() -> None:
    base = ProfilerConfig()
    cfg = apply_overrides(base, ["ranks=[1]", "ranks=[2]"])
    assert cfg.ranks == (2,) and base == ProfilerConfig()
    assert apply_overrides(base, []) == base


def test_parse_each_checks_without_a_config() -> None:
    parsed, problems = parse_each(["schedule.steps=[1,3]", " all_ranks = true"])
    assert parsed == (
        Override(text="schedule.steps=[1,3]", path=("schedule", "steps"), value=[1, 3]),
        Override(text=" all_ranks = true", path=("all_ranks",), value=True),
    )
    assert problems == []
    assert apply_overrides(ProfilerConfig(), parsed).schedule.steps == (1, 3)


@settings(max_examples=100, deadline=None)
@given(configs(TYPED_TEXT), configs(TYPED_TEXT))
def test_overriding_every_field_gives_the_other_config(a: ProfilerConfig, b: ProfilerConfig) -> None:
    # JSON is a YAML flow value: overriding each key of `a` with `b`'s gives `b`.
    overrides = [f"{key}={json.dumps(value)}" for key, value in to_dict(b).items()]
    assert apply_overrides(a, overrides) == b


BAD_OVERRIDES = [
    (
        ["schedule.steps=[1,"],
        ["schedule.steps: override 'schedule.steps=[1,' has a value that is not valid YAML "
         "(expected the node content, but found '<stream end>' at column 4)"],
    ),
    (
        ["ranks=[0,1"],
        ["ranks: override 'ranks=[0,1' has a value that is not valid YAML "
         "(expected ',' or ']', but got '<stream end>' at column 5)"],
    ),
    (
        ["schedule.wait=@x"],
        ["schedule.wait: override 'schedule.wait=@x' has a value that is not valid YAML "
         "(found character '@' that cannot start any token at column 1; to pass text, quote it: key='...')"],
    ),
    (["=3"], ["override '=3' has an empty key (expected key=value)"]),
    ([" =3"], ["override ' =3' has an empty key (expected key=value)"]),
    (
        ["a..b=1"],
        ["a..b: override 'a..b=1' has an empty key segment (expected names joined by '.', e.g. schedule.wait)"],
    ),
    (
        ["schedule.=1"],
        ["schedule.: override 'schedule.=1' has an empty key segment (expected names joined by '.', e.g. schedule.wait)"],
    ),
    (["noequals"], ["override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])"]),
    ([3], ["an override must be a string key=value (got 3)"]),
    (["schedul.steps=[1]"], ["schedul: unknown key in override 'schedul.steps=[1]' (did you mean 'schedule'?)"]),
    (["schedule.stepz=[1]"], ["schedule.stepz: unknown key in override 'schedule.stepz=[1]' (did you mean 'steps'?)"]),
    (
        ["finish_hook.timeout=5"],
        ["finish_hook.timeout: unknown key in override 'finish_hook.timeout=5' (did you mean 'timeout_s'?)"],
    ),
    (["zzz=1"], [f"zzz: unknown key in override 'zzz=1' (allowed: {TOP_KEYS})"]),
    (
        ["save_path.x=1"],
        ["save_path.x: override 'save_path.x=1' sets a key inside save_path, which is a value, "
         "not a section (sections: schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans)"],
    ),
    (
        ["schedule.steps.first=1"],
        ["schedule.steps.first: override 'schedule.steps.first=1' sets a key inside schedule.steps, "
         "which is a value, not a section (sections: schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans)"],
    ),
    (["schedule.wait=-1"], ["schedule.wait: must be >= 0 (got -1)"]),
    (["schedule.wait=1.5"], ["schedule.wait: must be an integer (got 1.5)"]),
    (["schedule.wait='1'"], ["schedule.wait: must be an integer (got '1')"]),
    (["all_ranks=maybe"], ["all_ranks: must be true or false (got 'maybe')"]),
    (["contents=[gpu]"], ["contents: 'gpu' is not one of cpu, cuda, memory, shapes, stack, flops, modules, nvtx, memory_snapshot"]),
    (["finish_hook.timeout_s=5"], ["finish_hook.cmd: required"]),
    (
        ["schedule=3", "schedule.wait=1"],
        ["schedule: must be a mapping or null (got 3; allowed keys: steps, skip_first, wait, warmup, active, repeat)"],
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD_OVERRIDES, ids=[repr(o)[:50] for o, _ in BAD_OVERRIDES])
def test_bad_overrides(overrides: list, expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(ProfilerConfig(), overrides)
    assert [str(p) for p in info.value.problems] == expected


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["schedule.wait=1e400"], ["schedule.wait: must be a finite number (got inf)"]),
        (["finish_hook.cmd=x", "finish_hook.timeout_s=.inf", "finish_hook.node_wait_s=.nan"],
         ["finish_hook.node_wait_s: must be a finite number (got nan)",
          "finish_hook.timeout_s: must be a finite number (got inf)"]),
        (["ranks=[0, -.inf]"], ["ranks[1]: must be a finite number (got -inf)"]),
        (["schedule={steps: [1], steps: [2]}"],
         ["schedule.steps: duplicate key at line 1, column 14 (first at line 1); a key may appear once"]),
    ],
)
def test_non_finite_numbers_and_duplicate_keys_in_overrides(overrides: list[str], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(ProfilerConfig(), overrides)
    assert [str(p) for p in info.value.problems] == expected


def test_every_problem_of_every_override_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(
            ProfilerConfig(),
            ["ranks=[1,2", "all_ranks=maybe", "noequals", "schedule.wait=-1", "x=1", "schedule.active=0"],
        )
    assert [str(p) for p in info.value.problems] == [
        "ranks: override 'ranks=[1,2' has a value that is not valid YAML "
        "(expected ',' or ']', but got '<stream end>' at column 5)",
        "override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])",
        f"x: unknown key in override 'x=1' (allowed: {TOP_KEYS})",
        "all_ranks: must be true or false (got 'maybe')",
        "schedule.wait: must be >= 0 (got -1)",
        "schedule.active: must be >= 1 (got 0)",
    ]


def test_parse_each_reports_every_malformed_one() -> None:
    parsed, problems = parse_each(["=1", "a..b=1", "ok=1", "ranks=[1]"])
    assert [p.path for p in problems] == ["", "a..b", "ok"]
    assert [o.path for o in parsed] == [("ranks",)]


def test_nothing_is_half_applied() -> None:
    base = ProfilerConfig(ranks=(3,))
    with pytest.raises(ConfigError):
        apply_overrides(base, ["ranks=[1]", "schedule.wait=-1"])
    assert base == ProfilerConfig(ranks=(3,))
    assert attrs.evolve(base) == base


def test_parsed_overrides_are_reusable() -> None:
    parsed, _ = parse_each(["schedule={steps: [1]}", "schedule.steps=[2]", "ranks=[4]"])
    first = apply_overrides(ProfilerConfig(), parsed)
    assert apply_overrides(ProfilerConfig(), parsed) == first == apply_overrides(
        ProfilerConfig(), ["schedule={steps: [2]}", "ranks=[4]"])
    assert parsed[0].value == {"steps": [1]}


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [
        ("finish_hook.cmd=echo #hi", ("finish_hook", "cmd"), "echo #hi"),  # not a YAML comment
        ("finish_hook.cmd=upload a: b", ("finish_hook", "cmd"), "upload a: b"),
        ("finish_hook.cmd=[echo, hi]", ("finish_hook", "cmd"), ("echo", "hi")),  # a list: no shell
        ("save_path=on", ("save_path",), "on"),  # a folder, not True
        ("save_path=@runs", ("save_path",), "@runs"),
        ("finish_hook.cmd='/opt/my tools/up' --dir x", ("finish_hook", "cmd"), "'/opt/my tools/up' --dir x"),
        ("finish_hook.cmd=[ -d /x ] && upload", ("finish_hook", "cmd"), "[ -d /x ] && upload"),
        ("finish_hook.cmd=`which up`", ("finish_hook", "cmd"), "`which up`"),
        ("save_path=~", ("save_path",), "~"),
        ("save_path='quoted dir'", ("save_path",), "quoted dir"),
        ("process_role=yes", ("process_role",), "yes"),
        ("process_role=null", ("process_role",), None),
    ],
)
def test_text_fields_keep_the_text_typed(override, field, expected) -> None:
    cfg = apply_overrides(ProfilerConfig(), [override])
    value = cfg
    for name in field:
        value = getattr(value, name)
    assert value == expected


def test_a_schedule_override_replaces_the_other_form_of_the_base_schedule() -> None:
    cycle = ProfilerConfig(schedule=ScheduleConfig(wait=1, warmup=1, active=2))
    assert apply_overrides(cycle, ["schedule.steps=[2]"]).schedule == ScheduleConfig(steps=(2,))
    listed = ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3)))
    assert apply_overrides(listed, ["schedule.wait=2"]).schedule == ScheduleConfig(wait=2)
    # Both forms in one list of overrides contradict each other: that is reported.
    with pytest.raises(ConfigError) as info:
        apply_overrides(ProfilerConfig(), ["schedule.steps=[1]", "schedule.wait=1"])
    assert str(info.value) == (
        "schedule.wait: cannot be combined with an explicit steps list (got 1; leave it at 0 or set steps to null)"
    )
