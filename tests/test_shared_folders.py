"""Shared folders are hostile (docs/security.md): another user (``nobody`` through ``setpriv``)
plants links, FIFOs, devices and huge files in the on-demand folder and ``save_path`` of a real
job, and the job neither writes through them, nor blocks, nor runs out of memory."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from dist_helpers import _kill, worker_env
from torchstep_prof import ConfigError, parse_trace_name
from torchstep_prof.triggers.request import MAX_STEPS, parse_request, read_request
from torchstep_prof.writing.temp_files import TEMP_PREFIX, host_label

OTHER_USER = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
SECRET = "only root may read or change this\n"
WAIT_S = 180.0

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv (util-linux) to act as a second user on the same machine",
)


def as_other_user(*cmd: str) -> None:
    subprocess.run([*OTHER_USER, *cmd], check=True, timeout=30)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder tree as on a cluster: ``base`` (root's, 0755) holds a 0600 secret of root's and
    two group-writable shared folders, ``od`` and ``traces`` (0777, no sticky bit), which
    ``nobody`` may write."""
    base = Path(tempfile.mkdtemp(prefix="tsp-shared-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "secret").write_text(SECRET)
        (base / "secret").chmod(0o600)
        for name in ("od", "traces"):
            (base / name).mkdir()
            (base / name).chmod(0o777)
        yield base
    finally:
        shutil.rmtree(base)


_JOB = """
import os, sys, time
import torchstep_prof as tsp
od, save, steps, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
print("pid", os.getpid(), flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
with tsp.configure(save_path=save, process_role=os.environ.get("ROLE") or None, gzip=bool(os.environ.get("GZIP"))), \\
        tsp.on_demand(od, poll_s=0.05):
    print("entered", flush=True)
    for n in range(1, steps + 1):
        with tsp.step(n):
            time.sleep(0.02)
print("done", flush=True)
"""


def start_job(base: Path, steps: int, **env: str) -> tuple[subprocess.Popen[str], int]:
    job = subprocess.Popen(
        [sys.executable, "-c", _JOB, str(base / "od"), str(base / "traces"), str(steps), str(base / "go")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=worker_env(env), start_new_session=True,
    )  # fmt: skip
    assert job.stdout is not None
    line = job.stdout.readline()
    assert line.startswith("pid "), line
    return job, int(line.split()[1])


def finish(job: subprocess.Popen[str]) -> str:
    try:
        output, _ = job.communicate(timeout=WAIT_S)
    finally:
        _kill([job])
    assert job.returncode == 0, output
    return output


def trigger(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "torchstep_prof", "trigger", *args], capture_output=True,
                          text=True, env=worker_env(), timeout=120)


def test_links_planted_at_every_name_the_job_writes_are_never_written_through(shared):
    """Links to root's 0600 file at the status file, its old fixed temporary name, and every
    temporary name a trace write used to take (predictable from host and pid): the job writes
    its status and two gzip traces, the secret is untouched, and no name it made is a link."""
    od, traces, secret = shared / "od", shared / "traces", shared / "secret"
    job, pid = start_job(shared, 80, ROLE="a/../../escaped", GZIP="1")
    status = od / "status-rank0-a-..-..-escaped.json"  # the role as in file names: never a path
    as_other_user("ln", "-s", str(secret), str(status))
    as_other_user("ln", "-s", str(secret), f"{status}.tmp")
    planted = []
    for n in range(1, 4):
        stem = f"{TEMP_PREFIX}{host_label()}-{pid}-{n}.partial"
        for suffix in ("", ".tmp", ".gz", ".tmp.gz"):
            planted.append(traces / f"{stem}{suffix}")
            as_other_user("ln", "-s", str(secret), str(planted[-1]))
    written = trigger(str(od), "--at", "30", "--next", "2")
    assert written.returncode == 0, written.stderr
    (shared / "go").touch()
    output = finish(job)

    assert secret.read_text() == SECRET and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert sorted(p.name for p in shared.iterdir()) == ["go", "od", "secret", "traces"]  # nothing escaped
    assert not status.is_symlink() and json.loads(status.read_text())["role"] == "a/../../escaped"
    assert [e["outcome"] for e in json.loads(status.read_text())["served"]] == ["profiled 30-31"], output
    files = sorted(p for p in traces.iterdir() if p.name.endswith(".json.gz"))
    assert [parse_trace_name(p).step for p in files] == [30, 31]
    for path in files:
        assert not path.is_symlink() and path.stat().st_uid == 0
        with gzip.open(path, "rt") as handle:
            assert json.load(handle)["torchstep_prof"]["role"] == "a-..-..-escaped"
    # The links another user planted are theirs: left alone, and no work folder is left.
    assert all(p.is_symlink() for p in planted)
    left = {p.name for p in traces.iterdir()} - {p.name for p in files} - {p.name for p in planted}
    assert left == set(), left
    assert not [p for p in od.iterdir() if p.name.startswith(".")]  # no status temporary left


def test_fifos_devices_links_and_huge_files_never_block_or_exhaust_the_job(shared):
    """A FIFO at the status file (it used to hang the training thread at the scope's entry), a
    request linked to /dev/zero, then a 1 GiB request, then one holding a 60 kB id and 2,000,000
    steps: training runs through all of them, warning once each, naming the file and the key."""
    od = shared / "od"
    job, _ = start_job(shared, 100_000)
    as_other_user("mkfifo", str(od / "status-rank0.json"))
    as_other_user("ln", "-s", "/dev/zero", str(od / "request.json"))
    (shared / "go").touch()
    assert job.stdout is not None
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(job.stdout), daemon=True).start()  # type: ignore[arg-type]

    def wait_for_line(text: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not any(text in line for line in list(seen)):
            assert time.monotonic() < deadline and job.poll() is None, f"no {text!r} in:\n{''.join(seen)}"
            time.sleep(0.05)

    try:
        wait_for_line("entered")
        wait_for_line("request.json: a symbolic link (refused")
        (od / "request.json").unlink()
        as_other_user("truncate", "-s", "1G", str(od / "request.json"))
        wait_for_line("request.json: bigger than 65536 bytes (refused)")
        (od / "request.json").unlink()
        huge = {"id": "x" * 60_000, "steps": list(range(2_000_000))[:1000]}
        (od / "request.json").write_text(json.dumps(huge))
        wait_for_line("id: must be 1 to 64 characters")
        status = json.loads((od / "status-rank0.json").read_text())  # ours now: a regular file
        assert status["step"] > 1 and status["served"] == []
        assert (od / "status-rank0.json").stat().st_size < 1000
        # Each kind of failure is said, not only the first: the folder removed, then a file.
        shutil.rmtree(od)
        wait_for_line("status-rank0.json cannot be written ([Errno 2] No such file or directory")
        od.write_text("")
        wait_for_line("status-rank0.json cannot be written ([Errno 20] Not a directory")
    finally:
        _kill([job])
    text = "".join(seen)
    assert "steps: must list at most 100 (got 1000)" in text
    assert "x" * 100 not in text  # the bad id is shown cut short
    assert "Traceback" not in text and "MemoryError" not in text


def test_the_trigger_command_refuses_fifos_devices_and_huge_status_files(shared):
    """``trigger --status`` and ``trigger`` under a 512 MiB address-space limit, with a FIFO, a
    link to /dev/zero and a 1 GiB file as status files: each is skipped with a line; none blocks."""
    od = shared / "od"
    as_other_user("mkfifo", str(od / "status-rank0.json"))
    as_other_user("ln", "-s", "/dev/zero", str(od / "status-rank1.json"))
    as_other_user("truncate", "-s", "1G", str(od / "status-rank2.json"))
    limited = ("prlimit", f"--as={512 << 20}")
    for args in (["--status"], ["--next", "2"]):
        done = trigger(str(od), *args, prefix=limited)
        assert done.returncode == 1, done.stderr
        assert f"skipped {od}/status-rank0.json: not a regular file (a FIFO)" in done.stderr
        assert f"skipped {od}/status-rank1.json: a symbolic link (refused" in done.stderr
        assert f"skipped {od}/status-rank2.json: bigger than" in done.stderr
        assert "no rank polls it" in done.stderr and "Traceback" not in done.stderr
    assert not (od / "request.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--next", "101"], f"--next: must be from 1 to {MAX_STEPS} steps (got 101)"),
        (["--next", "1000000000", "--contents", "cpu,shapes,stack"], "--next: must be from 1 to 100 steps"),
        (["--at", str(2**60)], "--at: must be from 0 to"),
        (["--align", "0"], "--align: must be from 1 to 1000000 (got 0)"),
    ],
)
def test_the_trigger_command_bounds_requests_as_usage_errors(tmp_path, args, message):
    done = trigger(str(tmp_path), *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "request.json").exists()


