"""Which steps and ranks are profiled (docs/scopes-and-regions.md): judged by the
files a run writes, plus the cycle compared against torch.profiler's own schedule."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_helpers import steps_written, trace_files

import torchstep_prof as tsp
from torchstep_prof import ScheduleConfig, parse_trace_name
from torchstep_prof.selection.rules import StepAction, step_action


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


# --- selected steps that never ran (per schedule scope), huge schedules ---------------------


def test_missed_steps_are_kept_per_schedule_scope(save_dir):
    with tsp.schedule(steps=[2]):  # phase A runs its step 2
        run_steps(3)
    assert tsp.records().missed_steps == ()
    with tsp.schedule(steps=[2]):  # phase B stops after step 1: its step 2 never ran
        run_steps(1)
    assert tsp.records().missed_steps == ((2, 2),)


def test_an_unrelated_scope_inside_a_schedule_reports_nothing_early(save_dir):
    with tsp.schedule(steps=[2, 3]):
        with tsp.contents("cpu"):  # exits before step 2 ran: the schedule is not over
            pass
        with tsp.configure(gzip=False), tsp.schedule(steps=[2, 3]):  # the same schedule again
            pass
        run_steps(3)
    assert tsp.records().missed_steps == ()


def test_missed_steps_come_as_ranges(save_dir):
    with tsp.schedule(steps=[0, 1, 2, 3, 5, 8, 9]):
        with tsp.step(2), tsp.profile_region("actor", "update"):
            pass
    assert tsp.records().missed_steps == ((0, 1), (3, 3), (5, 5), (8, 9))


HUGE_SCHEDULES = [
    dict(active=30_000_000),
    dict(wait=1, active=1, repeat=30_000_000),
    dict(skip_first=10_000_000, warmup=5, active=10_000_000, repeat=3),
    dict(wait=2, active=3, repeat=0),
    dict(steps=list(range(0, 2_000_000, 2))),
]


@pytest.mark.parametrize("fields", HUGE_SCHEDULES, ids=lambda f: ",".join(f"{k}={str(v)[:12]}" for k, v in f.items()))
def test_a_huge_schedule_costs_no_more_memory_than_a_small_one(tmp_path, fields):
    """Any schedule that validates stays under 10 MB at any point, scope exit included (the
    allocation peak is counted by tracemalloc; time follows from it: nothing is enumerated)."""
    import tracemalloc

    schedule = tsp.schedule(**fields)  # made outside the measurement: the list is the user's
    tracemalloc.start()
    try:
        with tsp.configure(save_path=str(tmp_path), summary=False), schedule:
            for n in range(1, 4):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    data = tsp.records()
    assert len(data.missed_steps) <= 20


def test_a_million_missed_steps_print_as_one_line(tmp_path):
    import io

    from rich.console import Console

    with tsp.configure(save_path=str(tmp_path), summary=False), tsp.schedule(active=1_000_000):
        run_steps(3)
    data = tsp.records()
    assert (data.missed_steps, data.missed_steps_unlisted) == (((4, 1_000_000),), 0)
    buffer = io.StringIO()
    tsp.print_summary(data, Console(file=buffer, width=120))
    [line] = [line for line in buffer.getvalue().splitlines() if "never ran" in line]
    assert "steps 4-1000000 never ran" in line


def test_a_cycle_missing_millions_of_ranges_lists_twenty_and_counts_the_rest(tmp_path):
    import io

    from rich.console import Console

    with tsp.configure(save_path=str(tmp_path), summary=False), tsp.schedule(wait=1, active=1, repeat=1_000_000):
        run_steps(4)  # steps 2 and 4 ran; 6, 8, ... 2000000 never did
    data = tsp.records()
    assert data.missed_steps == tuple((n, n) for n in range(6, 46, 2))
    assert data.missed_steps_unlisted == 1_000_000 - 2 - 20
    buffer = io.StringIO()
    tsp.print_summary(data, Console(file=buffer, width=400))
    [line] = [line for line in buffer.getvalue().splitlines() if "never ran" in line]
    assert "steps 6, 8, 10" in line and "44 and 999978 more never ran" in line


ENV_SCHEDULE_JOB = """
    import torch
    import torchstep_prof as tsp
    with tsp.contents("cpu"):      # an unrelated scope, exited before step 2 runs
        pass
    for n in range(1, {last} + 1):
        with tsp.step(n), tsp.profile_region("actor", "update"):
            torch.ones(2).sum()
    print("job done")
