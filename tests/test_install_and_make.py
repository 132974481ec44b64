"""The README's first commands as a new user runs them: the install from a checkout, what each
``make`` command installs, and the folder ``make example`` leaves.

The install builds the package from a copy of the checkout and installs it (without its
dependencies, which this interpreter has) into a folder of its own. ``make -n`` prints the commands a target would run on a fresh checkout (nothing is installed);
``make example`` runs for real with this test's own interpreter as the venv (``-o`` marks its
set-up as done, so nothing is installed into it), in a scratch folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("transformers", "lightning", "ray", "accelerate", "prometheus_client", "HolisticTraceAnalysis")

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_the_readme_installs_from_a_checkout_first(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    install = readme[readme.index("## Install") :]
    commands = re.findall(r"^pip install [^\n]*", install, re.M)
    checkout = next(i for i, c in enumerate(commands) if " -e ." in c)
    registry = [i for i, c in enumerate(commands) if re.search(r"install (-c \S+ )?'?torchstep_prof\[", c)]
    assert all(checkout < i for i in registry), commands  # the checkout form comes first
    assert any("git+" in c for c in commands), commands
    # What `pip install .` in a checkout installs: this package, importable, with its command line.
    source = tmp_path / "checkout"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in files.stdout.splitlines():
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run(
        [sys.executable, "-c", "import torchstep_prof, sys; from torchstep_prof.cli import main; print(torchstep_prof.__file__); sys.exit(main(['--version']))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(str(site)) and "torchstep-prof" in done.stdout
    assert (site / "torchstep_prof" / "py.typed").exists() and (site / "bin" / "torchstep-prof").exists()


def dry_run(target: str, tmp_path: Path) -> list[str]:
    """What ``make TARGET`` gives pip to install on a machine with no ``.venv`` yet, one line
    per install (pip's own upgrade aside)."""
    venv = tmp_path / "fresh-venv"
    done = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={venv}", target], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    prefix = f"{venv}/bin/python -m pip install -q -c {venv}/constraints.txt "
    return [line[len(prefix) :] for line in done.stdout.splitlines() if line.startswith(prefix)]


@needs_make
def test_make_example_installs_torch_and_torchstep_prof_only(tmp_path: Path) -> None:
    assert dry_run("example", tmp_path) == ["torch==2.13.0 numpy", "-e ."]


@needs_make
def test_make_report_adds_plotly_only(tmp_path: Path) -> None:
    installs = dry_run("report", tmp_path)
    assert installs[:2] == ["torch==2.13.0 numpy", "-e ."]
    assert len(installs) == 3 and re.fullmatch(r"-e '\.\[report\]' plotly==[\d.]+", installs[2]), installs
    for name in FRAMEWORKS + ("pytest", "test"):
        assert name not in " ".join(installs), name


@needs_make
def test_make_test_installs_holistic_trace_analysis_for_the_interop_test(tmp_path: Path) -> None:
    text = "\n".join(dry_run("test", tmp_path))
    assert re.search(r"HolisticTraceAnalysis==\d", text), text


@needs_make
def test_a_second_make_example_replaces_the_first_run(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    venv = Path(sys.prefix)
    env = dict(os.environ, PYTHONPATH=str(REPO), TORCHSTEP_PROF_SUMMARY="0", OMP_NUM_THREADS="1")
    make = ["make", "-f", str(REPO / "Makefile"), f"VENV={venv}", "-o", str(venv / ".installed"), "example"]
    pids = []
    for _ in range(2):
        done = subprocess.run(make, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        names = os.listdir(tmp_path / "outputs" / "profile")
        pids.append({re.search(r"_pid(\d+)_", name)[1] for name in names})
        assert len(names) == 10 and len(pids[-1]) == 1, names  # one run: steps 2, 3 x five regions
    assert pids[0] != pids[1]
    done = subprocess.run(
        [sys.executable, "-m", "torchstep_prof", "summarize", "outputs/profile"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "several runs" not in done.stderr, done.stderr
