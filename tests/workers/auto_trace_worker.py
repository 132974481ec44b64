"""Slow steps trace themselves (tests/test_auto_trace.py); run under ``torchrun --nproc_per_node=2``.

``auto_trace_worker.py OUT MODE``: 200 steps of ~40 ms (+-30% jitter) under metrics,
``on_demand: {dir: OUT/od, poll_s: 0.1}`` and ``auto_trace`` watching the region
``train/compute``; between steps the ranks all-reduce (``train/sync``), so they run as one
job and a straggler's wait shows on the others in ``train/sync`` only. MODE ``slow``: from step
120 rank 1's compute is 3x slower and runs extra operators (``aten::cumprod``); ``stays``: the
same from step 60, plus a 10x spike every 30 steps, under a budget of one capture an hour;
``jitter``: jitter only. Traces go to ``OUT/traces``; writes ``OUT/result_rank<r>.json``.
With ``AUTO_TRACE_METRICS_PORT`` set, metrics are served on 127.0.0.1 at that port + rank, and
after its steps each rank writes ``OUT/rank<r>.done`` and serves on until ``OUT/release`` exists.
"""

import os
import random
import sys
import time
from pathlib import Path

import torch

import torchstep_prof as tsp
from _common import all_reduce, init_group, write_result

out = Path(sys.argv[1])
mode = sys.argv[2]
rank, world = init_group(timeout_s=120)
random.seed(1000 + rank)
x = torch.randn(16, 16)
slow_from = {"slow": 120, "stays": 60}.get(mode)
budget = {"max_traces_per_hour": 1, "cooldown_steps": 0} if mode == "stays" else {}


def compute(n: int) -> None:
    base = 0.04 * random.uniform(0.7, 1.3)
    with tsp.profile_region("train", "compute"):
        torch.tanh(x @ x)
        if rank == 1 and slow_from is not None and n >= slow_from:
            spike = 10 if mode == "stays" and n % 30 == 0 and n >= slow_from + 20 else 1
            deadline = time.perf_counter() + 3 * base * spike
            while time.perf_counter() < deadline:  # the straggler's extra work: operators of its own
                torch.cumprod(torch.ones(4096), 0)
        else:
            time.sleep(base)


port = int(os.environ.get("AUTO_TRACE_METRICS_PORT", "0"))
with tsp.configure(save_path=str(out / "traces")), tsp.metrics(port=port, addr="127.0.0.1"), \
        tsp.on_demand(str(out / "od"), poll_s=0.1):
    with tsp.auto_trace(os.environ.get("AUTO_TRACE_ON", "train/compute"), factor=2.0, min_ms=60, baseline_steps=30, next=2, peers=1, **budget):
        for n in range(200):
            with tsp.step(n):
                compute(n)
                with tsp.profile_region("train", "sync"):
                    all_reduce(torch.ones(1))
        if port:  # a job that stopped stepping but still serves: the stuck-job alert's case
            (out / f"rank{rank}.done").write_text("done")
            deadline = time.monotonic() + 120
            while not (out / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
write_result(out, rank, {"mode": mode})
