"""Faults (docs/reliability.md): what the user sees when their code, torch, the disk, forked
workers or other threads misbehave. Every test also leaves no profiler running (conftest)."""

from __future__ import annotations

import os
import shutil
import threading
import warnings

import pytest
import torch
from trace_helpers import (
    everything_under,
    find_range,
    load_trace,
    owner_range_name,
    profiler_steps,
    range_names,
    span_us,
    trace_files,
)

import torchstep_prof as tsp
from torchstep_prof import (
    ForeignProfilerWarning,
    ProfilerStartWarning,
    TorchstepProfWarning,
    TraceWriteWarning,
    parse_trace_name,
)
from torchstep_prof.engine import ENGINE


def work():
    torch.ones(8, 8).mul_(3).sum()


def region(role="actor", stage="update", step=1):
    with tsp.profile_region(role, stage, step=step):
        work()


@pytest.fixture
def caught_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def of_category(caught, category):
    return [w for w in caught if issubclass(w.category, category)]


# --- exceptions in the user's code -------------------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["discrete", "fused"])
@pytest.mark.parametrize("error", [ValueError("bad batch"), KeyboardInterrupt()], ids=["ValueError", "KeyboardInterrupt"])
def test_an_exception_in_a_region_propagates_unchanged_and_the_trace_is_written(save_dir, error, fused):
    with tsp.configure(discrete=not fused), tsp.schedule(steps=[1, 2]):
        with pytest.raises(type(error)) as raised:
            with tsp.step(1), tsp.profile_region("actor", "update"):
                with tsp.profile_region("actor", "inner"):
                    work()
                    raise error
        assert raised.value is error
        assert error.__context__ is None and error.__cause__ is None
        # the next region works
        with tsp.step(2), tsp.profile_region("actor", "update"):
            work()
    files = trace_files(save_dir)
    assert [parse_trace_name(p).step for p in files] == [1, 2]
    first = load_trace(files[0])
    assert {"actor/update", "actor/inner"} <= set(range_names(first))
    assert all(r.ok for r in tsp.records().traces)


def test_an_exception_in_a_profiled_function_propagates_unchanged(save_dir):
    error = RuntimeError("from the model")

    @tsp.profiled(role="critic")
    def update():
        raise error

    with tsp.schedule(steps=[1]), tsp.step(1):
        with pytest.raises(RuntimeError) as raised:
            update()
    assert raised.value is error
    assert [parse_trace_name(p).stage for p in trace_files(save_dir)] == ["update"]


# --- the profiler fails to start ---------------------------------------------------------------


def test_a_profiler_that_fails_to_start_runs_the_body_once_unprofiled(save_dir, monkeypatch, caught_warnings):
    calls = []

    def broken_start(self):
        raise RuntimeError("Kineto is unhappy")

    with tsp.schedule(steps=[1, 2]):
        with monkeypatch.context() as patch:
            patch.setattr(torch.profiler.profile, "start", broken_start)
            with tsp.step(1), tsp.profile_region("actor", "update"):
                calls.append("body")
                result = torch.ones(2).sum().item()
        assert calls == ["body"] and result == 2.0
        assert len(of_category(caught_warnings, ProfilerStartWarning)) == 1
        assert "Kineto is unhappy" in str(of_category(caught_warnings, ProfilerStartWarning)[0].message)
        assert trace_files(save_dir) == []
        [failed] = tsp.records().traces
        assert failed.path is None and not failed.ok and "Kineto is unhappy" in failed.error
        assert (failed.role, failed.stage, failed.step) == ("actor", "update", 1)
        # once torch recovers, the next region is profiled again
        with tsp.step(2), tsp.profile_region("actor", "update"):
            calls.append("body")
    assert calls == ["body", "body"]
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [2]


# --- writing fails -----------------------------------------------------------------------------


