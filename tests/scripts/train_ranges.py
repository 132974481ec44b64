"""A training script that knows nothing of torchstep_prof, with its own ranges around each
iteration (profiled by `torchstep-prof run` in tests/test_run_steps.py).

    python train_ranges.py --iters 5 [--update sgd|lbfgs|manual|function] [--penalty] [--dist]
                           [--epoch-range]

Iteration i (from 1) runs inside ``record_function("script/iter<i>")``: the batch from a
DataLoader, zero_grad, forward, backward and the update. The model is built inside
``record_function("script/setup")``. ``--update function`` updates by hand in the module-level
``sgd_update``; ``manual`` updates inline; ``--penalty`` adds a gradient penalty computed with
``torch.autograd.grad(create_graph=True)`` (double backward). ``--epoch-range`` runs the whole
loop inside ``record_function("script/epoch")``.
"""

import argparse
import contextlib

import torch
from torch.profiler import record_function


def sgd_update(params, lr):
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)
            p.grad = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--update", default="sgd", choices=["sgd", "lbfgs", "manual", "function"])
    parser.add_argument("--penalty", action="store_true")
    parser.add_argument("--dist", action="store_true")
    parser.add_argument("--epoch-range", action="store_true")
    args = parser.parse_args()
    if args.dist:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    with record_function("script/setup"):
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        if args.dist:
            model = torch.nn.parallel.DistributedDataParallel(model)
        data = torch.utils.data.TensorDataset(torch.randn(8 * args.iters, 16), torch.randn(8 * args.iters, 1))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
    params = list(model.parameters())
    opt = None
    if args.update == "sgd":
        opt = torch.optim.SGD(params, lr=0.01)
    elif args.update == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=0.1, max_iter=3)
    batches = iter(loader)
    epoch = record_function("script/epoch") if args.epoch_range else contextlib.nullcontext()
    with epoch:
        loop(args, model, params, opt, batches)
    if args.dist:
        torch.distributed.destroy_process_group()


def loop(args, model, params, opt, batches) -> None:
    for i in range(1, args.iters + 1):
        with record_function(f"script/iter{i}"):
            x, y = next(batches)
            if opt is not None:
                opt.zero_grad()
            if args.update == "lbfgs":

                def closure():  # called by this iteration's opt.step: its x, y are the ones meant
                    opt.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(x), y)  # noqa: B023
                    loss.backward()
                    return loss

                opt.step(closure)
                continue
            if args.penalty:
                x.requires_grad_(True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if args.penalty:
                (grad_x,) = torch.autograd.grad(loss, x, create_graph=True)
                loss = loss + grad_x.pow(2).sum()
            loss.backward()
            if opt is not None:
                opt.step()
            elif args.update == "manual":
                with torch.no_grad():
                    for p in params:
                        p.add_(p.grad, alpha=-0.01)
                        p.grad = None
            else:
                sgd_update(params, 0.01)


if __name__ == "__main__":
    main()
