"""Which ranks profile (tests/test_distributed.py); run under ``torchrun --nproc_per_node=2``.

``selection_worker.py OUT``: four phases, each writing into ``OUT/<phase>/``, then
``OUT/result_rank<r>.json``. Every step all-reduces, so the ranks really run as one job.

- ``rank0``: steps {1,3} of 4 on ranks [0];
- ``all``: steps {1,3} of 4 on every rank;
- ``rank7``: steps {1,3} of 4 on rank [7], which does not exist;
- ``no_barrier``: step 1 on rank [1] with a finish hook; rank 1 sleeps 3 s inside its profiled
  region while rank 0, not profiled, is already in the next all-reduce (the group's timeout is
  20 s: a barrier added by the toolkit would make rank 0's collective fail or hang).
"""

import sys
import time
from pathlib import Path

import torch

import torchstep_prof as tsp
from _common import all_reduce, hook_command, init_group, write_result

out = Path(sys.argv[1])
rank, world = init_group(timeout_s=20)
x = torch.randn(32, 32)


def train(steps: int, sleep_on_rank: int = -1) -> None:
    for n in range(1, steps + 1):
        with tsp.step(n):
            with tsp.profile_region("actor", "forward"):
                y = torch.tanh(x @ x)
                if rank == sleep_on_rank:
                    time.sleep(3)
                all_reduce(y)


with tsp.configure(save_path=str(out / "rank0")), tsp.schedule(steps=[1, 3]), tsp.ranks(0):
    train(4)
with tsp.configure(save_path=str(out / "all")), tsp.schedule(steps=[1, 3]), tsp.ranks(all_ranks=True):
    train(4)
with tsp.configure(save_path=str(out / "rank7")), tsp.schedule(steps=[1, 3]), tsp.ranks(7):
    train(4)
with tsp.configure(save_path=str(out / "no_barrier" / "save")), tsp.schedule(steps=[1]), tsp.ranks(1), \
        tsp.on_finish(hook_command(out / "no_barrier"), timeout_s=60):
    train(3, sleep_on_rank=1)

write_result(out, rank, {"world": world})
