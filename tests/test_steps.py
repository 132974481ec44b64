"""Steps as real loops use them (docs/scopes-and-regions.md): step 0,
``begin_step`` / ``end_step`` without re-indenting, occurrences of a region within one step,
exceptions leaving a loop, and a region left open across steps. Judged by the files written, the
ranges and metadata inside them, the hook's runs and ``tsp.records()``."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from trace_helpers import load_trace, range_names, steps_written, trace_files

import torchstep_prof as tsp
from torchstep_prof import parse_trace_name


def work():
    torch.ones(4, 4).mul_(2).sum()


def files_by_name(folder):
    """{(role, stage, step): [metadata of each file, in file-name (start time) order]}."""
    found = {}
    for path in trace_files(folder):
        name = parse_trace_name(path)
        found.setdefault((name.role, name.stage, name.step), []).append(load_trace(path)["torchstep_prof"])
    return found


# --- step 0 ----------------------------------------------------------------------------------


def test_step_zero_is_a_step_an_explicit_list_selects(save_dir):
    with tsp.schedule(steps=[0]):
        for n in range(0, 3):
            with tsp.step(n), tsp.profile_region("trainer", "forward"):
                work()
    [path] = trace_files(save_dir)
    assert "_step0_" in path.name
    trace = load_trace(path)
    assert trace["torchstep_prof"]["step"] == 0
    assert [e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")] == [
        "ProfilerStep#0"
    ]


def test_step_zero_by_the_step_argument_and_in_fused_mode(save_dir):
    with tsp.schedule(steps=[0]):
        with tsp.profile_region("data", "load", step=0):
            work()
        with tsp.configure(discrete=False), tsp.step(0), tsp.profile_region("trainer", "forward"):
            work()
    assert sorted(p.name.split("_step")[0] for p in trace_files(save_dir)) == ["data_load", "trainer_train"]
    assert steps_written(save_dir) == [0, 0]


# --- begin_step / end_step ------------------------------------------------------------------


def loop_with_blocks(steps):
    for n in steps:
        with tsp.step(n):
            with tsp.profile_region("trainer", "forward"):
                work()
            with tsp.profile_region("trainer", "optimizer_step"):
                work()


def loop_with_begin_step(steps):
    for n in steps:
        tsp.begin_step(n)
        with tsp.profile_region("trainer", "forward"):
            work()
        with tsp.profile_region("trainer", "optimizer_step"):
            work()


@pytest.mark.parametrize("discrete", [True, False])
def test_begin_step_writes_what_step_blocks_write(tmp_path, discrete):
    written = {}
    for loop in (loop_with_blocks, loop_with_begin_step):
        folder = tmp_path / loop.__name__
        with tsp.configure(save_path=str(folder), summary=False, discrete=discrete), tsp.schedule(steps=[0, 2]):
            loop(range(0, 4))
        files = trace_files(folder)
        written[loop.__name__] = sorted(
            (parse_trace_name(p).role, parse_trace_name(p).stage, parse_trace_name(p).step, tuple(sorted(range_names(load_trace(p)))))
            for p in files
        )
    assert written["loop_with_begin_step"] == written["loop_with_blocks"]
    assert {step for _, _, step, _ in written["loop_with_blocks"]} == {0, 2}
    if not discrete:  # one fused trace per selected step, holding that step's regions only
        assert [(role, stage) for role, stage, _, _ in written["loop_with_begin_step"]] == [("trainer", "train")] * 2


def test_a_fused_step_begun_ends_at_the_next_begin_step(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]):
        tsp.begin_step(1)
        with tsp.profile_region("trainer", "forward"):
            work()
        assert trace_files(save_dir) == []  # still recording
        tsp.begin_step(2)
        tsp.flush()  # the background writer: step 1's file is on disk now
        [path] = trace_files(save_dir)  # step 1 ended at begin_step(2), before step 2's work
        with tsp.profile_region("trainer", "late"):
            work()
    trace = load_trace(path)
    assert "trainer/forward" in range_names(trace)
    assert "trainer/late" not in range_names(trace)
    assert trace_files(save_dir) == [path]


def test_end_step_ends_the_step_and_does_nothing_when_none_is_open(save_dir):
    tsp.end_step()  # nothing open: nothing happens
    with tsp.configure(discrete=False), tsp.schedule(steps=[3]):
        tsp.begin_step(3)
        with tsp.profile_region("trainer", "forward"):
            work()
        tsp.end_step()
        tsp.flush()
        assert steps_written(save_dir) == [3]
        tsp.end_step()
        # no step is open any more: a region here counts by itself (entry 1: not selected)
        with tsp.profile_region("trainer", "forward"):
            work()
    assert steps_written(save_dir) == [3]


def test_a_bad_step_number_raises_and_leaves_the_open_step_open(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]):
        tsp.begin_step(1)
        with pytest.raises(ValueError, match=r"step number must be an integer >= 0 \(got -1\)"):
            tsp.begin_step(-1)
        with tsp.profile_region("trainer", "forward"):  # still in step 1
            work()
    [path] = trace_files(save_dir)
    assert "trainer/forward" in range_names(load_trace(path))


def test_the_hook_runs_when_the_last_selected_step_begun_ends(save_dir, tmp_path):
    seen = tmp_path / "hook-saw.txt"
    with tsp.schedule(steps=[0, 2]), tsp.on_finish(f'echo "$TORCHSTEP_PROF_TRACES" > "{seen}"', wait=True):
        for n in range(0, 4):
            tsp.begin_step(n)  # begin_step(3) ends step 2, the last selected one
            if n == 3:
                assert len(tsp.records().hooks) == 1 and seen.exists()
            else:
                assert tsp.records().hooks == ()
            with tsp.profile_region("trainer", "forward"):
                work()
    listed = sorted(parse_trace_name(p).step for p in seen.read_text().strip().split(":"))
    assert listed == [0, 2]
    assert len(tsp.records().hooks) == 1


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_an_exception_leaving_the_loop_ends_the_open_step_with_its_scope(save_dir, error):
    with pytest.raises(error, match="diverged"):
        with tsp.configure(discrete=False), tsp.schedule(steps=[0, 1]):
            iter_num = 0
            while True:
                tsp.begin_step(iter_num)
                with tsp.profile_region("trainer", "forward"):
                    work()
                if iter_num == 1:
                    raise error("loss diverged")
                iter_num += 1
    assert steps_written(save_dir) == [0, 1]  # step 1's fused trace ended with the scope
    # Nothing is left open: a new loop starts from a clean state.
    with tsp.schedule(steps=[5]):
        with tsp.step(5), tsp.profile_region("trainer", "forward"):
            work()
    assert steps_written(save_dir) == [0, 1, 5]


def test_a_step_begun_under_an_inner_scope_ends_when_that_scope_exits(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1, 2]):
        with tsp.contents("cpu"):
            tsp.begin_step(1)
            with tsp.profile_region("trainer", "forward"):
                work()
        assert steps_written(save_dir) == [1]  # ended with the contents() scope
        with tsp.profile_region("trainer", "forward", step=3):  # no step open: its own (unselected) step
            work()
        tsp.begin_step(2)
    assert steps_written(save_dir) == [1, 2]


def test_each_thread_has_its_own_begun_step(save_dir):
    ready = threading.Barrier(2)
    turn = threading.Lock()

    def worker(role, number):
        tsp.begin_step(number)
        ready.wait()  # both steps begun before either region runs
        with turn, tsp.profile_region(role, "work"):
            work()
        tsp.end_step()

    with tsp.schedule(steps=[1, 2]):
        threads = [threading.Thread(target=_in_context(worker), args=args) for args in (("first", 1), ("second", 2))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    written = sorted((parse_trace_name(p).role, parse_trace_name(p).step) for p in trace_files(save_dir))
    assert written == [("first", 1), ("second", 2)]


def _in_context(fn):
    """``fn`` run in a copy of the caller's context (its scopes), as a thread pool would."""
    import contextvars

    context = contextvars.copy_context()
    return lambda *args: context.copy().run(fn, *args)


