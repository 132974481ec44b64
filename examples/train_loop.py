"""A nanoGPT-style training loop profiled with ``tsp.begin_step``: one added line, nothing re-indented.

Run it on a CPU in a few seconds:

    python examples/train_loop.py                        # profiles iterations 0 and 2
    python examples/train_loop.py --profile-steps 1 3 --save-path /tmp/prof

The loop counts ``iter_num`` from 0, as nanoGPT (and torch.profiler) do, and accumulates
gradients over two micro-batches per iteration. Each micro-batch's forward and backward is a
region, so a profiled iteration writes two ``trainer_forward`` traces: occurrence 1 and 2 in
their metadata (``torchstep_prof.occurrence``), kept apart by the command line:

    torchstep-prof ls outputs/profile
    torchstep-prof summarize outputs/profile

``tsp.begin_step(iter_num)`` ends the previous iteration's step, so the loop never calls
``end_step``: the last step ends with the ``schedule`` scope (also when an exception leaves the
loop), or at interpreter exit.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

import torchstep_prof as tsp

VOCAB, BLOCK, EMBED, HEADS = 65, 32, 64, 4  # a character-level model, as nanoGPT's shakespeare_char


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBED)
        self.attn = nn.MultiheadAttention(EMBED, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(EMBED)
        self.mlp = nn.Sequential(nn.Linear(EMBED, 4 * EMBED), nn.GELU(), nn.Linear(4 * EMBED, EMBED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, EMBED)
        self.wpe = nn.Embedding(BLOCK, EMBED)
        self.blocks = nn.Sequential(*(Block() for _ in range(layers)))
        self.ln_f = nn.LayerNorm(EMBED)
        self.lm_head = nn.Linear(EMBED, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(idx.shape[1])
        logits = self.lm_head(self.ln_f(self.blocks(self.wte(idx) + self.wpe(positions))))
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def get_batch(data: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(len(data) - BLOCK, (batch_size,))
    x = torch.stack([data[i : i + BLOCK] for i in starts])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in starts])
    return x, y


def train(max_iters: int, batch_size: int = 8, gradient_accumulation_steps: int = 2) -> None:
    torch.manual_seed(1337)
    data = torch.randint(0, VOCAB, (20_000,))  # the corpus, made in memory
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    iter_num = 0
    while True:
        tsp.begin_step(iter_num)  # the one added line: ends the previous step, begins this one
        for _micro_step in range(gradient_accumulation_steps):
            X, Y = get_batch(data, batch_size)
            with tsp.profile_region("trainer", "forward"):  # occurrence 1, then 2, of this step
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            with tsp.profile_region("trainer", "backward"):
                loss.backward()
        with tsp.profile_region("trainer", "optimizer_step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}")
        iter_num += 1
        if iter_num > max_iters:
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-iters", type=int, default=3, help="the last iteration (default 3: runs 0..3)")
    parser.add_argument("--profile-steps", type=int, nargs="+", default=[0, 2], help="iterations to profile (default 0 2)")
    parser.add_argument("--save-path", default="outputs/profile", help="where traces go (default outputs/profile)")
    args = parser.parse_args()

    with tsp.schedule(steps=args.profile_steps), tsp.contents("cpu", "shapes"), tsp.configure(save_path=args.save_path):
        train(args.max_iters)
    written = [t.path for t in tsp.records().traces if t.ok]
    print(f"{len(written)} trace(s) in {args.save_path}; open one in https://ui.perfetto.dev")


if __name__ == "__main__":
    main()
