"""Per-node completion: real processes finishing at very different times, and isolation of
nodes, restarts and launchers from each other."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from torchstep_prof.hook import node_sync as _node_sync
from torchstep_prof.errors import FinishHookWarning

_REPO = Path(__file__).resolve().parents[1]

# argv: role (mark|wait) scope local_rank [local_world_size timeout_s]. The worker says "ready"
# once imported, then waits for its start time on stdin, so interpreter start-up does not blur
# the delays under test. It loads the package without running its __init__ (which imports
# torch, seconds per process): _node_sync itself needs only the standard library and attrs.
_WORKER = r"""
import json, sys, time, types
package = types.ModuleType("torchstep_prof")
package.__path__ = [sys.argv[1]]
sys.modules["torchstep_prof"] = package
from torchstep_prof.hook import node_sync as _node_sync
role, scope, local_rank = sys.argv[2], sys.argv[3], int(sys.argv[4])
print("ready", flush=True)
start_at = float(sys.stdin.readline())
time.sleep(max(0.0, start_at - time.time()))
_node_sync.mark_finished(scope, local_rank)
result = {"marked": time.time()}
if role == "wait":
    began = time.monotonic()
    missing = _node_sync.wait_for_node(scope, int(sys.argv[5]), float(sys.argv[6]))
    result.update(missing=list(missing), returned=time.time(), waited=time.monotonic() - began)
print(json.dumps(result), flush=True)
"""


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    """A torchrun-like environment of our own, with markers kept under tmp_path."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_ERROR_FILE"}
    env.update(
        TMPDIR=str(temp),
        GROUP_RANK="0",
        TORCHELASTIC_RUN_ID=uuid.uuid4().hex,
        TORCHELASTIC_RESTART_COUNT="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29500",
    )
    return env


def _launch(env, *workers) -> list[subprocess.Popen]:
    """Start ``(role, scope, local_rank, delay_s, *wait_args)`` workers together; they begin
    their work ``delay_s`` after all of them are ready."""
    package_dir = str(_REPO / "torchstep_prof")
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, package_dir, role, scope, str(rank), *map(str, wait_args)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for role, scope, rank, _, *wait_args in workers
    ]
    for process in processes:
        assert process.stdout.readline().strip() == "ready"
    start_at = time.time() + 0.1
    for process, (_, _, _, delay, *_) in zip(processes, workers):
        process.stdin.write(f"{start_at + delay!r}\n")
        process.stdin.flush()
    return processes


def _result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    return json.loads(out)


def test_waiter_returns_only_after_the_slowest_rank(node_env):
    waiter, *markers = _launch(
        node_env,
        ("wait", "scope", 0, 0.0, 4, 15),
        ("mark", "scope", 1, 0.0),
        ("mark", "scope", 2, 0.5),
        ("mark", "scope", 3, 1.5),
    )
    marked = [_result(p)["marked"] for p in markers]
    waited = _result(waiter)

    assert waited["missing"] == []
    assert waited["returned"] >= max(marked)
    assert waited["returned"] - max(marked) < 1.0  # promptly, not at the bound
    assert waited["waited"] >= 1.2


def test_waiter_names_the_ranks_it_did_not_hear_from(node_env):
    waiter, *markers = _launch(
        node_env, ("wait", "scope", 0, 0.0, 4, 1.0), ("mark", "scope", 1, 0.0), ("mark", "scope", 2, 0.3)
    )
    for process in markers:
        _result(process)
    waited = _result(waiter)

    assert waited["missing"] == [3]
    assert 1.0 <= waited["waited"] < 3.0


def test_nodes_never_see_each_others_markers(node_env):
    other_node = dict(node_env, GROUP_RANK="1")
    for rank in range(4):
        _node_sync.mark_finished("scope", rank, node_env)
    _node_sync.mark_finished("scope", 0, other_node)

    assert _node_sync.node_key(node_env) != _node_sync.node_key(other_node)
    assert _node_sync.wait_for_node("scope", 4, 0, node_env) == ()
    assert _node_sync.wait_for_node("scope", 4, 0, other_node) == (1, 2, 3)


def test_a_restarted_attempt_does_not_reuse_markers(node_env):
    restarted = dict(node_env, TORCHELASTIC_RESTART_COUNT="1")
    for rank in range(2):
        _node_sync.mark_finished("scope", rank, node_env)
    assert _node_sync.wait_for_node("scope", 2, 0, restarted) == (0, 1)


