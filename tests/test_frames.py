"""The one selection rule (``Frame.action``) and the "no" it caches for regions, without torch.

A frame's rule must give what the schedule and rank rules say for every step, in any order of
asking; the "no" it caches for regions to return on without asking (``Frame.cached_no``, a run
of steps; ``Frame.rank_no``, a rank not selected under a process group) must only ever hold
steps the rule says no to, and hold the step it was cached for.
This module imports no torch: ``test_the_rule_modules_run_without_torch`` runs it with torch
made unimportable.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchstep_prof.config.model import MetricsConfig, ProfilerConfig, ScheduleConfig, SpansConfig, StallConfig
from torchstep_prof.selection.frames import Frame, HookScope
from torchstep_prof.selection.rules import (
    NO_END,
    NONE,
    RECORD,
    WARMUP,
    CyclePlan,
    ExplicitPlan,
    step_action,
)

HORIZON = 80  # steps asked about; every schedule below decides them all

_schedules = st.one_of(
    st.builds(
        lambda steps: ScheduleConfig(steps=tuple(steps)),
        st.lists(st.integers(0, 60), min_size=1, max_size=8, unique=True),
    ),
    st.builds(
        ScheduleConfig,
        skip_first=st.integers(0, 4),
        wait=st.integers(0, 3),
        warmup=st.integers(0, 2),
        active=st.integers(1, 3),
        repeat=st.integers(0, 4),
    ),
)


def frame_for(schedule: ScheduleConfig | None, ranks: tuple[int, ...] = (0,)) -> Frame:
    return Frame(ProfilerConfig(schedule=schedule, ranks=ranks), None)


def in_no(frame: Frame, step: int) -> bool:
    """Whether a region on ``step`` would return a no the frame cached (the default process
    group is None here: torch.distributed is not initialized)."""
    first, end = frame.cached_no
    return first <= step < end or frame.rank_no is None


# --- the plans: a schedule's run of steps around a step -----------------------------------------


@settings(max_examples=200, deadline=None)
@given(schedule=_schedules, step=st.integers(0, HORIZON))
def test_a_plans_run_holds_the_step_and_only_steps_of_its_action(schedule, step):
    plan = ExplicitPlan(schedule.steps) if schedule.steps is not None else CyclePlan(schedule)
    first, end, action = plan.run_of(step)
    assert first <= step < end
    assert action is step_action(schedule, step)
    for n in range(first, min(end, HORIZON + 10)):
        assert step_action(schedule, n) is action, (schedule, step, n)


def test_an_explicit_plan_gives_the_gaps_between_listed_steps():
    plan = ExplicitPlan((9, 2, 3))
    assert [plan.run_of(n) for n in (0, 2, 3, 4, 8, 9, 10)] == [
        (0, 2, NONE),
        (2, 3, RECORD),
        (3, 4, RECORD),
        (4, 9, NONE),
        (4, 9, NONE),
        (9, 10, RECORD),
        (10, NO_END, NONE),
    ]


def test_a_cycle_plan_runs_as_torch_profilers_schedule():
    plan = CyclePlan(ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2))
    assert [plan.run_of(n) for n in (0, 2, 3, 4, 6, 9, 10, 500)] == [
        (0, 2, NONE),  # step 0 and the skipped step 1
        (2, 3, NONE),  # wait
        (3, 4, WARMUP),
        (4, 6, RECORD),
        (6, 7, NONE),  # the second cycle's wait
        (8, 10, RECORD),
        (10, NO_END, NONE),  # repeat=2: over
        (10, NO_END, NONE),
    ]


def test_back_to_back_active_steps_are_one_run_however_many_cycles():
    assert CyclePlan(ScheduleConfig(active=3, repeat=1000)).run_of(2000) == (1, 3001, RECORD)


# --- the rule and its cached no ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(schedule=_schedules, steps=st.lists(st.integers(0, HORIZON), min_size=1, max_size=40))
def test_the_rule_is_the_schedules_in_any_order_and_its_no_never_hides_a_yes(schedule, steps):
    frame = frame_for(schedule)
    for step in steps:
        action = frame.action(step)
        assert action is step_action(schedule, step), (schedule, step)
        if action is NONE:
            assert in_no(frame, step)  # cached for the step it answered
        # Whatever was asked before, the cache holds only steps the rule says no to.
        first, end = frame.cached_no
        assert all(step_action(schedule, n) is NONE for n in range(first, min(end, HORIZON + 10)))


def test_a_fresh_frame_caches_nothing_so_its_first_region_asks_the_rule():
    frame = frame_for(ScheduleConfig(steps=(5,)))
    assert not any(in_no(frame, n) for n in range(HORIZON))


def test_a_yes_leaves_the_cached_no_as_it_was():
    frame = frame_for(ScheduleConfig(steps=(5, 9)))
    assert frame.action(7) is NONE and frame.cached_no == (6, 9)
    assert frame.action(5) is RECORD
    assert frame.cached_no == (6, 9)  # step 5 is not in it: its regions still ask the rule
    assert not in_no(frame, 5)


def test_a_rank_not_selected_caches_no_for_every_step():
    frame = frame_for(ScheduleConfig(steps=(1, 2)), ranks=(5,))  # this process is rank 0
    assert not in_no(frame, 1)
    assert frame.action(1) is NONE
    assert frame.rank_no is None  # the group it holds for: none, torch.distributed not initialized
    assert all(in_no(frame, n) for n in (0, 1, 2, 10**9))


def test_every_rank_with_all_ranks():
    frame = Frame(ProfilerConfig(schedule=ScheduleConfig(steps=(1,)), ranks=(5,), all_ranks=True), None)
    assert frame.action(1) is RECORD


def test_no_schedule_selects_nothing():
    frame = frame_for(None)
    assert frame.idle
    assert [frame.action(n) for n in range(0, 4)] == [NONE] * 4


def test_decide_marks_the_hook_scope_profiled_only_on_a_selected_step():
    config = ProfilerConfig(schedule=ScheduleConfig(steps=(2,)))
    scope = HookScope(config, None)
    frame = Frame(config, scope)
    assert [frame.decide(n) for n in (1, 3)] == [NONE, NONE]
    assert not scope.profiled
    assert frame.decide(2) is RECORD
    assert scope.profiled


def test_the_rule_modules_run_without_torch():
    # This module and the slot's table, run again in a process where `import torch` fails.
    tests = Path(__file__).resolve().parent
    code = (
        "import sys; sys.modules['torch'] = None; import pytest; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--noconftest', "
        f"{str(tests / 'test_frames.py')!r}, {str(tests / 'test_slot_states.py')!r}, "
        "'-k', 'not without_torch']))"
    )
    env = {**os.environ, "PYTHONPATH": str(tests.parent)}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tests.parent, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout


@pytest.mark.parametrize(
    "enable, scheduled, metrics, spans, stall", list(itertools.product([True, False], repeat=5))
)
def test_a_frames_flags_say_what_its_regions_do_with_one_attribute(enable, scheduled, metrics, spans, stall):
    """quiet: nothing at all; timed_only: timed and nothing else (no schedule, no live status);
    screened: timed or shown live, so a region takes the path that checks both."""
    config = ProfilerConfig(
        enable=enable,
        schedule=ScheduleConfig(steps=(3,)) if scheduled else None,
        metrics=MetricsConfig(port=0) if metrics else None,
        spans=SpansConfig(dir="spans") if spans else None,
        stall=StallConfig(dir="stall") if stall else None,
    )
    frame = Frame(config, None)
    timed = metrics or spans
    live = enable and stall
    nothing_to_profile = not (enable and scheduled)
    assert frame.quiet == (nothing_to_profile and not timed and not live)
    assert frame.timed_only == (nothing_to_profile and timed and not live)
    assert frame.screened == (timed or live)
