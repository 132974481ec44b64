"""Worker of tests/test_metrics_prometheus.py: 20 steps under the config file named by
TORCHSTEP_PROF_CONFIG (metrics on), then alive until the test lets it go (a final scrape)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import init_group  # noqa: E402

import torchstep_prof as tsp  # noqa: E402

STEPS = 20


def main() -> None:
    out = Path(sys.argv[1])
    rank, world = init_group()
    x = torch.ones(64, 64)
    for n in range(1, STEPS + 1):
        with tsp.step(n):
            with tsp.profile_region("actor", "update"):
                with tsp.profile_region("actor", "inner"):
                    x = (x @ x).clamp(max=1.0)
            with tsp.profile_region("critic", "update"):
                pass
    tsp.flush()
    (out / f"rank{rank}.done").write_text("done")
    deadline = time.monotonic() + 150
    while not (out / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"rank {rank} of {world}: {STEPS} steps done", flush=True)


if __name__ == "__main__":
    main()