def test_an_unwritable_save_path_is_reported_once_recorded_and_training_continues(tmp_path, caught_warnings):
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file, so nothing can be created below it (even as root)")
    save_path = blocker / "profile"
    done = []
    with tsp.configure(save_path=str(save_path), summary=False), tsp.schedule(steps=[1, 2, 3]):
        for n in (1, 2, 3):
            with tsp.step(n):
                region("actor", "update", step=None)
                region("ref", "compute_log_prob", step=None)
                done.append(n)
    assert done == [1, 2, 3]
    assert len(of_category(caught_warnings, TraceWriteWarning)) == 1
    failed = tsp.records().traces
    assert len(failed) == 6
    assert all(r.path is None and r.error and not r.ok for r in failed)
    assert str(save_path) in failed[0].error or "blocker" in failed[0].error
    assert [p.name for p in everything_under(tmp_path)] == ["blocker"]  # nothing anywhere


def test_a_failed_export_leaves_no_partial_file(save_dir, monkeypatch, caught_warnings):
    """torch writes half a file and says nothing (as it does on a full disk): the half file is
    removed, the failure reported once and recorded, and training goes on."""

    def half_export(self, path):
        with open(path, "w") as handle:
            handle.write('{"traceEvents": [{"name": "aten::mm", ')

    with tsp.schedule(steps=[1, 2]):
        with monkeypatch.context() as patch:
            patch.setattr(torch.profiler.profile, "export_chrome_trace", half_export)
            for n in (1, 2):
                region("actor", "update", step=n)
            tsp.flush()  # the writer thread exports while the patch is in force
        assert len(of_category(caught_warnings, TraceWriteWarning)) == 1
        assert [r.ok for r in tsp.records().traces] == [False, False]
        assert everything_under(save_dir) == []  # no partial file, no scratch folder
        region("actor", "update", step=2)  # the disk has room again
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [2]
    assert everything_under(save_dir) == trace_files(save_dir)


# --- forked children ---------------------------------------------------------------------------


class _Squares(torch.utils.data.Dataset):
    """Each item is fetched inside a region of its own, in the worker process."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        with tsp.profile_region("loader", "getitem", step=1):
            return torch.tensor([float(index) ** 2])


def test_a_dataloader_with_forked_workers_inside_a_profiled_region(save_dir):
    loader = torch.utils.data.DataLoader(
        _Squares(), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    with tsp.schedule(steps=[1]), tsp.step(1):
        with tsp.profile_region("actor", "update"):
            total = sum(float(batch.sum()) for batch in loader)
    assert total == sum(float(i) ** 2 for i in range(8))
    files = trace_files(save_dir)
    assert [parse_trace_name(p).role for p in files] == ["actor"]  # the workers wrote nothing
    assert {parse_trace_name(p).pid for p in files} == {os.getpid()}
    assert "actor/update" in range_names(load_trace(files[0]))


# --- threads -----------------------------------------------------------------------------------


def test_two_threads_entering_regions_at_once_many_times(save_dir):
    """Exactly one profiler runs at a time. The trace belongs to the thread whose region started
    the profiler first; the other thread's region, entered while that trace records, is a range
    in it (it may also find the profiler stopped again and own the next trace itself). Either
    way nothing crashes, every file is whole, and the traces' windows never overlap."""
    rounds = 15
    barrier = threading.Barrier(2, timeout=30)
    errors = []

    def worker(i):
        try:
            with tsp.configure(save_path=str(save_dir), summary=False), tsp.schedule(steps=[1]):
                for k in range(rounds):
                    barrier.wait()
                    with tsp.profile_region(f"thread{i}", f"round{k}", step=1):
                        work()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    files = trace_files(save_dir)
    assert rounds <= len(files) <= 2 * rounds
    windows = []
    for path in files:
        trace = load_trace(path)  # every file is valid JSON (the fixture checks the rest)
        owner = owner_range_name(path, trace)
        assert owner is not None and owner.startswith("thread")
        windows.append(span_us(trace, profiler_steps(trace)[0]))
    windows.sort()
    for (_, end), (start, _) in zip(windows, windows[1:]):
        assert end <= start, "two profilers recorded at the same time"
    assert all(r.ok for r in tsp.records().traces)


