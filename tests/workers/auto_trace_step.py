"""Slow steps trace themselves, one process, ``auto_trace: {on: step}`` (tests/test_auto_trace.py).

``auto_trace_step.py OUT``: 150 steps of ~30 ms (+-30%), 3x slower from step 100, under metrics
(any free port), ``on_demand: {dir: OUT/od}`` and ``auto_trace`` (``peers: 1``, with no other
rank to ask). After the loop it scrapes its own ``/metrics`` into ``OUT/metrics.txt``.
``auto_trace_step.py OUT bytes``: ~20 ms steps, 3x slower from step 60 and 9x from step 120,
with ``max_bytes: 1`` and no cooldown: the second slowdown finds the budget spent.
"""

import random
import sys
import time
import urllib.request
from pathlib import Path

import torchstep_prof as tsp
import torchstep_prof.region_metrics as region_metrics

out = Path(sys.argv[1])
by_bytes = sys.argv[2:3] == ["bytes"]
random.seed(7)
if by_bytes:
    steps, watch = 150, {"min_ms": 20, "baseline_steps": 20, "cooldown_steps": 0, "max_bytes": 1}

    def pace(n: int) -> float:
        return 0.02 * (9 if n >= 120 else 3 if n >= 60 else 1)
else:
    steps, watch = 150, {"min_ms": 20, "baseline_steps": 30}

    def pace(n: int) -> float:
        return 0.03 * (3 if n >= 100 else 1)


with tsp.configure(save_path=str(out / "traces")), tsp.metrics(port=0, addr="127.0.0.1"):
    with tsp.on_demand(str(out / "od"), poll_s=0.2), tsp.auto_trace(**watch):
        for n in range(steps):
            with tsp.step(n):
                time.sleep(pace(n) * random.uniform(0.7, 1.3))
        tsp.flush()
        time.sleep(1.2)  # a fold of the metrics after the last step: the last-step gauge
        addr, port = region_metrics.endpoint()
        with urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=30) as response:
            (out / "metrics.txt").write_bytes(response.read())
        (out / "time.txt").write_text(str(time.time()))
