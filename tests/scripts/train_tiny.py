"""A tiny training script that knows nothing of torchstep_prof (profiled by `torchstep-prof run`).

    python train_tiny.py --steps 4 [--exit-code N | --exit-message TEXT | --raise TEXT]
                         [--report FILE] [--no-optimizer] [--accumulate K] [--dist] [--eval-after]

``--report FILE`` writes what the interpreter gave the script (argv, __file__, sys.path[0], ...)
as JSON: the tests compare it with a plain ``python`` run.
"""

import argparse
import json
import sys

import torch


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))

    def forward(self, x):
        return self.body(x)


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.out(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = Head()

    def forward(self, x):
        return self.head(self.encoder(x))


def fail(message):
    raise RuntimeError(message)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--exit-message")
    parser.add_argument("--raise", dest="raise_message")
    parser.add_argument("--report")
    parser.add_argument("--touch")
    parser.add_argument("--no-optimizer", action="store_true")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--dist", action="store_true")
    parser.add_argument("--eval-after", action="store_true", help="one forward after training")
    args = parser.parse_args()
    if args.touch:
        open(args.touch, "w").close()
    if args.report:
        with open(args.report, "w") as handle:
            json.dump(
                {
                    "argv": sys.argv,
                    "file": __file__,
                    "name": __name__,
                    "spec": None if __spec__ is None else __spec__.name,
                    "path0": sys.path[0],
                    "main_is_me": sys.modules["__main__"].__dict__ is globals(),
                    "cached": globals().get("__cached__", "<absent>"),
                    "dunders": sorted(name for name in globals() if name.startswith("__")),
                },
                handle,
            )
    if args.dist:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    if args.dist:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    for _ in range(args.steps):
        for _ in range(args.accumulate):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        if not args.no_optimizer:
            opt.step()
            opt.zero_grad()
    if args.eval_after:
        with torch.no_grad():
            model(x)
    if args.dist:
        torch.distributed.destroy_process_group()
    if args.raise_message:
        fail(args.raise_message)
    if args.exit_message:
        sys.exit(args.exit_message)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