def test_the_first_thread_to_start_owns_the_trace_the_other_is_a_range_in_it(save_dir):
    """Thread A's region starts the profiler; thread B then enters a region of its own (which the
    schedule also selects) while A's trace records: B's region is a range in A's file, and
    never a second profiler or file."""
    a_started, b_done = threading.Event(), threading.Event()
    errors = []

    def thread_b():
        try:
            assert a_started.wait(10)
            with tsp.configure(save_path=str(save_dir), summary=False), tsp.schedule(steps=[1]):
                region("thread-b", "work")
        except BaseException as exc:
            errors.append(exc)
        finally:
            b_done.set()

    b = threading.Thread(target=thread_b)
    b.start()
    with tsp.schedule(steps=[1]):
        with tsp.profile_region("thread-a", "work", step=1):
            a_started.set()
            assert b_done.wait(10)
    b.join()
    assert errors == []
    [path] = trace_files(save_dir)
    assert path.name.startswith("thread-a_work_step1_")
    trace = load_trace(path)
    owner, other = find_range(trace, "thread-a/work"), find_range(trace, "thread-b/work")
    assert owner["tid"] != other["tid"]
    assert span_us(trace, owner)[0] <= span_us(trace, other)[0] <= span_us(trace, other)[1] <= span_us(trace, owner)[1]


def test_a_region_joining_a_trace_whose_profiler_is_still_starting_does_not_crash(save_dir, monkeypatch):
    """Thread B enters a region in the instant after thread A's region has claimed the trace but
    before torch's profiler has started, and leaves it once the profiler runs: B must not crash
    (B's range may be missing from A's trace: it began before recording did)."""
    a_starting, b_entered, a_started, b_done = (threading.Event() for _ in range(4))
    errors = []
    real_start = torch.profiler.profile.start

    def slow_start(self):
        a_starting.set()
        b_entered.wait(10)  # B is inside its region now
        real_start(self)
        a_started.set()

    def thread_b():
        try:
            assert a_starting.wait(10)
            with tsp.configure(save_path=str(save_dir), summary=False), tsp.schedule(steps=[1]):
                with tsp.profile_region("thread-b", "work", step=1):
                    b_entered.set()
                    assert a_started.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            b_entered.set()
            b_done.set()

    with tsp.schedule(steps=[1]):  # entering it pays the profiler's one-time warm-up first
        monkeypatch.setattr(torch.profiler.profile, "start", slow_start)
        b = threading.Thread(target=thread_b)
        b.start()
        with tsp.profile_region("thread-a", "work", step=1):
            assert b_done.wait(10)
        b.join()
    assert errors == []
    [path] = trace_files(save_dir)
    assert path.name.startswith("thread-a_work_step1_")


# --- somebody else's profiler --------------------------------------------------------------------


def test_a_foreign_profiler_already_running_gets_our_ranges_and_no_second_profiler(save_dir, tmp_path, monkeypatch, caught_warnings):
    monkeypatch.setattr(ENGINE, "_warned", set())  # the warning is once per process
    foreign_file = tmp_path / "foreign.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with tsp.schedule(steps=[1, 2]):
            for n in (1, 2):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    work()
                    with tsp.profile_region("actor", "inner"):
                        work()
        assert torch.autograd._profiler_enabled()  # theirs is still running
    prof.export_chrome_trace(str(foreign_file))
    assert len(of_category(caught_warnings, ForeignProfilerWarning)) == 1
    assert trace_files(save_dir) == []
    names = range_names(load_trace(foreign_file))
    assert names.count("actor/update") == 2 and names.count("actor/inner") == 2
    assert not [n for n in names if n.startswith("ProfilerStep#")]  # no rows of ours in theirs


@pytest.mark.parametrize("category", [ProfilerStartWarning, ForeignProfilerWarning, TraceWriteWarning])
def test_every_warning_can_be_filtered_with_one_class(category):
    assert issubclass(category, TorchstepProfWarning) and issubclass(category, UserWarning)


