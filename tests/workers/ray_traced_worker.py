"""Worker of tests/test_timeline_ray_traces.py: a Ray job profiled with traces only, no span log.

A driver (the trainer) calls a scorer actor each step through ``torchstep_prof.integrations.ray``
(``submit``, ``get``, ``@anchored``), then updates; both trace steps 1-3 into OUT.

    python ray_traced_worker.py OUT STEPS
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import ray
import torch

import torchstep_prof as tsp
from torchstep_prof.integrations import ray as tsp_ray

TRACED = [1, 2, 3]


def _profiled(out: str, role: str) -> contextlib.ExitStack:
    scopes = contextlib.ExitStack()
    scopes.enter_context(tsp.configure(save_path=out, process_role=role, summary=False))
    scopes.enter_context(tsp.schedule(steps=TRACED))
    return scopes


@ray.remote(num_cpus=1)
class Scorer:
    def __init__(self, out: str) -> None:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        torch.set_num_threads(1)
        self.scopes = _profiled(out, "reward")

    @tsp_ray.anchored  # its run, against the driver's submit and get, aligns this actor's clock
    def score(self, n: int) -> float:
        with tsp.step(n), tsp.profile_region("reward", "score"):
            time.sleep(0.05)
            return float(torch.ones(8, 8).sum())

    def close(self) -> int:
        self.scopes.close()
        tsp.flush()
        return os.getpid()


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=True)
    try:
        scorer = Scorer.remote(out)  # type: ignore[attr-defined]
        with _profiled(out, "trainer"):
            for n in range(steps):
                with tsp.step(n):
                    tsp_ray.get(tsp_ray.submit(scorer.score, n))  # idle: waiting for reward/score
                    with tsp.profile_region("actor", "update"):
                        time.sleep(0.2)
        tsp.flush()
        print("scorer pid", ray.get(scorer.close.remote()), "driver pid", os.getpid(), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
