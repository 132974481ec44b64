"""Shared test setup."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Run from a checkout without installing: put the repository root on the path, unless the
# package is installed (then the installed copy is the one under test).
if importlib.util.find_spec("torchstep_prof") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# The trace commands' summary cache (torchstep_prof.traces.reading.cache) of this test run, never the
# user's own; every test's trace folder is new, so entries never answer for another test.
if not os.environ.get("TORCHSTEP_PROF_CACHE_DIR"):
    os.environ["TORCHSTEP_PROF_CACHE_DIR"] = tempfile.mkdtemp(prefix="tsp-test-cache-")
    atexit.register(shutil.rmtree, os.environ["TORCHSTEP_PROF_CACHE_DIR"], True)

# --- the engine's tests: process state, and a save_path checked after every test -------------

import pytest  # noqa: E402
import torch  # noqa: E402

import torchstep_prof as tsp  # noqa: E402
from torchstep_prof.engine import ENGINE as _ENGINE  # noqa: E402
from torchstep_prof.process_state import reset_for_tests  # noqa: E402

# Variables that change what regions do (the environment's config layer, the rank): a test that
# wants one sets it itself.
_ENGINE_VARIABLES = (
    "TORCHSTEP_PROF_CONFIG", "TORCHSTEP_PROF_OVERRIDES", "TORCHSTEP_PROF_SUMMARY",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "TORCHSTEP_PROF_OWNER", "TORCHSTEP_PROF_CHILDREN",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    """Each test starts with the process-wide state of a new process (no records, an unread
    environment, an unresolved rank: every reset torchstep_prof/process_state.py lists), and must
    leave no torch profiler running."""
    for name in _ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    reset_for_tests()
    yield
    # Hooks run in the background: one still running must not land in the next test's records.
    tsp.flush()
    # torch.autograd._profiler_enabled() sees a profiler started on this thread; one started in
    # another thread it does not, so the engine's record of a running session is checked too.
    leaked_torch = torch.autograd._profiler_enabled()
    leaked_session = _ENGINE.slot.session
    if leaked_torch:  # stop it, so that one leak does not fail every later test too
        try:
            torch.autograd._disable_profiler()
        except Exception:
            pass
    if leaked_session is not None:
        _ENGINE.slot.forget_session()
        try:
            leaked_session._profile.stop()  # torch's profile, still running
        except Exception:
            pass
    reset_for_tests()
    assert not leaked_torch, "a torch profiler was left running after the test"
    assert leaked_session is None, "torchstep_prof's profiler was left running after the test"


@pytest.fixture
def save_dir(tmp_path):
    """A fresh ``save_path`` (not yet created) in force for the test, summary off.

    After the test, everything in it must be a whole trace file as docs/trace-files.md describes it (name
    grammar, JSON, distributedInfo, metadata, one ProfilerStep row, the owner's range inside
    it): this checks every file the suite's engine tests write, and that no partial file or
    scratch folder was left behind.
    """
    from trace_helpers import check_trace_file, contains, find_range, owner_range_name, profiler_steps, span_us

    folder = tmp_path / "profile"
    with tsp.configure(save_path=str(folder), summary=False):
        yield folder
    if not folder.exists():
        return
    for entry in sorted(folder.iterdir()):
        assert entry.is_file(), f"left behind in save_path: {entry.name}/"
        trace = check_trace_file(entry)
        owner = owner_range_name(entry, trace)
        if trace["torchstep_prof"]["discrete"]:
            assert owner is not None, f"{entry.name}: the owning region's range is missing"
            step_span = span_us(trace, profiler_steps(trace)[0])
            assert contains(step_span, span_us(trace, find_range(trace, owner))), (
                f"{entry.name}: ProfilerStep does not span the owner's range"
            )
