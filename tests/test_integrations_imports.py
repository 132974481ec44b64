"""Importing torchstep_prof (and its integrations package) imports no framework."""

from __future__ import annotations

import subprocess
import sys


def test_import_loads_no_framework() -> None:
    code = (
        "import sys, torch, torchstep_prof, torchstep_prof.integrations\n"
        "import torchstep_prof as tsp\n"
        "with tsp.schedule(steps=[1]), tsp.configure(enable=False), tsp.step(1), tsp.profile_region('a', 'b'):\n"
        "    pass\n"
        "from torchstep_prof.topology import current_topology\n"
        "current_topology()\n"
        "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
