"""The examples in the package's docstrings run and print what they show.

Examples that need a training job or files of the reader's (``# doctest: +SKIP``) are shown,
not run; every other one is executed here.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import torchstep_prof

MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(torchstep_prof.__path__, prefix="torchstep_prof.")
    if not info.name.endswith("__main__")
)
# Integrations import their framework: without it installed, say so instead of failing.
FRAMEWORKS = {
    "torchstep_prof.integrations.lightning": "lightning.pytorch",
    "torchstep_prof.integrations.transformers": "transformers",
}


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name, tmp_path, monkeypatch):
    if module_name in FRAMEWORKS:
        pytest.importorskip(FRAMEWORKS[module_name], reason=f"{FRAMEWORKS[module_name]} is not installed")
    monkeypatch.chdir(tmp_path)  # an example that writes outputs/ writes it here
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module_name} failed (see output above)"
