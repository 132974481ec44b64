"""Regions in many threads, scopes as decorators, and labels checked before they are profiled."""

from __future__ import annotations

import asyncio
import itertools
import sys
import threading
import time

import pytest
import torch
from trace_helpers import check_trace_file, find_range, load_trace, range_names, trace_files

import torchstep_prof as tsp
from torchstep_prof import parse_trace_name


def test_many_threads_each_under_their_own_schedule_never_crash(tmp_path):
    """Four threads, each with its own scopes and steps: one profiler at a time (the first to
    start owns a trace; the others' regions are ranges in it or unprofiled while it stops), and
    every file written is whole."""
    folder = tmp_path / "profile"
    errors = []

    def worker(index: int) -> None:
        try:
            with tsp.schedule(steps=list(range(1, 25))), tsp.configure(save_path=str(folder), summary=False):
                for n in range(1, 25):
                    with tsp.step(n), tsp.profile_region(f"worker{index}", "step"):
                        with tsp.profile_region(f"worker{index}", "inner"):
                            torch.ones(64).sum()
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    files = trace_files(folder)
    assert files
    for path in files:
        trace = load_trace(path)  # whole JSON
        owner = f"{parse_trace_name(path).role}/step"
        assert owner in range_names(trace)


def test_a_thread_started_inside_a_traced_region_is_a_range_in_the_trace(save_dir):
    def work_in_a_thread() -> None:
        with tsp.profile_region("loader", "prefetch"):  # no scope in this new thread
            torch.ones(8).sum()

    with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("actor", "update"):
        thread = threading.Thread(target=work_in_a_thread)
        thread.start()
        thread.join()
    (path,) = trace_files(save_dir)
    trace = load_trace(path)
    prefetch = find_range(trace, "loader/prefetch")
    update = find_range(trace, "actor/update")
    assert prefetch["tid"] != update["tid"]  # on its own thread's track
    # Both on one clock: the thread's range lies within the owner's range.
    assert update["ts"] <= prefetch["ts"] <= prefetch["ts"] + prefetch["dur"] <= update["ts"] + update["dur"] + 1


def test_scopes_decorate_coroutine_functions(save_dir):
    @tsp.schedule(steps=[1])
    async def train() -> tsp.ProfilerConfig:
        with tsp.step(1), tsp.profile_region("rollout", "generate"):
            await asyncio.sleep(0)
        return tsp.effective_config()

    config = asyncio.run(train())
    assert config.schedule == tsp.ScheduleConfig(steps=(1,))
    assert [parse_trace_name(p).role for p in trace_files(save_dir)] == ["rollout"]
    assert tsp.effective_config().schedule is None  # back outside


def test_a_scope_object_can_be_entered_again_and_nested():
    scope = tsp.schedule(steps=[2])
    with scope:
        with scope:
            assert tsp.effective_config().schedule.steps == (2,)
        assert tsp.effective_config().schedule.steps == (2,)
    assert tsp.effective_config().schedule is None


def test_bad_scope_values_fail_at_the_call():
    with pytest.raises(tsp.ConfigError, match=r"contents: 'gpu' is not one of"):
        tsp.contents("gpu")
    with pytest.raises(tsp.ConfigError, match=r"ranks\[0\]: must be >= 0 \(got -1\)"):
        tsp.ranks(-1)


def test_profiled_works_above_classmethod_and_staticmethod(save_dir):
    class Critic:
        @tsp.profiled(role="critic")
        @classmethod
        def build(cls) -> str:
            return cls.__name__

        @tsp.profiled(role="critic")
        @staticmethod
        def score(x: int) -> int:
            return x + 1

    with tsp.schedule(steps=[1]), tsp.step(1):
        assert Critic.build() == "Critic"
        assert Critic.score(1) == 2
    assert sorted(parse_trace_name(p).stage for p in trace_files(save_dir)) == ["build", "score"]


def test_a_label_with_nothing_left_never_fails_a_region_on_any_step(save_dir):
    with tsp.schedule(steps=[2]):
        for n in (1, 2):  # a step not profiled, then one profiled: the same label, no error
            with tsp.step(n), tsp.profile_region("__", "update"):
                pass
    with tsp.profile_region("__", "update"):  # no schedule: regions stay free
        pass
    assert [parse_trace_name(p).role for p in trace_files(save_dir)] == ["U+5F+5F"]


