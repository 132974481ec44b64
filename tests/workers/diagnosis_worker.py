"""A 2-rank gloo job for tests/test_diagnosis.py: profiled steps of matmuls and all-reduces.

    python -m torch.distributed.run --nproc_per_node=2 diagnosis_worker.py OUT \
        [--sleep-rank R --sleep-ms MS] [--matmuls N --size S] [--keep-mib MIB]

Each profiled step runs a ``trainer/forward`` region (``--matmuls`` matmuls of ``--size`` square matrices, then, on
``--sleep-rank``, a sleep of ``--sleep-ms`` and ``--extra-matmuls`` more matmuls before each of
``--allreduces`` all-reduces), and with
``--keep-mib`` a ``trainer/keep`` region that keeps a tensor of that size alive past the region
and a ``trainer/temp`` region that only makes temporaries of that size.
"""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist

import torchstep_prof as tsp

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--sleep-rank", type=int, default=-1)
parser.add_argument("--sleep-ms", type=float, default=0.0)
parser.add_argument("--matmuls", type=int, default=4)
parser.add_argument("--size", type=int, default=64)
parser.add_argument("--extra-matmuls", type=int, default=0)
parser.add_argument("--fused", action="store_true", help="one trace per step (discrete=False)")
parser.add_argument("--keep-mib", type=int, default=0)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--allreduces", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
torch.manual_seed(0)
a = torch.randn(args.size, args.size)
grad = torch.ones(1024)
kept = []
contents = ("cpu", "memory") if args.keep_mib else ("cpu",)

with tsp.schedule(steps=range(1, args.steps + 1)), tsp.ranks(all_ranks=True), tsp.contents(
    *contents
), tsp.configure(save_path=args.out, discrete=not args.fused):
    for n in range(0, args.steps + 1):
        with tsp.step(n):
            # Ranks enter the region together: the profiler's start-up before a rank's first
            # region differs between ranks and would add to the first collective's wait.
            dist.barrier()
            with tsp.profile_region("trainer", "forward"):
                for _ in range(args.matmuls):
                    torch.mm(a, a)
                for _ in range(args.allreduces):
                    if rank == args.sleep_rank:
                        time.sleep(args.sleep_ms / 1000.0)
                        for _ in range(args.extra_matmuls):
                            torch.mm(a, a)
                    dist.all_reduce(grad)
            if args.keep_mib:
                elements = args.keep_mib * 1024 * 1024 // 4
                with tsp.profile_region("trainer", "keep"):
                    kept.append(torch.ones(elements))
                with tsp.profile_region("trainer", "temp"):
                    torch.ones(elements).add_(1.0).sum()
dist.destroy_process_group()
