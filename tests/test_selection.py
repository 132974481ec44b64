"""Which steps and ranks are profiled (SPEC "Scopes" table and "Steps, regions..."): judged by the
files a run writes, plus the cycle compared against torch.profiler's own schedule."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import steps_written, trace_files

import torchstep_prof as tsp
from torchstep_prof import ScheduleConfig, parse_trace_name
from torchstep_prof.selection import StepAction, step_action


def run_steps(count, role="actor", stage="update"):
    """A training loop of ``count`` steps with one region each; returns what ran."""
    ran = []
    for n in range(1, count + 1):
        with tsp.step(n):
            with tsp.profile_region(role, stage):
                torch.ones(4).add_(1)
                ran.append(n)
    return ran


def test_explicit_steps(save_dir):
    with tsp.schedule(steps=[1, 3]):
        assert run_steps(4) == [1, 2, 3, 4]
    assert steps_written(save_dir) == [1, 3]


def test_cycle_schedule_over_twelve_steps_writes_exactly_steps_4_5_8_9(save_dir):
    with tsp.schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2):
        run_steps(12)
    assert steps_written(save_dir) == [4, 5, 8, 9]


def test_repeat_zero_keeps_cycling_until_the_scope_ends(save_dir):
    with tsp.schedule(wait=1, active=1, repeat=0):
        run_steps(10)
    assert steps_written(save_dir) == [2, 4, 6, 8, 10]


def test_a_warmup_step_writes_no_file(save_dir):
    with tsp.schedule(warmup=1, active=1):
        run_steps(2)
    assert steps_written(save_dir) == [2]
    assert [t.step for t in tsp.records().traces] == [2]


def test_a_loop_that_ends_during_warmup_ran_the_profiler_and_writes_nothing(save_dir):
    with tsp.schedule(wait=1, warmup=2, active=1):
        run_steps(3)  # step 1 waits, 2 and 3 warm up, the loop ends before 4
    assert trace_files(save_dir) == []
    assert tsp.records().traces == ()
    # The profiler did run for the warmup steps: its start and stop are in the costs.
    costs = tsp.records().costs
    assert costs.start_s > 0 and costs.stop_s > 0


def test_the_cycle_counts_from_step_one_and_passes_over_step_zero(save_dir):
    with tsp.schedule(active=1):  # the first cycle's active step is step 1, not step 0
        for n in range(0, 3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
    assert steps_written(save_dir) == [1]


def test_an_explicit_list_selects_step_zero(save_dir):
    with tsp.schedule(steps=[0, 2]):
        for n in range(0, 4):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
    assert steps_written(save_dir) == [0, 2]


@pytest.mark.parametrize("bad", [-1, 1.0, True, "1", None])
def test_a_step_number_is_an_integer_from_zero(bad):
    with pytest.raises(ValueError, match=rf"step number must be an integer >= 0 \(got {bad!r}\)"):
        tsp.step(bad)


def test_no_schedule_profiles_nothing(save_dir):
    run_steps(3)
    with tsp.configure(gzip=True), tsp.contents("shapes"):
        run_steps(3)
    assert trace_files(save_dir) == []
    assert not save_dir.exists()
    assert tsp.records().costs.start_s == 0


def test_enable_false_profiles_nothing(save_dir):
    with tsp.schedule(steps=[1, 2]), tsp.configure(enable=False):
        run_steps(2)
    assert trace_files(save_dir) == []
    assert not save_dir.exists()
    assert tsp.records().costs.start_s == 0  # no profiler was even started


def test_the_step_argument_selects_without_step_blocks(save_dir):
    with tsp.schedule(steps=[3]):
        for n in (2, 3, 4):
            with tsp.profile_region("actor", "update", step=n):
                pass
    assert steps_written(save_dir) == [3]


def test_the_step_argument_wins_over_the_enclosing_step_block(save_dir):
    with tsp.schedule(steps=[7]):
        with tsp.step(1):
            with tsp.profile_region("actor", "update", step=7):
                pass
            with tsp.profile_region("actor", "other"):  # step 1: not selected
                pass
    [path] = trace_files(save_dir)
    assert (parse_trace_name(path).stage, parse_trace_name(path).step) == ("update", 7)


def test_without_steps_a_counter_per_role_and_stage_numbers_the_entries(save_dir):
    # Entries made while no schedule is in force are not counted.
    for _ in range(3):
        with tsp.profile_region("counted", "first"):
            pass
    with tsp.schedule(steps=[2, 3]):
        for _ in range(4):
            with tsp.profile_region("counted", "first"):
                pass
        with tsp.profile_region("counted", "second"):  # its own counter: entry 1
            pass
        with tsp.profile_region("counted", "second"):  # entry 2
            pass
    written = sorted((parse_trace_name(p).stage, parse_trace_name(p).step) for p in trace_files(save_dir))
    assert written == [("first", 2), ("first", 3), ("second", 2)]


def test_the_counter_ignores_entries_in_a_thread_with_no_schedule(save_dir):
    """A thread that entered no scope has no schedule in force: its entries are not counted,
    even while another thread's trace records them as ranges."""
    import threading

    def unscheduled():
        for _ in range(2):
            with tsp.profile_region("counted-thread", "work"):
                pass

    with tsp.schedule(steps=[1]):
        with tsp.profile_region("owner", "work", step=1):
            thread = threading.Thread(target=unscheduled)
            thread.start()
            thread.join()
        with tsp.profile_region("counted-thread", "work"):  # the first counted entry: step 1
            pass
    written = sorted((parse_trace_name(p).role, parse_trace_name(p).step) for p in trace_files(save_dir))
    assert written == [("counted-thread", 1), ("owner", 1)]


