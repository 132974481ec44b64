"""A small DDP training job (gloo backend, CPU) profiled with torchstep_prof on two ranks.

Run it with torchrun (a few seconds on 2 CPU cores):

    torchrun --nproc_per_node=2 examples/ddp_torchrun.py                # discrete traces
    torchrun --nproc_per_node=2 examples/ddp_torchrun.py --fused        # one trace per step
    torchrun --nproc_per_node=2 examples/ddp_torchrun.py --save-path /tmp/ddp --steps 8

Steps 2 and 3 are profiled on ranks 0 and 1. In discrete mode each rank writes one trace per
region and step (``trainer_forward``, ``trainer_backward``, ``trainer_optimizer-step``); with
``--fused`` one ``trainer_train`` trace per step. DDP's gradient all-reduce runs inside
``backward``, so the backward traces show the gloo collectives. When step 3 ends, each profiled
rank runs the finish hook, which only lists the folder (replace it with your upload command).
Then compare the ranks:

    torchstep-prof summarize outputs/profile_ddp
    torchstep-prof merge outputs/profile_ddp --step 3 -o ddp_step3.json
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torchstep_prof as tsp

FEATURES, HIDDEN, BATCH = 64, 256, 32
PROFILED_STEPS = (2, 3)

# Labels reach the hook through its environment, never through the command text.
LIST_TRACES = 'echo "traces in $TORCHSTEP_PROF_SAVE_PATH:"; ls -1 "$TORCHSTEP_PROF_SAVE_PATH"'


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
    )


@tsp.profiled(role="trainer")
def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train(steps: int) -> float:
    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    generator = torch.Generator().manual_seed(1234 + dist.get_rank())  # each rank its own shard
    loss = torch.zeros(())
    for n in range(1, steps + 1):
        inputs = torch.randn(BATCH, FEATURES, generator=generator)
        targets = inputs.sum(dim=1, keepdim=True)
        with tsp.step(n):
            with tsp.profile_region("trainer", "forward"):
                loss = nn.functional.mse_loss(model(inputs), targets)
            with tsp.profile_region("trainer", "backward"):
                loss.backward()  # DDP all-reduces the gradients here
            optimizer_step(optimizer)
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-path", default="outputs/profile_ddp", help="where the traces go")
    parser.add_argument("--steps", type=int, default=5, help="training steps to run (default 5)")
    parser.add_argument("--fused", action="store_true", help="one trace per profiled step")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR/PORT
    try:
        with tsp.configure(save_path=args.save_path, discrete=not args.fused), tsp.schedule(
            steps=PROFILED_STEPS
        ), tsp.ranks(0, 1), tsp.on_finish(LIST_TRACES, timeout_s=60):
            final_loss = train(args.steps)
        print(f"rank {dist.get_rank()}: {args.steps} steps done, final loss {final_loss:.4f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