def test_a_missing_folder_is_named_and_not_a_job_that_has_not_started(tmp_path):
    missing = tmp_path / "typo"
    for args in (["--status"], ["--next", "2"]):
        done = trigger(str(missing), *args)
        assert done.returncode == 1, done.stdout
        assert f"{missing} does not exist: no job polls it" in done.stderr
    assert not missing.exists()
    (tmp_path / "file").write_text("")
    done = trigger(str(tmp_path / "file"), "--at", "5")
    assert done.returncode == 1 and f"{tmp_path / 'file'} is not a folder" in done.stderr
    empty = trigger(str(tmp_path), "--status")
    assert empty.returncode == 1 and "no rank polls it (no status-rank*.json)" in empty.stderr


def test_request_bounds_name_the_key():
    def problems(data: dict) -> list[str]:
        with pytest.raises(ConfigError) as caught:
            parse_request(data)
        return [f"{p.path}: {p.message}" for p in caught.value.problems]

    assert problems({"id": "a\x1b[2Jb", "steps": [1]}) == [
        "id: must be 1 to 64 characters of 0-9 A-Z a-z . _ : + - (got 'a\\x1b[2Jb')"
    ]
    assert problems({"id": "r", "steps": list(range(101))}) == ["steps: must list at most 100 (got 101)"]
    assert problems({"id": "r", "steps": [5, 20_006]}) == [
        "steps: must lie within 10000 steps of each other (got 5 to 20006)"
    ]
    assert problems({"id": "r", "steps": [2**60]}) == [f"steps[0]: must be an integer from 0 to {2**53} (got {2**60})"]
    assert len(problems({"id": "r", "steps": [-1] * 100})) == 5  # the first few of one mistake
    assert parse_request({"id": "20261202T141503-3f9a2c", "steps": list(range(100))}).steps[-1] == 99


