"""The package's public surface: what `import torchstep_prof` promises."""

from __future__ import annotations

import subprocess
import sys

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
        "import sys, torchstep_prof;"
        "print(sorted(m for m in ('torch', 'rich', 'cattrs', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