def test_scopes_are_separate(node_env):
    _node_sync.mark_finished("hook-a/1", 0, node_env)
    assert _node_sync.wait_for_node("hook-a/2", 1, 0, node_env) == (0,)
    assert _node_sync.wait_for_node("hook-a/1", 1, 0, node_env) == ()


def test_launcher_is_torchruns_attempt_folder_when_known(node_env):
    def key(error_file: str) -> str:
        return _node_sync.node_key(dict(node_env, TORCHELASTIC_ERROR_FILE=error_file))

    # Workers of one attempt share it even behind per-worker wrapper scripts (other parents).
    assert key("/tmp/torchelastic_a/run/attempt_0/0/error.json") == key("/tmp/torchelastic_a/run/attempt_0/3/error.json")
    assert key("/tmp/torchelastic_a/run/attempt_0/0/error.json") != key("/tmp/torchelastic_b/run/attempt_0/0/error.json")


def test_node_key_is_one_safe_folder_name(node_env):
    key = _node_sync.node_key(dict(node_env, GROUP_RANK="../../etc", TORCHELASTIC_RESTART_COUNT="/"))
    assert os.sep not in key and key not in (".", "..") and not key.startswith(".")


def test_markers_are_private_complete_and_cleared(node_env, tmp_path):
    _node_sync.mark_finished("scope", 2, node_env)
    root = tmp_path / "tmp" / f"torchstep_prof-{os.getuid()}"
    assert root.stat().st_mode & 0o777 == 0o700
    files = [p for p in root.rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["rank2"]  # no temporary left behind

    _node_sync.cleanup("scope", node_env)
    assert not [p for p in root.rglob("*") if p.is_file()]
    assert _node_sync.wait_for_node("scope", 3, 0, node_env) == (0, 1, 2)


def test_a_planted_marker_root_is_refused_with_a_warning(node_env, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "tmp" / f"torchstep_prof-{os.getuid()}").symlink_to(elsewhere)
    with pytest.warns(FinishHookWarning, match="could not mark"):
        _node_sync.mark_finished("scope", 0, node_env)
    assert not list(elsewhere.iterdir())
    with pytest.warns(FinishHookWarning, match="cannot wait for the node's ranks"):
        assert _node_sync.wait_for_node("scope", 1, 0.1, node_env) == (0,)


_OTHER_USER = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _as_root_with_setpriv() -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux) to act as a second user")


def test_a_marker_root_another_user_made_first_fails_fast(node_env, tmp_path):
    """Another user of a shared /tmp makes ``torchstep_prof-<uid>`` first: the node's uploader
    says so at once instead of waiting out node_wait_s (300 s here)."""
    _as_root_with_setpriv()
    shared_tmp = Path(tempfile.mkdtemp(prefix="tsp-shared-tmp-", dir="/tmp"))
    try:
        shared_tmp.chmod(0o1777)  # as /tmp is
        root = shared_tmp / f"torchstep_prof-{os.getuid()}"
        subprocess.run([*_OTHER_USER, "mkdir", "-m", "0777", str(root)], check=True)
        env = dict(node_env, TMPDIR=str(shared_tmp))
        script = (
            "import sys, time, types\n"
            "package = types.ModuleType('torchstep_prof'); package.__path__ = [sys.argv[1]]\n"
            "sys.modules['torchstep_prof'] = package\n"
            "from torchstep_prof.hook import node_sync\n"
            "node_sync.mark_finished('scope', 0)\n"
            "t0 = time.monotonic(); missing = node_sync.wait_for_node('scope', 2, 300)\n"
            "print(list(missing), round(time.monotonic() - t0))\n"
        )
        done = subprocess.run([sys.executable, "-c", script, str(_REPO / "torchstep_prof")], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["[0,", "1]", "0"]  # both missing, no wait
        assert f"{root} (owned by uid 65534, mode 777) is not a private folder of this user" in done.stderr
        assert "cannot wait for the node's ranks" in done.stderr and "TMPDIR" in done.stderr
        assert not list(root.iterdir())  # nothing of ours went into their folder
    finally:
        shutil.rmtree(shared_tmp)
