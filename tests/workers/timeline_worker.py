"""Worker of tests/test_timeline.py and tests/test_report_timeline.py: two roles colocated in each rank (actor and ref), one rank's
ref slower by EXTRA_S each step, clock anchors after ref and at each step's end.

    torchrun --nproc_per_node=2 timeline_worker.py SPANS_DIR STEPS SLOW_RANK EXTRA_S [TRACE_DIR STEP...]

SPANS_DIR ``-``: no span log. With TRACE_DIR, the steps named after it are traced there.
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch
import torch.distributed as dist

import torchstep_prof as tsp


def main() -> None:
    spans_dir, steps, slow_rank, extra_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    trace_dir, traced = (sys.argv[5], [int(n) for n in sys.argv[6:]]) if len(sys.argv) > 5 else (None, [])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(32, 32)
    with contextlib.ExitStack() as scopes:
        scopes.enter_context(tsp.configure(summary=False))
        if trace_dir is not None:
            scopes.enter_context(tsp.configure(save_path=trace_dir))
            scopes.enter_context(tsp.schedule(steps=traced))
            scopes.enter_context(tsp.ranks(all_ranks=True))
        if spans_dir != "-":
            scopes.enter_context(tsp.spans(spans_dir))
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
