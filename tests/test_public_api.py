"""The package's public surface: what `import torchstep_prof` promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import torchstep_prof as tsp


def test_every_public_name_resolves_and_the_list_is_sorted():
    assert tsp.__all__ == sorted(tsp.__all__)
    for name in tsp.__all__:
        assert getattr(tsp, name) is not None, name


def test_nothing_private_is_exported():
    assert not [name for name in tsp.__all__ if name.startswith("_")]


def test_the_public_callables_are_the_documented_ones():
    assert callable(tsp.records) and not isinstance(tsp.records, type(sys))
    assert isinstance(tsp.records(), tsp.ProfilingRecords)
    for name in ("schedule", "ranks", "contents", "on_finish", "configure", "step", "profile_region", "profiled"):
        assert getattr(tsp, name).__doc__, f"{name} has no docstring"


def test_an_unknown_attribute_is_an_attribute_error():
    try:
        tsp.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_importing_the_package_imports_neither_torch_nor_the_heavy_libraries():
    # The command line (and tools reading traces) must not pay for torch, rich, cattrs or yaml.
    code = (
        "import sys, torchstep_prof;print(sorted(m for m in ('torch', 'rich', 'cattrs', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_schedule_in_force_loads_every_name_so_tsp_attribute_loads_are_plain():
    # Python 3.11 specializes `tsp.profile_region` only on a module without __getattr__; the
    # package drops its lazy loader once a schedule is in force (regions may run from then on).
    # Before that, names still load lazily; after it, unknown names still raise AttributeError.
    code = (
        "import torch, torchstep_prof as tsp\n"
        "before = '__getattr__' in vars(tsp)\n"
        "with tsp.configure(summary=False), tsp.schedule(steps=[10**9]):\n"
        "    pass\n"
        "after = '__getattr__' in vars(tsp)\n"
        "missing = sorted(n for n in tsp.__all__ if n not in vars(tsp))\n"
        "try:\n"
        "    tsp.no_such_thing\n"
        "except AttributeError as exc:\n"
        "    error = str(exc)\n"
        "print(before, after, missing, error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True False [] module 'torchstep_prof' has no attribute 'no_such_thing'"


def test_live_status_and_on_demand_traces_load_only_when_a_scope_turns_them_on(tmp_path):
    # Most jobs never use them: their poll and status threads, request files and stall rule are
    # not imported by training code (import time, docs/performance.md) until a scope opts in.
    code = (
        "import sys, torch, torchstep_prof as tsp\n"
        "heavy = ('torchstep_prof.live.reporter', 'torchstep_prof.triggers.watcher', 'torchstep_prof.triggers.plan')\n"
        "with tsp.configure(summary=False), tsp.schedule(steps=[10**9]), tsp.step(1), tsp.profile_region('a', 'b'):\n"
        "    pass\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        f"with tsp.on_demand(dir={str(tmp_path)!r}), tsp.step(2), tsp.profile_region('a', 'b'):\n"
        "    print(sorted(m for m in heavy if m in sys.modules), tsp.step.__module__)\n"
        "from torchstep_prof.live.reporter import LIVE\n"
        "from torchstep_prof.triggers.watcher import ON_DEMAND\n"
        "print(LIVE.running, ON_DEMAND.running)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[]",
        "['torchstep_prof.live.reporter', 'torchstep_prof.triggers.plan', 'torchstep_prof.triggers.watcher'] "
        "torchstep_prof.regions",
        "None None",  # stopped as the scope exited
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) != []  # the poll thread wrote this rank's status


def test_an_environment_schedule_loads_every_name_at_import():
    # Zero-code profiling may enter no scope at all: the import, after torch's, does it.
    code = "import torch, torchstep_prof as tsp; print('__getattr__' in vars(tsp), tsp.profile_region.__name__)"
    env = {**os.environ, "TORCHSTEP_PROF_OVERRIDES": "schedule.steps=[1000000]"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False profile_region"


def test_a_type_checker_sees_the_regions_and_scopes_types(tmp_path, monkeypatch):
    # What an IDE shows a user: profile_region is a Region (not Any), a scope decorates a
    # function keeping its signature, and `as` gets the config in force.
    api = pytest.importorskip("mypy.api", reason="needs mypy (the lint tools)")
    user = tmp_path / "user.py"
    user.write_text(
        "import torchstep_prof as tsp\n"
        "@tsp.schedule(steps=[1])\n"
        "def train(n: int) -> int:\n"
        "    return n\n"
        "with tsp.ranks(0) as config, tsp.profile_region('a', 'b'):\n"
        "    reveal_type(tsp.profile_region('a', 'b'))\n"
        "    reveal_type(train)\n"
        "    reveal_type(config)\n"
    )
    monkeypatch.setenv("MYPYPATH", os.path.dirname(os.path.dirname(os.path.abspath(tsp.__file__))))
    out, _, _ = api.run([str(user), "--no-incremental", "--ignore-missing-imports", "--follow-imports=silent"])
    revealed = [line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed type is" in line]
    assert revealed == [
        '"torchstep_prof.regions.Region"',
        '"def (n: int) -> int"',
        '"torchstep_prof.config.model.ProfilerConfig"',
    ], out
    assert not [line for line in out.splitlines() if ": error:" in line], out