def test_one_scope_object_entered_in_two_threads_exits_each_its_own(tmp_path):
    shared = tsp.schedule(steps=[1])
    barrier = threading.Barrier(2)
    seen, errors = [], []

    def worker() -> None:
        try:
            with shared:
                barrier.wait()  # both inside at once
                seen.append(tsp.effective_config().schedule.steps)
                barrier.wait()
            seen.append(tsp.effective_config().schedule)
        except BaseException as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(map(str, seen)) == sorted(["(1,)", "(1,)", "None", "None"])


def test_one_scope_object_in_two_asyncio_tasks():
    shared = tsp.configure(gzip=True)

    async def task(delay: float) -> tuple:
        with shared:
            inside = tsp.effective_config().gzip
            await asyncio.sleep(delay)
        return inside, tsp.effective_config().gzip

    async def main() -> list:
        return await asyncio.gather(task(0.02), task(0.0))

    assert asyncio.run(main()) == [(True, False), (True, False)]


def test_scopes_refuse_to_decorate_generator_functions():
    with pytest.raises(TypeError, match="scope cannot wrap the generator"):

        @tsp.schedule(steps=[1])
        def batches():
            yield 1


def test_a_thread_region_still_open_when_the_trace_stops_is_cut_off_there(save_dir):
    started, release = threading.Event(), threading.Event()

    def slow_worker() -> None:
        with tsp.profile_region("loader", "slow"):
            started.set()
            release.wait(10)

    thread = threading.Thread(target=slow_worker)
    with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("actor", "update"):
        thread.start()
        started.wait(10)
    release.set()
    thread.join()
    (path,) = trace_files(save_dir)
    trace = load_trace(path)
    slow, update = find_range(trace, "loader/slow"), find_range(trace, "actor/update")
    assert slow["ts"] + slow["dur"] <= update["ts"] + update["dur"] + 1000  # ends at the stop


def test_a_selected_step_waits_for_another_threads_warm_up_instead_of_being_lost(tmp_path, monkeypatch):
    from torchstep_prof.engine import ENGINE

    monkeypatch.setattr(ENGINE.slot, "warmed", False)
    folder = tmp_path / "profile"
    warming = threading.Event()
    real = ENGINE.slot._warm_up_now

    def slow_warm_up(contents):
        warming.set()

        time.sleep(0.5)
        real(contents)

    monkeypatch.setattr(ENGINE.slot, "_warm_up_now", slow_warm_up)

    def enter_a_scope() -> None:
        with tsp.schedule(steps=[1]):  # pays the warm-up in this thread
            pass

    other = threading.Thread(target=enter_a_scope)
    other.start()
    warming.wait(10)
    with tsp.configure(save_path=str(folder), summary=False), tsp.schedule(steps=[1]):
        with tsp.step(1), tsp.profile_region("actor", "selected"):
            pass
    other.join()
    assert [parse_trace_name(p).stage for p in trace_files(folder)] == ["selected"]


def test_fused_trace_names_hold_exactly_the_roles_of_the_trace_while_threads_hammer_regions(tmp_path):
    """Threads enter regions of their own roles without pause while fused steps start and stop:
    each file's name carries exactly the roles of its metadata, each with an event in the trace
    (the roles freeze when the trace stops; a role that arrives later is in neither)."""
    folder = tmp_path / "profile"
    stop = threading.Event()

    def hammer(index: int) -> None:
        # Roles that keep joining: each thread cycles through ten (joined names end "+N-more").
        for k in itertools.count():
            if stop.is_set():
                return
            with tsp.profile_region(f"t{index}r{k % 10}", "poll"):
                pass

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: also inside the stop of a trace
    for thread in threads:
        thread.start()
    try:
        with tsp.schedule(steps=list(range(1, 61))), tsp.configure(save_path=str(folder), summary=False, discrete=False):
            for n in range(1, 61):
                with tsp.step(n), tsp.profile_region("main", "work"):
                    torch.ones(4).sum()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(switch_interval)
    files = trace_files(folder)
    assert len(files) == 60
    for path in files:
        trace = check_trace_file(path)  # the name's fields equal the metadata's, role included
        roles = parse_trace_name(path).role.split("+")[0].split("-")
        held = {name.split("/")[0] for name in range_names(trace)}
        assert set(roles) <= held, (path.name, sorted(held))
