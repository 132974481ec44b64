"""Four ranks as two simulated nodes (tests/test_distributed.py).

Started as four plain processes with ``RANK``, ``WORLD_SIZE=4``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE=2`` and ``GROUP_RANK`` (the node) set per process, as torchrun would on two
hosts. ``node_worker.py OUT``:

- ``ranks_0_2``: steps {1,3} of 4 on ranks [0, 2];
- ``straggler``: steps {1,2} on every rank; rank 2 sleeps 0.3 s inside each of its regions (the
  all-reduce is outside the region, so the other ranks' regions do not wait for it);
- ``per_node``: steps {1,2} on every rank, a ``per_node`` finish hook; each node writes into its
  own ``OUT/per_node/save_node<g>`` (its local disk), and local rank 1 of each node sleeps 1.5 s
  inside its step-2 region, so it finishes well after its node's uploader.
"""

import os
import sys
import time
from pathlib import Path

import torch

import torchstep_prof as tsp
from _common import all_reduce, hook_command, init_group, write_result

out = Path(sys.argv[1])
rank, world = init_group()
local_rank, node = int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"])
x = torch.randn(32, 32)


def train(steps: int, slow_step: int = 0) -> None:
    for n in range(1, steps + 1):
        with tsp.step(n):
            with tsp.profile_region("learner", "update"):
                y = torch.tanh(x @ x)
                all_reduce(y)
                if local_rank == 1 and n == slow_step:
                    time.sleep(1.5)


with tsp.configure(save_path=str(out / "ranks_0_2")), tsp.schedule(steps=[1, 3]), tsp.ranks(0, 2):
    train(4)

with tsp.configure(save_path=str(out / "straggler")), tsp.schedule(steps=[1, 2]), tsp.ranks(all_ranks=True):
    for n in (1, 2):
        with tsp.step(n):
            all_reduce(torch.tanh(x @ x))
            with tsp.profile_region("actor", "compute_log_prob"):
                torch.tanh(x @ x)
                if rank == 2:
                    time.sleep(0.3)

with tsp.configure(save_path=str(out / "per_node" / f"save_node{node}")), tsp.schedule(steps=[1, 2]), \
        tsp.ranks(all_ranks=True), \
        tsp.on_finish(hook_command(out / "per_node"), per_node=True, node_wait_s=60, timeout_s=60):
    train(2, slow_step=2)

write_result(out, rank, {"world": world, "local_rank": local_rank, "node": node})