def test_a_deeply_nested_request_is_malformed_not_a_crash(tmp_path):
    path = tmp_path / "request.json"
    path.write_text("[" * 30_000 + "]" * 30_000)
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_request(str(path))


_HOOK_JOB = """
import json, os, sys, time
import torchstep_prof as tsp
od, runs = sys.argv[1], sys.argv[2]
os.makedirs(od)
with open(os.path.join(od, "request.json"), "w") as f:
    json.dump({"id": "r1", "steps": [5, 6]}, f)
hook = [sys.executable, "-c", f"import os; open({runs!r}, 'a').write(os.environ.get('TORCHSTEP_PROF_TRACES', '-') + chr(10))"]
with tsp.configure(save_path=sys.argv[3]), tsp.on_finish(hook), tsp.on_demand(od, poll_s=0.05):
    for n in range(1, 30):
        with tsp.step(n):
            time.sleep(0.03)
tsp.flush()
"""


def test_a_hook_that_served_requests_does_not_run_again_with_no_traces(tmp_path):
    """on_finish with on_demand and no schedule: the hook runs once per request, with its
    traces, and not again at the scope's exit with an empty list."""
    runs = tmp_path / "runs.txt"
    done = subprocess.run([sys.executable, "-c", _HOOK_JOB, str(tmp_path / "od"), str(runs), str(tmp_path / "t")],
                          capture_output=True, text=True, env=worker_env(), timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    lines = runs.read_text().splitlines()
    assert len(lines) == 1, lines
    assert [parse_trace_name(p).step for p in lines[0].split(os.pathsep)] == [5, 6]


def test_the_one_reader_follows_a_link_only_for_a_file_the_user_named(tmp_path):
    from torchstep_prof._shared_files import SharedFileError, read_capped

    (tmp_path / "trace.json").write_bytes(b"x" * 100)
    (tmp_path / "link.json").symlink_to(tmp_path / "trace.json")
    os.mkfifo(tmp_path / "pipe.json")
    # A config file or a trace the user named: the link is followed, the cap is optional.
    assert read_capped(str(tmp_path / "link.json"), None, follow_links=True) == b"x" * 100
    assert read_capped(str(tmp_path / "link.json"), 100, follow_links=True) == b"x" * 100
    # A file found in a shared folder: the link is refused; a FIFO and a big file say why.
    with pytest.raises(SharedFileError, match="link.json: a symbolic link"):
        read_capped(str(tmp_path / "link.json"), 100)
    with pytest.raises(SharedFileError, match=r"pipe.json: not a regular file \(a FIFO\)") as fifo:
        read_capped(str(tmp_path / "pipe.json"), None, follow_links=True)
    assert fifo.value.mode is not None and stat.S_ISFIFO(fifo.value.mode) and not fifo.value.too_big
    with pytest.raises(SharedFileError, match="trace.json: bigger than 99 bytes") as big:
        read_capped(str(tmp_path / "trace.json"), 99)
    assert big.value.too_big and big.value.mode is None
