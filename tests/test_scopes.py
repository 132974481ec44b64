"""Scopes: composable context managers over one contextvars stack (docs/scopes-and-regions.md)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading

import pytest

import torchstep_prof as tsp
from torchstep_prof import ConfigError, ProfilerConfig, ScheduleConfig
from torchstep_prof.selection.frames import reset_root

DEFAULT = ProfilerConfig()


def test_outside_every_scope_the_defaults_are_in_force():
    assert tsp.effective_config() == DEFAULT
    assert DEFAULT.schedule is None and DEFAULT.ranks == (0,) and DEFAULT.discrete


def test_innermost_value_wins_and_the_previous_value_is_back_on_exit():
    with tsp.configure(save_path="outer"):
        assert tsp.effective_config().save_path == "outer"
        with tsp.configure(save_path="inner", gzip=True):
            assert tsp.effective_config().save_path == "inner"
            with tsp.schedule(steps=[1]):
                assert tsp.effective_config().save_path == "inner"
                with tsp.schedule(steps=[3, 4]):
                    assert tsp.effective_config().schedule.steps == (3, 4)
                assert tsp.effective_config().schedule.steps == (1,)
            assert tsp.effective_config().schedule is None
        assert tsp.effective_config().save_path == "outer"
        assert tsp.effective_config().gzip is False
    assert tsp.effective_config() == DEFAULT


def test_the_previous_value_is_back_after_an_exception():
    with pytest.raises(RuntimeError):
        with tsp.configure(save_path="gone"), tsp.schedule(steps=[2]):
            raise RuntimeError("boom")
    assert tsp.effective_config() == DEFAULT


_SCOPES = {
    "schedule": lambda: tsp.schedule(steps=[2, 5]),
    "ranks": lambda: tsp.ranks(0, 2),
    "contents": lambda: tsp.contents("cpu", "shapes"),
    "configure": lambda: tsp.configure(gzip=True, discrete=False),
}


@pytest.mark.parametrize("order", list(itertools.permutations(_SCOPES)), ids="-".join)
def test_scopes_compose_in_any_order(order):
    with contextlib.ExitStack() as stack:
        for name in order:
            stack.enter_context(_SCOPES[name]())
        config = tsp.effective_config()
    assert config.schedule == ScheduleConfig(steps=(2, 5))
    assert config.ranks == (0, 2) and config.all_ranks is False
    assert config.contents == ("cpu", "shapes")
    assert config.gzip is True and config.discrete is False
    assert tsp.effective_config() == DEFAULT


def test_each_scope_sets_only_its_own_fields():
    with tsp.configure(save_path="kept", ranks=[3]):
        with tsp.schedule(wait=1, active=2, repeat=0):
            config = tsp.effective_config()
            assert config.save_path == "kept" and config.ranks == (3,)
            assert config.schedule == ScheduleConfig(wait=1, active=2, repeat=0)
        with tsp.ranks(all_ranks=True):
            assert tsp.effective_config().all_ranks is True
        with tsp.ranks([1, 2]):
            assert tsp.effective_config().ranks == (1, 2)


def test_on_finish_sets_the_finish_hook(tmp_path):
    # ranks=[5]: this rank-0 process is not selected, so leaving the scope runs nothing.
    with tsp.configure(save_path=str(tmp_path)), tsp.on_finish(["echo", "hi"], ranks=[5], timeout_s=5) as config:
        assert config.finish_hook.cmd == ("echo", "hi")
        assert tsp.effective_config().finish_hook.timeout_s == 5
        assert tsp.effective_config().finish_hook.ranks == (5,)
    assert tsp.effective_config().finish_hook is None


def test_configure_with_a_whole_config_sets_every_field_and_fields_apply_on_top():
    whole = ProfilerConfig(save_path="whole", gzip=True, ranks=(1,), schedule=ScheduleConfig(steps=(7,)))
    with tsp.configure(discrete=False):
        with tsp.configure(whole):
            assert tsp.effective_config() == whole  # discrete=False from outside is replaced
        with tsp.configure(whole, save_path="on-top"):
            assert tsp.effective_config().save_path == "on-top"
            assert tsp.effective_config().schedule.steps == (7,)


def test_scopes_work_as_decorators():
    @tsp.schedule(steps=[4])
    @tsp.configure(save_path="decorated")
    @tsp.contents("stack")
    @tsp.ranks(1)
    def read():
        return tsp.effective_config()

    for _ in range(2):  # a decorator is entered afresh on every call
        config = read()
        assert config.schedule.steps == (4,)
        assert config.save_path == "decorated"
        assert config.contents == ("stack",)
        assert config.ranks == (1,)
        assert tsp.effective_config() == DEFAULT


def test_a_decorated_function_calling_itself_unwinds_correctly():
    @tsp.configure(save_path="recursive")
    def depth(n):
        assert tsp.effective_config().save_path == "recursive"
        return 0 if n == 0 else 1 + depth(n - 1)

    assert depth(3) == 3
    assert tsp.effective_config() == DEFAULT


def test_threads_see_their_own_stack():
    """A new thread starts outside every scope, and its scopes stay its own."""
    in_scope = threading.Barrier(2)
    checked = threading.Barrier(2)
    seen = {}

    def other():
        seen["at start"] = tsp.effective_config().schedule
        with tsp.configure(save_path="thread"):
            in_scope.wait()
            seen["own"] = tsp.effective_config().save_path
            checked.wait()

    with tsp.schedule(steps=[5]), tsp.configure(save_path="main"):
        thread = threading.Thread(target=other)
        thread.start()
        in_scope.wait()  # the thread is inside its scope now
        assert tsp.effective_config().save_path == "main"
        checked.wait()
        thread.join()
        assert tsp.effective_config().schedule.steps == (5,)
    assert seen == {"at start": None, "own": "thread"}


def test_asyncio_tasks_see_their_own_stack():
    """Each task copies the context it was created in, and its scopes stay its own even while
    the tasks interleave at every await."""

    async def task(label):
        seen = []
        with tsp.configure(save_path=label):
            for _ in range(3):
                await asyncio.sleep(0)
                seen.append(tsp.effective_config().save_path)
        seen.append(tsp.effective_config().save_path)  # back to what the task inherited
        return seen

    async def main():
        with tsp.configure(save_path="parent"):
            results = await asyncio.gather(task("a"), task("b"))
            return results, tsp.effective_config().save_path

    results, after = asyncio.run(main())
    assert results == [["a", "a", "a", "parent"], ["b", "b", "b", "parent"]]
    assert after == "parent"


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: tsp.schedule(wait=-1), "schedule.wait: must be >= 0 (got -1)"),
        (lambda: tsp.schedule(active=0), "schedule.active: must be >= 1 (got 0)"),
        (lambda: tsp.schedule(steps=[-1]), "schedule.steps[0]: must be >= 0 (got -1)"),
        (lambda: tsp.schedule(steps=[1], wait=2), "schedule.wait"),
        (lambda: tsp.contents("gpu"), "contents: 'gpu' is not one of cpu, cuda, memory, shapes, stack, flops, modules, nvtx, memory_snapshot"),
        (lambda: tsp.ranks(-1), "ranks[0]: must be >= 0 (got -1)"),
        (lambda: tsp.ranks(), "ranks"),
        (lambda: tsp.configure(save_pth="x"), "save_pth: unknown key (did you mean 'save_path'?)"),
        (lambda: tsp.configure(gzip="yes"), "gzip: must be true or false (got 'yes')"),
        (lambda: tsp.configure(process_role=""), "process_role"),
        (lambda: tsp.configure(schedule={"wait": -1}), "schedule.wait: must be >= 0 (got -1)"),
        (lambda: tsp.on_finish(""), "finish_hook.cmd"),
        (lambda: tsp.on_finish("true", timeout_s=-1), "finish_hook.timeout_s"),
    ],
)
def test_bad_scope_arguments_raise_config_error_naming_the_key(make, expected):
    with tsp.configure(save_path="before"):
        with pytest.raises(ConfigError) as caught:
            with make():
                pytest.fail("the scope was entered")
        # nothing half-applied
        assert tsp.effective_config() == ProfilerConfig(save_path="before")
    assert isinstance(caught.value, ValueError)
    assert expected in str(caught.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as caught:
        with tsp.schedule(wait=-1, active=0):
            pass
    message = str(caught.value)
    assert "wait: must be >= 0 (got -1)" in message
    assert "active: must be >= 1 (got 0)" in message


def test_the_environment_wins_over_the_code(monkeypatch):
    monkeypatch.setenv("TORCHSTEP_PROF_OVERRIDES", "gzip=true schedule.steps=[2]")
    reset_root()
    assert tsp.effective_config().schedule.steps == (2,)
    with tsp.configure(gzip=False), tsp.schedule(steps=[9]):
        config = tsp.effective_config()
    assert config.gzip is True and config.schedule.steps == (2,)


def test_a_bad_environment_raises_at_the_first_scope_that_reads_it(monkeypatch):
    monkeypatch.setenv("TORCHSTEP_PROF_OVERRIDES", "schedule.wait=-1")
    reset_root()
    with pytest.raises(ConfigError, match=r"schedule\.wait"):
        with tsp.configure(save_path="x"):
            pass