def test_a_save_path_removed_between_traces_is_created_again(tmp_path):
    folder = tmp_path / "profile"
    with tsp.configure(save_path=str(folder), summary=False), tsp.schedule(steps=[1, 2]):
        with tsp.step(1), tsp.profile_region("actor", "update"):
            pass
        tsp.flush()  # as before a finish hook starts
        shutil.rmtree(folder)  # an upload hook that ships and cleans the folder, say
        with tsp.step(2), tsp.profile_region("actor", "update"):
            pass
    assert [parse_trace_name(p).step for p in trace_files(folder)] == [2]
    assert all(r.ok for r in tsp.records().traces)


def test_a_fused_step_with_many_roles_still_gets_a_file(save_dir):
    roles = [f"worker-group-{i:02d}" for i in range(25)]
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]), tsp.step(1):
        for role in roles:
            with tsp.profile_region(role, "work"):
                pass
    (path,) = trace_files(save_dir)
    assert len(path.name) < 255
    assert parse_trace_name(path).role.startswith("worker-group-00-worker-group-01")
    assert parse_trace_name(path).role.endswith("-more")


def test_a_keyboard_interrupt_while_the_profiler_starts_leaves_profiling_usable(save_dir, monkeypatch):
    from torchstep_prof.recording.session import TraceSession

    real_start = TraceSession.start
    calls = []

    def interrupted_once(self):
        calls.append(self.step)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_start(self)

    monkeypatch.setattr(TraceSession, "start", interrupted_once)
    with tsp.schedule(steps=[1, 2]):
        with pytest.raises(KeyboardInterrupt):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                pass
        with tsp.step(2), tsp.profile_region("actor", "update"):
            pass
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [2]


def interrupt_torch_once(monkeypatch, name, *, after):
    """Make torch's ``torch.autograd.profiler.<name>`` raise KeyboardInterrupt on its next call
    once armed (call the returned function): as a Ctrl-C does at the bytecode before that call
    (``after=False``) or at the one right after it returned (``after=True``). Returns the arming
    function."""
    from torch.autograd import profiler as autograd_profiler

    real = getattr(autograd_profiler, name)
    armed = []

    def interrupted(*args, **kwargs):
        if not armed:
            return real(*args, **kwargs)
        armed.clear()
        if after:
            real(*args, **kwargs)  # its result is dropped, as the interrupt drops it
        raise KeyboardInterrupt

    monkeypatch.setattr(autograd_profiler, name, interrupted)
    return lambda: armed.append(True)


# Where a Ctrl-C lands inside torch's stop() of the trace of step 1, and whether the trace
# survives it: torch's results are lost only when it lands between Kineto's disable returning
# and torch storing its result.
_STOP_INTERRUPTS = {
    "before-disable": ("_disable_profiler", False, True),
    "after-disable": ("_disable_profiler", True, False),
    "before-flag-reset": ("_run_on_profiler_stop", False, True),
    "after-flag-reset": ("_run_on_profiler_stop", True, True),
}


@pytest.mark.parametrize("fused", [False, True], ids=["discrete", "fused"])
@pytest.mark.parametrize("where", list(_STOP_INTERRUPTS))
def test_a_keyboard_interrupt_inside_torchs_stop_leaves_profiling_usable(save_dir, monkeypatch, caught_warnings, where, fused):
    from torch.autograd import profiler as autograd_profiler

    name, after, written = _STOP_INTERRUPTS[where]
    arm = interrupt_torch_once(monkeypatch, name, after=after)
    caught = []
    with tsp.configure(discrete=not fused), tsp.schedule(steps=[1, 2, 3]):
        for step in (1, 2, 3):
            try:
                with tsp.step(step), tsp.profile_region("actor", "update"):
                    work()
                    if step == 1:
                        arm()  # the Ctrl-C lands in this trace's stop
            except KeyboardInterrupt:
                caught.append(step)
    assert caught == [1]
    assert not autograd_profiler._is_profiler_enabled
    assert of_category(caught_warnings, ForeignProfilerWarning) == []
    files = {parse_trace_name(p).step: p for p in trace_files(save_dir)}
    records = {r.step: r for r in tsp.records().traces}
    assert sorted(records) == [1, 2, 3]  # every selected step has a file or a record
    assert {2, 3} <= set(files) and all(records[s].ok for s in (2, 3))
    if written:
        assert 1 in files and records[1].ok
        assert "actor/update" in range_names(load_trace(files[1]))
    else:
        assert 1 not in files
        assert records[1].error.startswith("interrupted by Ctrl-C while torch stopped the profiler")
        warned = of_category(caught_warnings, TraceWriteWarning)
        assert len(warned) == 1 and "interrupted by Ctrl-C" in str(warned[0].message)


