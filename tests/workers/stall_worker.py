"""A job one rank of which hangs (tests/test_stall.py); run under ``torchrun --nproc_per_node=2``.

``stall_worker.py DIR AFTER_S POLL_S HANG_STEP``: steps of ~20 ms under ``tsp.stall(DIR,
after_s=AFTER_S, poll_s=POLL_S, cmd=...)``; each step runs ``actor/update`` then all-reduces. At
``HANG_STEP`` rank 1 never leaves ``actor/update`` (``update_policy`` sleeps), so rank 0 waits in
that step's all_reduce. The stall command writes ``DIR/cmd-rank<R>.txt``: the stall file it was
handed and the step. The test kills the job.
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

import torchstep_prof as tsp

folder, after_s, poll_s, hang_step = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
rank = dist.get_rank()
CMD = [sys.executable, "-c", (
    "import os; e = os.environ; "
    f"open({folder!r} + '/cmd-rank' + e['TORCHSTEP_PROF_RANK'] + '.txt', 'w')"
    ".write(e['TORCHSTEP_PROF_STALL_FILE'] + ' ' + e['TORCHSTEP_PROF_STALL_STEP'])"
)]  # fmt: skip


def update_policy() -> None:
    time.sleep(3600)  # the hang: the test kills the job long before


def train_step(n: int, grads: torch.Tensor) -> None:
    with tsp.profile_region("actor", "update"):
        if rank == 1 and n == hang_step:
            update_policy()
        grads += 1
        time.sleep(0.02)
    dist.all_reduce(grads)


with tsp.stall(folder, after_s=after_s, poll_s=poll_s, cmd=CMD, timeout_s=60):
    grads = torch.zeros(4)
    for n in range(1, hang_step + 1):
        with tsp.step(n):
            train_step(n, grads)