def test_each_asyncio_task_has_its_own_begun_step(save_dir):
    async def task(role, number, gate):
        tsp.begin_step(number)
        await gate.wait()
        with tsp.profile_region(role, "work", step=None):
            work()
        tsp.end_step()

    async def main():
        gates = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(task(f"task{i}", i + 1, gates[i])) for i in range(2)]
        await asyncio.sleep(0)  # both steps begun
        for gate in reversed(gates):
            gate.set()
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    with tsp.schedule(steps=[1, 2]):
        asyncio.run(main())
        tsp.end_step()  # the main context began no step: nothing happens
    written = sorted((parse_trace_name(p).role, parse_trace_name(p).step) for p in trace_files(save_dir))
    assert written == [("task0", 1), ("task1", 2)]


# --- occurrences -----------------------------------------------------------------------------


def test_each_micro_batch_of_a_step_owns_a_trace_with_its_occurrence(save_dir):
    with tsp.schedule(steps=[0, 1]):
        for n in range(0, 2):
            tsp.begin_step(n)
            for _ in range(2):  # gradient accumulation: two micro-batches
                with tsp.profile_region("trainer", "forward"):
                    with tsp.profile_region("trainer", "forward_inner"):  # nested: a range, no count
                        work()
            with tsp.profile_region("trainer", "optimizer_step"):
                work()
    found = files_by_name(save_dir)
    for n in (0, 1):
        assert [m["occurrence"] for m in found[("trainer", "forward", n)]] == [1, 2]
        assert [m["occurrence"] for m in found[("trainer", "optimizer-step", n)]] == [1]
    assert ("trainer", "forward-inner", 0) not in found
    by_key = {}
    for record in tsp.records().traces:
        by_key.setdefault((record.stage, record.step), []).append(record.occurrence)
    assert by_key == {("forward", 0): [1, 2], ("optimizer-step", 0): [1], ("forward", 1): [1, 2], ("optimizer-step", 1): [1]}


