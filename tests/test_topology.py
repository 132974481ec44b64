"""The rank resolver: rank and world size from the environment, and what nonsense there gives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchstep_prof.errors import TorchstepProfWarning
from torchstep_prof.naming import parse_trace_name
from torchstep_prof.topology import Topology, current_topology, forget_topology

WARNING = "torchstep_prof: ignoring a rank environment that makes no sense"

# (environment, the reason the warning gives, the topology used)
NONSENSE = [
    ({"RANK": "-1"}, "RANK=-1 is not >= 0", "rank 0 of 1, local rank 0 of 1"),
    ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is not below WORLD_SIZE=2", "rank 0 of 1, local rank 0 of 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is not >= 1", "rank 0 of 1, local rank 0 of 1"),
    ({"RANK": "0", "WORLD_SIZE": "-3"}, "WORLD_SIZE=-3 is not >= 1", "rank 0 of 1, local rank 0 of 1"),
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK=abc is not an integer", "rank 0 of 1, local rank 0 of 1"),
    ({"RANK": "3"}, "RANK=3 is not below WORLD_SIZE (unset: 1)", "rank 0 of 1, local rank 0 of 1"),
    ({"RANK": "1 2", "WORLD_SIZE": "x"}, "RANK='1 2' is not an integer; WORLD_SIZE=x is not an integer",
     "rank 0 of 1, local rank 0 of 1"),
    # The global pair fell back: the local one follows it, unchecked.
    ({"RANK": "-1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "RANK=-1 is not >= 0",
     "rank 0 of 1, local rank 0 of 1"),
    # A sound global pair is kept; nonsense in LOCAL_* makes this process alone on its node.
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK=x is not an integer", "rank 1 of 4, local rank 0 of 1"),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2", "rank 3 of 4, local rank 0 of 1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8"},
     "LOCAL_WORLD_SIZE=8 is more than the world size 2", "rank 1 of 2, local rank 0 of 1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 is not >= 1",
     "rank 1 of 2, local rank 0 of 1"),
]


def _set(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str]) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    forget_topology()


@pytest.mark.parametrize(("environ", "reason", "used"), NONSENSE, ids=[" ".join(f"{k}={v}" for k, v in e.items())
                                                                        for e, _, _ in NONSENSE])
def test_nonsense_gives_one_warning_naming_the_variables_and_what_was_used(
    monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], reason: str, used: str
) -> None:
    _set(monkeypatch, environ)
    with pytest.warns(TorchstepProfWarning) as caught:
        topology = current_topology()
        assert current_topology() is topology  # cached: read often, resolved once
    assert [str(w.message) for w in caught] == [f"{WARNING} ({reason}); using {used}"]
    shown = f"rank {topology.rank} of {topology.world_size}, local rank {topology.local_rank} of {topology.local_world_size}"
    assert shown == used


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, Topology(rank=0, world_size=1, local_rank=0, local_world_size=1)),
        ({"RANK": "3", "WORLD_SIZE": "4"}, Topology(rank=3, world_size=4, local_rank=3, local_world_size=4)),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
         Topology(rank=3, world_size=4, local_rank=1, local_world_size=2)),
        ({"RANK": "", "WORLD_SIZE": ""}, Topology(rank=0, world_size=1, local_rank=0, local_world_size=1)),
    ],
)
def test_sound_environments_are_used_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder, environ: dict[str, str], expected: Topology
) -> None:
    _set(monkeypatch, environ)
    assert current_topology() == expected
    assert [str(w.message) for w in recwarn] == []


def test_the_warning_is_not_repeated_when_the_rank_is_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchstep_prof import topology

    _set(monkeypatch, {"RANK": "-1"})
    with pytest.warns(TorchstepProfWarning) as caught:
        current_topology()
        topology._forget_cache()  # what a fork or a new process group does
        current_topology()
    assert len(caught) == 1


# A process whose region writes traces of steps 1 and 2 on every rank it believes it is.
_SCRIPT = textwrap.dedent(
    """
    import sys
    import torchstep_prof as tsp

    with tsp.configure(save_path=sys.argv[1], summary=False), tsp.schedule(steps=[1, 2]), \\
            tsp.ranks(all_ranks=True):
        for n in (1, 2):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
    """
)


@pytest.mark.parametrize(
    ("environ", "reason"),
    [
        ({"RANK": "-1"}, "RANK=-1 is not >= 0"),
        ({"RANK": "5", "WORLD_SIZE": "2"}, "RANK=5 is not below WORLD_SIZE=2"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 is not >= 1"),
        ({"WORLD_SIZE": "-3"}, "WORLD_SIZE=-3 is not >= 1"),
        ({"RANK": "abc"}, "RANK=abc is not an integer"),
    ],
    ids=["RANK=-1", "RANK=5 WORLD_SIZE=2", "WORLD_SIZE=0", "WORLD_SIZE=-3", "RANK=abc"],
)
def test_files_written_under_nonsense_are_rank_0_of_1_and_parse(
    tmp_path: Path, environ: dict[str, str], reason: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(environ, TORCHSTEP_PROF_SUMMARY="0")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(out)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2
    parsed = [parse_trace_name(name) for name in names]
    assert [(p.step, p.rank, p.world_size) for p in parsed] == [(1, 0, 1), (2, 0, 1)]
    assert all("_rank0-of-1_" in name for name in names)
    warnings = [line for line in done.stderr.splitlines() if WARNING in line]
    assert len(warnings) == 1, done.stderr
    assert warnings[0].endswith(f"TorchstepProfWarning: {WARNING} ({reason}); using rank 0 of 1, local rank 0 of 1")


_RAY_ACTOR_SCRIPT = textwrap.dedent(
    """
    import sys, types
    # A stand-in for Ray inside an actor: initialized, with an actor id (no cluster needed).
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_actor_id=lambda: "a1b2")
    sys.modules["ray"] = ray
    import contextlib
    import torchstep_prof as tsp

    scopes = contextlib.ExitStack()
    scopes.enter_context(tsp.schedule(steps=[1]))  # line 12: the rank is first needed here
    scopes.enter_context(tsp.configure(save_path=sys.argv[1]))
    with tsp.step(1), tsp.profile_region("critic", "update"):
        pass
    scopes.close()
    """
)


def test_the_unranked_ray_actor_warning_points_at_user_code(tmp_path: Path) -> None:
    script = tmp_path / "actor.py"
    script.write_text(_RAY_ACTOR_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["TORCHSTEP_PROF_SUMMARY"] = "0"
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if "has no RANK variable" in line]
    # Not torchstep_prof/selection/frames.py (where the rank is first read) nor contextlib's ExitStack.
    assert warning.startswith(f"{script}:12: TorchstepProfWarning: "), done.stderr
