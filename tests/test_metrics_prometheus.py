"""A real Prometheus server scraping a 2-rank torchrun (gloo) job whose config file turns metrics on."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dist_helpers import WORKERS, free_port, run_torchrun

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus server binary is not installed (Debian package `prometheus`)"),
]
pytest.importorskip("prometheus_client", reason="prometheus_client (the [metrics] extra) is not installed")

STEPS = 20


def _two_free_ports() -> int:
    """A base port with the next one free too (each rank serves base + LOCAL_RANK)."""
    for _ in range(50):
        base = free_port()
        if base >= 65535:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def _query(web: str, promql: str) -> list[dict[str, Any]]:
    url = f"{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _by_rank(results: list[dict[str, Any]]) -> dict[str, float]:
    return {r["metric"]["rank"]: float(r["value"][1]) for r in results}


@pytest.fixture
def prometheus(tmp_path: Path):
    base = _two_free_ports()
    web_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: torchstep_prof\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{base}', '127.0.0.1:{base + 1}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    web = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{web}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("prometheus did not start:\n" + (tmp_path / "prometheus.log").read_text())
            time.sleep(0.2)
        yield web, base
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_prometheus_scrapes_per_rank_region_counts_and_step_buckets(prometheus, tmp_path: Path) -> None:
    web, base = prometheus
    out = tmp_path / "job"
    out.mkdir()
    config = tmp_path / "tsp.yaml"
    config.write_text(
        f"save_path: {out / 'traces'}\nall_ranks: true\nschedule:\n  steps: [5]\n"
        f"metrics:\n  port: {base}\n  addr: 127.0.0.1\n  buckets: [0.0001, 0.001, 0.01, 0.1, 1, 10]\n"
    )
    launched: dict[str, Any] = {}

    def job() -> None:
        launched["launch"] = run_torchrun(
            WORKERS / "metrics_worker.py", 2, [str(out)], log_dir=out,
            env={"TORCHSTEP_PROF_CONFIG": str(config)}, timeout_s=240,
        )  # fmt: skip

    thread = threading.Thread(target=job)
    thread.start()
    try:
        deadline = time.monotonic() + 200
        while not all((out / f"rank{r}.done").exists() for r in (0, 1)):
            assert thread.is_alive(), launched["launch"].output
            assert time.monotonic() < deadline, "the job did not finish its steps"
            time.sleep(0.5)
        # Every step is done: wait for a scrape after it (a few 1 s scrape intervals at most).
        wanted = {"0": float(STEPS), "1": float(STEPS)}
        query = 'sum by (rank) (torchstep_prof_region_seconds_count{role="actor",stage="update"})'
        while True:
            counts = _by_rank(_query(web, query))
            if counts == wanted or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        steps_inf = _by_rank(_query(web, 'torchstep_prof_step_seconds_bucket{le="+Inf"}'))
        buckets = _query(web, "torchstep_prof_step_seconds_bucket")
        inner = _by_rank(_query(web, 'torchstep_prof_region_seconds_count{role="actor",stage="inner"}'))
        traces = _by_rank(_query(web, "torchstep_prof_traces_written_total"))
        world = {r["metric"]["world_size"] for r in _query(web, "torchstep_prof_step_seconds_count")}
    finally:
        (out / "release").write_text("go")
        thread.join(timeout=260)
    launched["launch"].check()
    assert counts == wanted
    assert steps_inf == wanted
    assert {b["metric"]["le"] for b in buckets} == {"0.0001", "0.001", "0.01", "0.1", "1.0", "10.0", "+Inf"}
    assert {b["metric"]["rank"] for b in buckets} == {"0", "1"}
    # Regions nested in the profiled step 5's trace still count; each rank wrote that step's two
    # traces (discrete mode: actor/update's and critic/update's).
    assert inner == wanted
    assert traces == {"0": 2.0, "1": 2.0}
    assert world == {"2"}
    assert sorted(p.name.split("_step")[1].split("_")[0] for p in (out / "traces").glob("actor_update_*.json")) == ["5", "5"]