def test_default_rank_zero_profiles(save_dir):
    with tsp.schedule(steps=[1]):
        run_steps(1)
    [path] = trace_files(save_dir)
    assert (parse_trace_name(path).rank, parse_trace_name(path).world_size) == (0, 1)


def test_a_rank_that_is_not_chosen_writes_nothing(save_dir):
    with tsp.schedule(steps=[1]), tsp.ranks(1):
        run_steps(2)
    assert trace_files(save_dir) == []


def test_rank_and_world_size_come_from_the_environment(save_dir, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with tsp.schedule(steps=[1]), tsp.ranks(3):
        run_steps(1)
    [path] = trace_files(save_dir)
    assert "_rank3-of-4_" in path.name


def test_a_rank_that_does_not_exist_selects_nothing_and_raises_nothing(save_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with tsp.schedule(steps=[1]), tsp.ranks(7):
        run_steps(1)
    assert trace_files(save_dir) == []


def test_all_ranks_wins_over_ranks(save_dir, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with tsp.schedule(steps=[1]), tsp.ranks(0), tsp.configure(all_ranks=True):
        run_steps(1)
    [path] = trace_files(save_dir)
    assert parse_trace_name(path).rank == 2


_TORCH_ACTIONS = {
    torch.profiler.ProfilerAction.NONE: StepAction.NONE,
    torch.profiler.ProfilerAction.WARMUP: StepAction.WARMUP,
    torch.profiler.ProfilerAction.RECORD: StepAction.RECORD,
    torch.profiler.ProfilerAction.RECORD_AND_SAVE: StepAction.RECORD,
}


@settings(max_examples=200, deadline=None)
@given(
    skip_first=st.integers(0, 3),
    wait=st.integers(0, 3),
    warmup=st.integers(0, 3),
    active=st.integers(1, 3),
    repeat=st.integers(0, 3),
)
def test_the_cycle_is_torch_profilers_own_with_steps_from_one(skip_first, wait, warmup, active, repeat):
    config = ScheduleConfig(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about warmup=0
        theirs = torch.profiler.schedule(
            skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        )
    for n in range(1, 40):
        assert step_action(config, n) is _TORCH_ACTIONS[theirs(n - 1)], n