"""


def test_the_environments_schedule_reports_missed_steps_at_exit_and_only_then(tmp_path):
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    env.update(
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        COLUMNS="200",
        TORCHSTEP_PROF_OVERRIDES="schedule.steps=[2,5] save_path=profile",
    )
    shown = {}
    for last in (3, 1):
        script = tmp_path / f"job{last}.py"
        script.write_text(textwrap.dedent(ENV_SCHEDULE_JOB.format(last=last)))
        result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0 and "job done" in result.stdout, result.stderr
        shown[last] = result.stdout
    # Step 2 ran (its trace is in the table): only step 5 never did.
    assert "actor" in shown[3] and "step 5 never ran" in shown[3] and "2, 5" not in shown[3]
    # No step ran: no trace, so no summary at all (docs/exit-summary.md: a process that wrote nothing prints none).
    assert "never ran" not in shown[1]


@settings(max_examples=300, deadline=None)
@given(
    skip_first=st.integers(0, 3),
    wait=st.integers(0, 3),
    warmup=st.integers(0, 3),
    active=st.integers(1, 4),
    repeat=st.integers(0, 3),
    first=st.integers(0, 30),
    span=st.integers(0, 40),
    seen=st.sets(st.integers(0, 45), max_size=12),
)
def test_ranges_counts_and_missed_steps_agree_with_step_by_step_selection(
    skip_first, wait, warmup, active, repeat, first, span, seen
):
    from torchstep_prof.selection.missed_steps import ScheduleScope
    from torchstep_prof.selection.rules import count_selected, last_selected_step, selected_ranges

    config = ScheduleConfig(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)
    last = first + span
    recorded = [n for n in range(first, last + 1) if step_action(config, n) is StepAction.RECORD]
    assert [n for a, b in selected_ranges(config, first, last) for n in range(a, b + 1)] == recorded
    assert count_selected(config, first, last) == len(recorded)

    scope = ScheduleScope(config)
    for n in seen:
        scope.saw(n)
    missed = scope.missed()
    end = last_selected_step(config)
    if end is None:
        assert not missed
        return
    expected = [n for n in range(0, end + 1) if step_action(config, n) is StepAction.RECORD and n not in seen]
    listed = [n for a, b in missed.ranges for n in range(a, b + 1)]
    assert listed == expected[: len(listed)] and len(listed) + missed.unlisted == len(expected)
    assert len(missed.ranges) <= 20


# profile_region returns on a "no" Frame.action cached, asking it otherwise: a region's answer
# must be the rule's, for explicit lists and cycles, selected ranks and not, steps numbered by
# step= and by the counter, and after torch.distributed's group changes the rank.
_schedules = st.one_of(
    st.builds(lambda steps: {"steps": steps}, st.lists(st.integers(0, 30), min_size=1, max_size=6, unique=True)),
    st.fixed_dictionaries(
        {
            "skip_first": st.integers(0, 3),
            "wait": st.integers(0, 3),
            "warmup": st.integers(0, 2),
            "active": st.integers(1, 3),
            "repeat": st.integers(0, 3),
        }
    ),
)


_fresh_roles = itertools.count()


@settings(max_examples=150, deadline=None)
@given(schedule=_schedules, ranks=st.sets(st.integers(0, 2), min_size=1), counted=st.booleans())
def test_a_regions_decision_is_the_frames_for_every_step_and_rank(schedule, ranks, counted):
    from torchstep_prof.selection.frames import current_frame
    from torchstep_prof.regions import _IDLE_REGION
    from torchstep_prof.selection.rules import NONE

    role = f"agree{next(_fresh_roles)}"  # a fresh counter: its n-th entry is step n
    with tsp.configure(summary=False), tsp.schedule(**schedule), tsp.ranks(*sorted(ranks)):
        frame = current_frame()
        for n in range(1, 40):
            region = tsp.profile_region(role, "counted") if counted else tsp.profile_region(role, "given", step=n)
            assert (region is not _IDLE_REGION) == (frame.action(n) is not NONE), (schedule, ranks, n)


def test_a_rank_decision_is_made_again_when_the_process_group_changes(save_dir, monkeypatch, tmp_path):
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    from torchstep_prof.selection.frames import reset_root

    reset_root()
    with tsp.schedule(steps=[1, 2]), tsp.ranks(0):
        with tsp.profile_region("actor", "before_init", step=1):  # rank 1 of 2: not selected
            pass
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        try:
            with tsp.profile_region("actor", "after_init", step=2):  # now rank 0 of 1: selected
                torch.ones(2).add_(1)
        finally:
            dist.destroy_process_group()
    names = [parse_trace_name(p) for p in trace_files(save_dir)]
    assert [(n.stage, n.step, n.rank, n.world_size) for n in names] == [("after-init", 2, 0, 1)]
