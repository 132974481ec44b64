"""The metrics endpoint as a network peer sees it: idle and slow connections, oversized and broken
requests, more label pairs than the cap. Each test runs a real training script in its own
interpreter (its descriptors, its stderr, its summary) and talks to it over 127.0.0.1."""

from __future__ import annotations

import errno
import os
import re
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from script_helpers import REPO

parser = pytest.importorskip(
    "prometheus_client.parser", reason="prometheus_client (the [metrics] extra) is not installed"
)

from torchstep_prof.region_metrics.recorder import MAX_PAIRS  # noqa: E402
from torchstep_prof.region_metrics.server import CONNECTION_DEADLINE_S, IO_TIMEOUT_S, MAX_CONNECTIONS  # noqa: E402

# A training loop with metrics on 127.0.0.1 (any free port): it prints the port, then waits for a
# line on stdin before its next phase, so the test can act on the endpoint in between.
TRAINING = """
import os, sys, warnings
import torchstep_prof as tsp
from torchstep_prof.region_metrics.endpoint import endpoint

def phase(name):
    print(name, flush=True)
    sys.stdin.readline()

with tsp.metrics(port=0, addr="127.0.0.1"):
    for n in range(1, 4):
        with tsp.step(n), tsp.profile_region("actor", "update"):
            pass
    print("port", endpoint()[1], flush=True)
    phase("serving")
    {body}
    print("done", flush=True)
"""