_WARM_UP_INTERRUPTS = {
    "start-after-prepare": ("_prepare_profiler", True),
    "start-after-enable": ("_enable_profiler", True),
    "stop-before-disable": ("_disable_profiler", False),
    "stop-after-disable": ("_disable_profiler", True),
    "stop-before-flag-reset": ("_run_on_profiler_stop", False),
}


@pytest.mark.parametrize("where", list(_WARM_UP_INTERRUPTS))
def test_a_keyboard_interrupt_inside_the_one_time_warm_up_leaves_profiling_usable(save_dir, monkeypatch, caught_warnings, where):
    """The engine's warm-up profiler (started by the first scope or step, before any trace of
    ours) settles as a trace's does: no profiler of ours stays on, none is taken for someone
    else's, and the next selected step is written."""
    from torch.autograd import profiler as autograd_profiler

    from torchstep_prof.engine import ENGINE

    monkeypatch.setattr(ENGINE.slot, "warmed", False)
    name, after = _WARM_UP_INTERRUPTS[where]
    arm = interrupt_torch_once(monkeypatch, name, after=after)
    arm()
    with pytest.raises(KeyboardInterrupt):
        with tsp.schedule(steps=[1, 2]):  # the scope's warm-up: the Ctrl-C lands in it
            pass
    assert not autograd_profiler._is_profiler_enabled and not torch.autograd._profiler_enabled()
    with tsp.schedule(steps=[1, 2]):
        for step in (1, 2):
            with tsp.step(step), tsp.profile_region("actor", "update"):
                work()
    assert of_category(caught_warnings, ForeignProfilerWarning) == []
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [1, 2]


@pytest.mark.parametrize(
    "name, after",
    [("_prepare_profiler", True), ("_enable_profiler", False), ("_enable_profiler", True)],
    ids=["after-prepare", "before-enable", "after-enable"],
)
def test_a_keyboard_interrupt_inside_torchs_start_leaves_no_profiler_running(save_dir, monkeypatch, caught_warnings, name, after):
    from torch.autograd import profiler as autograd_profiler

    arm = interrupt_torch_once(monkeypatch, name, after=after)
    with tsp.schedule(steps=[1, 2]):
        arm()
        with pytest.raises(KeyboardInterrupt):
            with tsp.step(1), tsp.profile_region("actor", "update"):
                work()
        assert not autograd_profiler._is_profiler_enabled and not torch.autograd._profiler_enabled()
        with tsp.step(2), tsp.profile_region("actor", "update"):
            work()
    assert of_category(caught_warnings, ForeignProfilerWarning) == []
    assert [parse_trace_name(p).step for p in trace_files(save_dir)] == [2]


def test_very_long_labels_still_get_a_file_named_within_the_limit(save_dir):
    role, stage = "r" * 200, "s" * 300
    with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region(role, stage):
        pass
    with tsp.configure(discrete=False), tsp.schedule(steps=[2]), tsp.step(2), tsp.profile_region("x" * 150, "y"):
        pass
    files = trace_files(save_dir)
    assert len(files) == 2
    for path in files:
        assert len(path.name) < 255
        name = parse_trace_name(path)
        assert len(name.role) <= 100 and len(name.stage) <= 80
    discrete = [parse_trace_name(p) for p in files if parse_trace_name(p).step == 1][0]
    assert discrete.role.startswith("r" * 70) and "+" in discrete.role  # start kept, hash added
    assert all(r.ok for r in tsp.records().traces)
