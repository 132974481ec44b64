"""Bad input at the call site: every scope checks its arguments when it is created and raises one
``ConfigError`` listing every problem, as a config file does; nothing is half-applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import torchstep_prof as tsp
from torchstep_prof import ProfilerConfig, ScheduleConfig
from torchstep_prof.errors import ConfigError

CONTENTS = "cpu, cuda, memory, shapes, stack, flops, modules, nvtx, memory_snapshot"
FIELDS = "enable, save_path, discrete, gzip, summary, process_role, ranks, all_ranks, contents, schedule, finish_hook, on_demand, metrics, auto_trace, stall, spans"
PATH_RULE = "allowed: a path without '\"', '\\' or control characters"

BAD_CALLS: list[tuple[Callable[[], Any], list[str]]] = [
    (
        lambda: tsp.configure(gzip="yes", sav_path="x", schedule={"step": [1]}),
        ["gzip: must be true or false (got 'yes')",
         "sav_path: unknown key (did you mean 'save_path'?)",
         "schedule.step: unknown key (did you mean 'steps'?)"],
    ),
    (
        lambda: tsp.configure(schedule={"wait": -1, "active": "2"}, finish_hook={"cmd": None}, colour="red"),
        ["schedule.wait: must be >= 0 (got -1)",
         "schedule.active: must be an integer (got '2')",
         "finish_hook.cmd: must be a string or a list of strings (got None)",
         f"colour: unknown key (allowed: {FIELDS})"],
    ),
    (lambda: tsp.configure(schedule=5), ["schedule: must be a ScheduleConfig or null (got 5)"]),
    (lambda: tsp.configure(5), ["config: must be a ProfilerConfig, the path of a config file or None (got 5)"]),
    (
        lambda: tsp.configure(5, gzip=1),
        ["config: must be a ProfilerConfig, the path of a config file or None (got 5)",
         "gzip: must be true or false (got 1)"],
    ),
    (
        lambda: tsp.configure("missing.yaml", gzip=1),
        ["missing.yaml: cannot be read (No such file or directory)", "gzip: must be true or false (got 1)"],
    ),
    (
        lambda: tsp.configure(ProfilerConfig(), ranks=[-1], timeout=3),
        ["ranks[0]: must be >= 0 (got -1)", f"timeout: unknown key (allowed: {FIELDS})"],
    ),
    (lambda: tsp.on_finish(None), ["finish_hook.cmd: must be a string or a list of strings (got None)"]),
    (lambda: tsp.on_finish(5), ["finish_hook.cmd: must be a string or a list of strings (got 5)"]),
    (
        lambda: tsp.on_finish(["up", 3], ranks="a", timeout_s=float("inf"), relocate=5, wait="no"),
        ["finish_hook.cmd[1]: must be a string (got 3)",
         "finish_hook.ranks: must be a list of integers (got 'a')",
         "finish_hook.wait: must be true or false (got 'no')",
         "finish_hook.timeout_s: must be a finite number of seconds (got inf)",
         "finish_hook.relocate: must be a list of directories (got 5)"],
    ),
    (
        lambda: tsp.on_finish("true", node_wait_s=float("nan")),
        ["finish_hook.node_wait_s: must be a finite number of seconds (got nan)"],
    ),
    (lambda: tsp.ranks("a"), ["ranks[0]: must be an integer (got 'a')"]),
    (lambda: tsp.ranks(None), ["ranks[0]: must be an integer (got None)"]),
    (
        lambda: tsp.ranks(0, "a", 1.5, all_ranks="x"),
        ["ranks[1]: must be an integer (got 'a')", "ranks[2]: must be an integer (got 1.5)",
         "all_ranks: must be true or false (got 'x')"],
    ),
    (lambda: tsp.ranks(), ["ranks: name at least one rank, or pass all_ranks=True (got none)"]),
    (lambda: tsp.ranks(all_ranks="x"), ["all_ranks: must be true or false (got 'x')"]),
    (lambda: tsp.ranks(1, 1), ["ranks: must not repeat a value (got [1, 1]; repeated [1])"]),
    (
        lambda: tsp.contents("gpu", "cpu", 3),
        [f"contents: 'gpu' is not one of {CONTENTS}", f"contents: 3 is not one of {CONTENTS}"],
    ),
    (lambda: tsp.contents(["cuda", "gpu"]), [f"contents: 'gpu' is not one of {CONTENTS}"]),
    (
        lambda: tsp.schedule(steps=[-1, "a"], wait=-1),
        ["schedule.steps[0]: must be >= 0 (got -1)", "schedule.steps[1]: must be an integer (got 'a')",
         "schedule.wait: must be >= 0 (got -1)"],
    ),
    (lambda: tsp.schedule(steps="1,3"), ["schedule.steps: must be a list of integers (got '1,3')"]),
    (lambda: tsp.schedule(steps=[]), ["schedule.steps: must list at least one value (got [])"]),
    (
        lambda: tsp.schedule(wait=float("inf"), active=0),
        ["schedule.wait: must be an integer (got inf)", "schedule.active: must be >= 1 (got 0)"],
    ),
    (
        lambda: tsp.configure(save_path="out\nnext"),
        [f"save_path: must not hold '\\n' (got 'out\\nnext'; {PATH_RULE})"],
    ),
]


def _lines(error: ConfigError) -> list[str]:
    return [str(p) for p in error.problems]


@pytest.mark.parametrize(("make", "expected"), BAD_CALLS, ids=[f"{i}-{e[0][:40]}" for i, (_, e) in enumerate(BAD_CALLS)])
def test_a_bad_call_lists_every_problem_in_one_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[], Any], expected: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # relative file names in the messages
    with tsp.configure(save_path="before"):
        with pytest.raises(ConfigError) as caught:
            make()
        assert tsp.effective_config() == ProfilerConfig(save_path="before")  # nothing half-applied
    assert _lines(caught.value) == expected
    assert isinstance(caught.value, ValueError)
    if len(expected) > 1:
        assert str(caught.value).splitlines()[0] == f"{len(expected)} problems in the configuration:"


def test_the_issue_example_reads_as_one_message() -> None:
    with pytest.raises(ConfigError) as caught:
        tsp.configure(gzip="yes", sav_path="x", schedule={"step": [1]})
    assert str(caught.value) == (
        "3 problems in the configuration:\n"
        "  gzip: must be true or false (got 'yes')\n"
        "  sav_path: unknown key (did you mean 'save_path'?)\n"
        "  schedule.step: unknown key (did you mean 'steps'?)"
    )


def test_a_bad_scope_used_as_a_decorator_fails_where_it_is_written() -> None:
    with pytest.raises(ConfigError) as caught:

        @tsp.on_finish(None)
        def train() -> None:  # pragma: no cover - never decorated
            pass

    assert _lines(caught.value) == ["finish_hook.cmd: must be a string or a list of strings (got None)"]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: tsp.schedule(steps=[0, 2]), ScheduleConfig(steps=(0, 2))),
        (lambda: tsp.schedule(steps=range(0, 6, 2)), ScheduleConfig(steps=(0, 2, 4))),
        (lambda: tsp.configure(schedule={"steps": [0]}), ScheduleConfig(steps=(0,))),
    ],
)
def test_step_zero_is_a_valid_explicit_step(make: Callable[[], Any], expected: ScheduleConfig) -> None:
    with make():
        assert tsp.effective_config().schedule == expected


def test_list_forms_of_ranks_and_contents_are_accepted() -> None:
    with tsp.ranks([0, 2]), tsp.contents(["cpu", "shapes"]):
        config = tsp.effective_config()
    assert (config.ranks, config.contents) == ((0, 2), ("cpu", "shapes"))


@pytest.mark.parametrize(
    ("save_path", "shown"),
    [
        ('out"x', "'\"'"),
        ("out\\x", "'\\\\'"),
        ("out\nx", "'\\n'"),
        ("a\tb\x7f", "'\\t', '\\x7f'"),
        ("a\x85", "'\\x85'"),
        ("\x00", "'\\x00'"),
    ],
)
def test_save_path_characters_no_viewer_handles_are_refused_up_front(save_path: str, shown: str) -> None:
    expected = f"save_path: must not hold {shown} (got {save_path!r}; {PATH_RULE})"
    with pytest.raises(ConfigError) as caught:
        ProfilerConfig(save_path=save_path)
    assert str(caught.value) == expected
    with pytest.raises(ConfigError) as caught:
        tsp.configure(save_path=save_path)
    assert str(caught.value) == expected


def test_save_path_characters_in_files_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchstep_prof import apply_overrides, load_config

    monkeypatch.chdir(tmp_path)
    Path("c.json").write_text('{"save_path": "out\\\\x"}')
    with pytest.raises(ConfigError) as caught:
        load_config("c.json")
    assert str(caught.value) == f"save_path: must not hold '\\\\' (got 'out\\\\x'; {PATH_RULE})"
    with pytest.raises(ConfigError) as caught:
        apply_overrides(ProfilerConfig(), ['save_path="a\\nb"'])
    assert str(caught.value) == f"save_path: must not hold '\\n' (got 'a\\nb'; {PATH_RULE})"


@pytest.mark.parametrize("save_path", ["out dir", "$(touch x); rm", "café/😀", "a'b", "../x", "~/p"])
def test_other_save_paths_are_accepted(save_path: str) -> None:
    assert ProfilerConfig(save_path=save_path).save_path == save_path