def test_a_fused_step_entered_again_is_its_second_occurrence(save_dir):
    with tsp.configure(discrete=False), tsp.schedule(steps=[1]):
        for _epoch in range(2):  # numbering restarted per epoch
            with tsp.step(1), tsp.profile_region("trainer", "forward"):
                work()
    assert [m["occurrence"] for m in files_by_name(save_dir)[("trainer", "train", 1)]] == [1, 2]


def test_occurrences_count_per_step_role_and_stage(save_dir):
    with tsp.schedule(steps=[1, 2]):
        for n in (1, 2):
            with tsp.step(n):
                with tsp.profile_region("actor", "forward"):
                    work()
                with tsp.profile_region("critic", "forward"):
                    work()
                with tsp.profile_region("actor", "forward"):
                    work()
    found = files_by_name(save_dir)
    for n in (1, 2):
        assert [m["occurrence"] for m in found[("actor", "forward", n)]] == [1, 2]
        assert [m["occurrence"] for m in found[("critic", "forward", n)]] == [1]


# --- a region left open across steps ---------------------------------------------------------


def test_a_region_left_open_across_steps_is_reported_naming_its_trace(save_dir):
    def batches():
        while True:
            with tsp.profile_region("data", "load"):  # suspended inside at each yield
                work()
                yield torch.ones(2)

    loader = batches()
    with tsp.schedule(steps=[8]):
        for n in range(7, 11):
            with tsp.step(n):
                next(loader)
                with tsp.profile_region("trainer", "forward"):
                    work()
        loader.close()
    [path] = trace_files(save_dir)
    name = parse_trace_name(path)
    assert (name.role, name.stage, name.step) == ("data", "load", 8)
    assert "trainer/forward" in range_names(load_trace(path))  # step 9's region landed in it
    [line] = [a for a in tsp.records().attention if "data/load" in a]
    assert "step 8" in line and "step(s) 9 ran inside it" in line and str(path) in line


def test_a_region_closed_inside_its_step_is_not_reported(save_dir):
    with tsp.schedule(steps=[1]):
        for n in range(1, 3):
            with tsp.step(n), tsp.profile_region("data", "load"):
                work()
    assert len(trace_files(save_dir)) == 1
    assert tsp.records().attention == ()
