"""Steps, regions and who owns a trace (docs/scopes-and-regions.md), judged by
the files written and the ranges inside them."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading

import pytest
import torch
from trace_helpers import (
    by_step,
    contains,
    find_range,
    load_trace,
    profiler_steps,
    range_names,
    span_us,
    trace_files,
)

import torchstep_prof as tsp
from torchstep_prof import parse_trace_name


def work():
    torch.ones(4, 4).mul_(2).sum()


def only_file(folder):
    files = trace_files(folder)
    assert len(files) == 1, [f.name for f in files]
    return files[0], load_trace(files[0])


# --- discrete mode ---------------------------------------------------------------------------


def test_discrete_two_regions_in_a_step_give_two_files_each_with_its_own_range(save_dir):
    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("rollout", "generate"):
            work()
        with tsp.profile_region("actor", "compute_log_prob"):
            work()
    files = {parse_trace_name(p).role: load_trace(p) for p in trace_files(save_dir)}
    assert sorted(files) == ["actor", "rollout"]
    assert "rollout/generate" in range_names(files["rollout"])
    assert "actor/compute_log_prob" not in range_names(files["rollout"])
    assert "actor/compute_log_prob" in range_names(files["actor"])  # the raw label is kept
    assert "rollout/generate" not in range_names(files["actor"])
    for trace in files.values():
        assert trace["torchstep_prof"]["discrete"] is True


def test_a_nested_region_is_a_range_inside_its_owners_file(save_dir):
    with tsp.schedule(steps=[2]), tsp.step(2):
        with tsp.profile_region("actor", "update"):
            with tsp.profile_region("actor", "forward"):
                with tsp.profile_region("ref", "deep"):
                    work()
    path, trace = only_file(save_dir)
    assert (parse_trace_name(path).role, parse_trace_name(path).stage) == ("actor", "update")
    owner = span_us(trace, find_range(trace, "actor/update"))
    forward = span_us(trace, find_range(trace, "actor/forward"))
    deep = span_us(trace, find_range(trace, "ref/deep"))
    assert contains(owner, forward) and contains(forward, deep)


def test_each_trace_holds_exactly_one_profiler_step_spanning_its_owner(save_dir):
    with tsp.schedule(steps=[3, 4]):
        for n in (3, 4):
            with tsp.step(n), tsp.profile_region("critic", "update"):
                with tsp.profile_region("critic", "backward"):
                    work()
    for path in trace_files(save_dir):
        trace = load_trace(path)
        [row] = profiler_steps(trace)
        assert row["name"] == f"ProfilerStep#{parse_trace_name(path).step}"
        assert contains(span_us(trace, row), span_us(trace, find_range(trace, "critic/update")))
    assert sorted(by_step(trace_files(save_dir))) == [3, 4]


def test_a_region_in_an_unselected_step_inside_nothing_writes_nothing(save_dir):
    with tsp.schedule(steps=[2]), tsp.step(1):
        with tsp.profile_region("actor", "update"):
            work()
    assert trace_files(save_dir) == []


def test_the_config_in_force_when_a_region_is_entered_decides(save_dir, tmp_path):
    other = tmp_path / "other"
    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.configure(save_path=str(other)):
            with tsp.profile_region("actor", "update"):
                work()
        with tsp.profile_region("actor", "second"):
            work()
    assert [parse_trace_name(p).stage for p in trace_files(other)] == ["update"]
    assert [parse_trace_name(p).stage for p in trace_files(save_dir)] == ["second"]


# --- fused mode ------------------------------------------------------------------------------


def test_fused_one_file_per_step_named_for_the_roles_in_order_of_first_entry(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1, 2]):
        for n in (1, 2, 3):
            with tsp.step(n):
                with tsp.profile_region("actor", "generate_sequences"):
                    work()
                with tsp.profile_region("rollout", "generate"):
                    work()
                with tsp.profile_region("ref", "compute_log_prob"):
                    work()
                with tsp.profile_region("actor", "update"):  # actor again: named once
                    work()
    files = trace_files(save_dir)
    assert [parse_trace_name(p).step for p in files] == [1, 2]
    for path in files:
        step = parse_trace_name(path).step
        assert path.name.startswith(f"actor-rollout-ref_train_step{step}_")
        trace = load_trace(path)
        assert trace["torchstep_prof"]["discrete"] is False
        assert trace["torchstep_prof"]["role"] == "actor-rollout-ref"
        [row] = profiler_steps(trace)
        assert row["name"] == f"ProfilerStep#{step}"
        for region in ("actor/generate_sequences", "rollout/generate", "ref/compute_log_prob", "actor/update"):
            assert contains(span_us(trace, row), span_us(trace, find_range(trace, region))), region


def test_fused_process_role_overrides_the_roles(save_dir):
    with tsp.configure(discrete=False, process_role="trainer_0"), tsp.schedule(steps=[1]):
        with tsp.step(1):
            with tsp.profile_region("actor", "update"):
                work()
            with tsp.profile_region("critic", "update"):
                work()
    path, trace = only_file(save_dir)
    assert path.name.startswith("trainer-0_train_step1_")
    assert {"actor/update", "critic/update"} <= set(range_names(trace))


def test_fused_a_step_with_no_region_is_role_main(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[5]):
        for n in range(1, 6):
            with tsp.step(n):
                work()
    path, _ = only_file(save_dir)
    assert path.name.startswith("main_train_step5_")


def test_fused_a_region_outside_any_step_block_owns_its_own_trace(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]):
        with tsp.profile_region("eval", "score", step=1):
            work()
    path, trace = only_file(save_dir)
    assert path.name.startswith("eval_score_step1_")
    assert trace["torchstep_prof"]["discrete"] is True


def test_fused_a_nested_region_stays_a_range(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("actor", "update"):
            with tsp.profile_region("actor", "backward"):
                work()
    path, trace = only_file(save_dir)
    assert path.name.startswith("actor_train_step1_")
    assert contains(span_us(trace, find_range(trace, "actor/update")), span_us(trace, find_range(trace, "actor/backward")))


def test_fused_a_role_that_sanitizes_to_nothing_is_named_by_its_code_points(save_dir):
    """No error: the role's encoded form joins the fused trace's name, its range keeps the label."""
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("actor", "update"):
            work()
        with tsp.profile_region("///", "update"):
            work()
    path, trace = only_file(save_dir)
    assert path.name.startswith("actor-U+2F+2F+2F_train_step1_")
    assert find_range(trace, "///" + "/update")


# --- labels ----------------------------------------------------------------------------------


def test_a_label_with_nothing_left_gets_its_encoded_file_name(save_dir):
    ran = []
    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("actor", "___"):
            ran.append(1)
        with tsp.profile_region("actor", "fine"):
            ran.append(2)
    assert ran == [1, 2]
    assert sorted(parse_trace_name(p).stage for p in trace_files(save_dir)) == ["U+5F+5F+5F", "fine"]


# --- @profiled -------------------------------------------------------------------------------


@tsp.profiled(role="critic")
def update_critic(batch, *, scale=1):
    """Update the critic."""
    work()
    return len(batch) * scale


class Critic:
    def __init__(self):
        self.calls = 0

    @tsp.profiled(role="critic", stage="value_update")
    def update(self, batch):
        self.calls += 1
        work()
        return sum(batch)


def test_profiled_function_is_a_region_named_by_its_function(save_dir):
    assert update_critic.__name__ == "update_critic" and update_critic.__doc__ == "Update the critic."
    with tsp.schedule(steps=[1]), tsp.step(1):
        assert update_critic([1, 2], scale=3) == 6
    path, trace = only_file(save_dir)
    assert path.name.startswith("critic_update-critic_step1_")
    assert "critic/update_critic" in range_names(trace)


def test_profiled_method(save_dir):
    critic = Critic()
    with tsp.schedule(steps=[2]):
        for n in (1, 2):
            with tsp.step(n):
                assert critic.update([1, 2, 3]) == 6
    assert critic.calls == 2
    path, trace = only_file(save_dir)
    assert path.name.startswith("critic_value-update_step2_")
    assert "critic/value_update" in range_names(trace)


def test_profiled_coroutine_function_spans_the_awaited_body(save_dir):
    @tsp.profiled(role="rollout")
    async def generate(n):
        await asyncio.sleep(0)
        with tsp.profile_region("rollout", "after_await"):
            work()
        await asyncio.sleep(0)
        return n * 2

    assert inspect.iscoroutinefunction(generate)
    with tsp.schedule(steps=[1]), tsp.step(1):
        coroutine = generate(21)
        assert trace_files(save_dir) == []  # nothing ran yet: the call only made the coroutine
        assert asyncio.run(coroutine) == 42
    path, trace = only_file(save_dir)
    assert path.name.startswith("rollout_generate_step1_")
    assert contains(span_us(trace, find_range(trace, "rollout/generate")), span_us(trace, find_range(trace, "rollout/after_await")))


def test_profiled_refuses_a_generator_function():
    with pytest.raises(TypeError, match="generator"):

        @tsp.profiled(role="data")
        def batches():
            yield 1


def test_profiled_names_a_label_with_nothing_left_by_its_code_points(save_dir):
    @tsp.profiled(role="__", stage="...")
    def update() -> int:
        return 1

    with tsp.schedule(steps=[1]), tsp.step(1):
        assert update() == 1
    assert [p.name.split("_step")[0] for p in trace_files(save_dir)] == ["U+5F+5F_U+2E+2E+2E"]


def test_profiled_propagates_exceptions(save_dir):
    @tsp.profiled(role="actor")
    def fails():
        raise KeyError("missing")

    with tsp.schedule(steps=[1]), tsp.step(1):
        with pytest.raises(KeyError, match="missing"):
            fails()
    assert [parse_trace_name(p).stage for p in trace_files(save_dir)] == ["fails"]


# --- other threads and asyncio tasks -----------------------------------------------------------


def _in_thread(target, *, copy_context):
    errors = []

    def run():
        try:
            target()
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    if copy_context:  # the thread runs in a copy of this one's context: the same scopes
        thread = threading.Thread(target=contextvars.copy_context().run, args=(run,))
    else:  # a plain thread: it starts outside every scope
        thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("copy_context", [True, False], ids=["thread-with-scopes", "thread-without-scopes"])
def test_a_region_in_another_thread_while_a_trace_records_is_a_range_in_it(save_dir, copy_context):
    """The owner is the block that started the profiler first (here the main thread's region);
    the other thread's region, entered while it records, is a range in the owner's file and
    never a trace of its own -- whether or not that thread entered any scope itself."""
    entered, done = threading.Event(), threading.Event()

    def other():
        assert entered.wait(10)
        with tsp.profile_region("worker", "prefetch", step=1):
            work()
        done.set()

    with tsp.schedule(steps=[1]):
        thread, errors = _in_thread(other, copy_context=copy_context)
        with tsp.profile_region("main", "owner", step=1):
            entered.set()
            assert done.wait(10)
        thread.join()
    assert errors == []
    path, trace = only_file(save_dir)
    assert path.name.startswith("main_owner_step1_")
    assert "worker/prefetch" in range_names(trace)


def test_regions_in_asyncio_tasks_while_a_trace_records_are_ranges_in_it(save_dir):
    async def fetch(i):
        with tsp.profile_region("env", f"fetch{i}"):
            await asyncio.sleep(0)
            work()

    async def gather():
        await asyncio.gather(*(fetch(i) for i in range(3)))

    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("rollout", "generate"):
            asyncio.run(gather())
    path, trace = only_file(save_dir)
    assert path.name.startswith("rollout_generate_step1_")
    assert {"env/fetch0", "env/fetch1", "env/fetch2"} <= set(range_names(trace))


def test_asyncio_tasks_each_own_a_trace_when_nothing_records(save_dir):
    async def task(i):
        await asyncio.sleep(0)
        with tsp.profile_region("env", f"task{i}", step=1):
            work()

    async def main():
        for i in range(2):  # one after the other: each is the outermost region when it runs
            await asyncio.create_task(task(i))

    with tsp.schedule(steps=[1]):
        asyncio.run(main())
    assert sorted(parse_trace_name(p).stage for p in trace_files(save_dir)) == ["task0", "task1"]


def test_a_not_profiled_region_composes_with_exitstack_and_as():
    # Framework callbacks enter regions through ExitStack, which calls __enter__ with the region.
    import contextlib

    region = tsp.profile_region("actor", "update")
    with contextlib.ExitStack() as stack:
        assert stack.enter_context(region) is region
    with region as entered:
        assert entered is region
    with pytest.raises(KeyError):
        with contextlib.ExitStack() as stack:
            stack.enter_context(tsp.profile_region("actor", "update"))
            raise KeyError("propagates")
