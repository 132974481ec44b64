"""Worker of tests/test_report_timeline.py: a 2-rank gloo job that writes traces and span files
under one folder (traces in OUT, spans in OUT/spans), with actor and ref in each rank and one
rank's ref slower by EXTRA_S each step; clock anchors after ref and at each step's end.

    torchrun --nproc_per_node=2 gantt_worker.py OUT STEPS SLOW_RANK EXTRA_S
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import torchstep_prof as tsp


def main() -> None:
    out, steps, slow_rank, extra_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(32, 32)
    with (
        tsp.configure(summary=False, save_path=out),
        tsp.schedule(steps=range(1, steps)),
        tsp.ranks(all_ranks=True),
        tsp.spans(os.path.join(out, "spans")),
    ):
        for n in range(steps):
            with tsp.step(n):
                with tsp.profile_region("actor", "update"):
                    x = (x @ x).clamp(max=1.0)
                    time.sleep(0.02)
                with tsp.profile_region("ref", "compute_log_prob"):
                    time.sleep(0.02 + (extra_s if rank == slow_rank else 0.0))
                tsp.clock_anchor("after_ref")  # the fast rank waits here for the slow one
                with tsp.profile_region("actor", "sync"):
                    dist.all_reduce(x)
                tsp.clock_anchor()  # both arrive together: a tight anchor
    dist.destroy_process_group()
    print(f"rank {rank}: {steps} steps", flush=True)


if __name__ == "__main__":
    main()
