"""Running a small training script in a fresh interpreter, as a user runs theirs: exits, at-exit
work and environment configuration can only be seen from outside the process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(
    code: str, tmp_path: Path, *args: str, timeout: float = 300, columns: int = 200, **env: str
) -> subprocess.CompletedProcess[str]:
    """Write ``code`` (dedented) to ``tmp_path/job.py`` and run it there with ``args``; the
    test's own ``TORCHSTEP_PROF_*`` variables are dropped, ``env`` added."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(code))
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
    full_env.update({"PYTHONPATH": str(REPO), "COLUMNS": str(columns), **env})
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=timeout
    )