class Training:
    """The training script, running; ``next()`` lets it go on to its next phase."""

    def __init__(self, tmp_path: Path, body: str, *prefix: str) -> None:
        script = tmp_path / "train.py"
        script.write_text(TRAINING.format(body=textwrap.indent(textwrap.dedent(body), "    ").strip()))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHSTEP_PROF_")}
        env.update(PYTHONPATH=str(REPO), COLUMNS="200")
        self.process = subprocess.Popen(
            [*prefix, sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        assert first.startswith("port "), first + self.process.stderr.read()  # type: ignore[union-attr]
        self.port = int(first.split()[1])
        assert self.process.stdout.readline() == "serving\n"

    def next(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def finish(self) -> tuple[str, str, int]:
        self.next()
        out, err = self.process.communicate(timeout=120)
        return out, err, self.process.returncode


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def open_idle(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(sock)
    return held


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_idle_connections_never_take_the_descriptors_training_needs(tmp_path: Path) -> None:
    """200 idle connections to a process limited to 64 descriptors: the training files still
    open, the server keeps at most MAX_CONNECTIONS of them and drops those after IO_TIMEOUT_S,
    and the endpoint serves again."""
    training = Training(
        tmp_path,
        """
        files = [open(f"ckpt{i}.bin", "wb") for i in range(30)]  # a checkpoint's shards, say
        for f in files:
            f.write(b"x")
            f.close()
        print("saved", len(files), flush=True)
        phase("after")
        """,
        "prlimit", "--nofile=64",
    )  # fmt: skip
    held = open_idle(training.port, 200)
    time.sleep(1.0)  # let the accept loop take them all
    kept = [sock for sock in held if not closed_by_server(sock, 0.2)]
    assert 0 < len(kept) <= MAX_CONNECTIONS  # the others closed at once: no thread, no descriptor
    training.next()
    assert training.process.stdout.readline() == "saved 30\n"  # type: ignore[union-attr]
    assert all(closed_by_server(sock, IO_TIMEOUT_S + 5) for sock in kept)  # silent: dropped in time
    assert "torchstep_prof_region_seconds_count" in scrape(training.port)
    for sock in held:
        sock.close()
    out, err, code = training.finish()
    assert code == 0, err
    assert "done" in out
    assert err == ""  # not one line about any of it on training's stderr


BROKEN_REQUESTS = [
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",  # a request line past any limit
    b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(300)) + b"\r\n",  # 300 headers
    b"GET /metrics HTTP/1.1\r\nX-Long: " + b"z" * 70_000 + b"\r\n\r\n",  # one header of 70 kB
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(200),  # a TLS hello
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n",  # half a request, then the peer goes
    b"POST /metrics HTTP/1.0\r\nContent-Length: 999999999\r\n\r\nabc",
]


def test_broken_and_oversized_requests_leave_nothing_on_trainings_stderr(tmp_path: Path) -> None:
    training = Training(tmp_path, "")
    for request in BROKEN_REQUESTS:
        with socket.create_connection(("127.0.0.1", training.port), timeout=10) as sock:
            try:
                sock.sendall(request)
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except OSError as error:  # the server dropped it, as it should: a reset, a broken
                # pipe, or (when the drop beat our shutdown) a socket no longer connected
                assert error.errno in (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN), error
    for partial in (b"GET /metrics HTTP/1.1\r\nX-Long: " + b"z" * 30_000, b"GET /" + b"a" * 30_000):
        with socket.create_connection(("127.0.0.1", training.port), timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
            sock.sendall(partial)  # a long request, cut by a reset while the server reads it
            time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", training.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        sock.close()  # gone before the answer: the server's write fails
    time.sleep(0.5)
    assert "torchstep_prof_step_seconds_count" in scrape(training.port)
    out, err, code = training.finish()
    assert code == 0, err
    assert err == ""


def test_a_peer_trickling_bytes_is_cut_off_at_the_connection_deadline(tmp_path: Path) -> None:
    training = Training(tmp_path, "")
    with socket.create_connection(("127.0.0.1", training.port), timeout=10) as sock:
        started = time.monotonic()
        cut = False
        sock.settimeout(IO_TIMEOUT_S / 2)
        while time.monotonic() - started < CONNECTION_DEADLINE_S + 10:
            try:
                sock.sendall(b"X")  # one byte of a request line, well within the read timeout
                if sock.recv(1) == b"":
                    cut = True
                    break
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                cut = True
                break
        assert cut, "the server kept a connection that never finished its request"
        assert time.monotonic() - started < CONNECTION_DEADLINE_S + 5
    out, err, code = training.finish()
    assert code == 0 and err == "", err


def test_more_label_pairs_than_the_cap_share_one_other_series_with_one_warning(tmp_path: Path) -> None:
    training = Training(
        tmp_path,
        f"""
        for i in range({MAX_PAIRS + 500}):
            with tsp.profile_region("actor", f"sample{{i}}"):  # a label made from data
                pass
        phase("labelled")
        """,
    )
    training.next()
    assert training.process.stdout.readline() == "labelled\n"  # type: ignore[union-attr]
    text = scrape(training.port)
    pairs = {
        (s.labels["role"], s.labels["stage"]): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "torchstep_prof_region_seconds_count"
    }
    assert len(pairs) == MAX_PAIRS + 1
    assert pairs[("other", "other")] == 500 + 1  # the pairs past the cap (actor/update took a place)
    assert pairs[("actor", "update")] == 3
    out, err, code = training.finish()
    assert code == 0, err
    assert err.count("MetricsWarning") == 1, err
    assert f"more than {MAX_PAIRS} distinct (role, stage) pairs" in err
    summary = [line for line in out.splitlines() if line.startswith("metrics")]
    assert len(summary) <= 22, out  # 20 pairs, one line for the rest, the steps
    assert any(re.match(r"metrics: \d+ more \(role, stage\) pairs", line) for line in summary), out


def test_a_role_that_is_not_a_string_is_served_as_text(tmp_path: Path) -> None:
    training = Training(
        tmp_path,
        """
        with tsp.profile_region(7, "update"):
            pass
        phase("timed")
        """,
    )
    training.next()
    assert training.process.stdout.readline() == "timed\n"  # type: ignore[union-attr]
    for _ in range(2):  # every scrape, not only the first
        assert 'role="7",stage="update"' in scrape(training.port)
    out, err, code = training.finish()
    assert code == 0, err
    assert "metrics 7/update: 1 times" in out
    assert err.count("LabelWarning") == 1 and "region role '7' is a int, not a string" in err
