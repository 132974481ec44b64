"""A tiny RL-style training loop (rollout, actor, reference, critic) profiled with torchstep_prof.

Run it on a CPU in a few seconds:

    python examples/rl_step.py                 # discrete: one trace per region of steps 2 and 3
    python examples/rl_step.py --fused         # fused: one trace per profiled step
    python examples/rl_step.py --gzip --save-path /tmp/prof

Then look at the traces:

    torchstep-prof ls outputs/profile
    torchstep-prof summarize outputs/profile

Every model here is a small real torch module: the traces hold real ``aten::`` operators.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import torchstep_prof as tsp

VOCAB, HIDDEN, SEQ, BATCH = 64, 64, 16, 8


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.body = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)))


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.value = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)

    @tsp.profiled(role="critic")
    def update(self, tokens: torch.Tensor, returns: torch.Tensor) -> float:
        loss = (self.value(tokens).squeeze(-1) - returns).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def log_prob(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


@torch.no_grad()
def generate(policy: Policy, prompts: torch.Tensor) -> torch.Tensor:
    tokens = prompts
    for _ in range(SEQ - prompts.shape[1]):
        next_logits = policy(tokens)[:, -1]
        tokens = torch.cat([tokens, torch.multinomial(torch.softmax(next_logits, -1), 1)], dim=1)
    return tokens


def train(steps: int) -> None:
    torch.manual_seed(0)
    actor, reference, critic = Policy(), Policy(), Critic()
    reference.load_state_dict(actor.state_dict())
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-3)
    for n in range(1, steps + 1):
        with tsp.step(n):
            with tsp.profile_region("rollout", "generate"):
                tokens = generate(actor, torch.randint(0, VOCAB, (BATCH, 4)))
            with tsp.profile_region("actor", "compute_log_prob"), torch.no_grad():
                old_log_prob = log_prob(actor, tokens)
            with tsp.profile_region("ref", "compute_log_prob"), torch.no_grad():
                ref_log_prob = log_prob(reference, tokens)
            rewards = (tokens[:, 1:] % 7 == 0).float() - 0.01 * (old_log_prob - ref_log_prob)
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
            critic.update(tokens[:, :-1], returns)
            with tsp.profile_region("actor", "update"):
                for mini_batch in tokens.split(BATCH // 2):
                    ratio = torch.exp(log_prob(actor, mini_batch) - old_log_prob[: len(mini_batch)])
                    loss = -(ratio * returns[: len(mini_batch)]).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        print(f"step {n}: critic and actor updated, loss {loss.item():+.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps to run (default 4)")
    parser.add_argument("--profile-steps", type=int, nargs="+", default=[2, 3], help="steps to profile (default 2 3)")
    parser.add_argument("--save-path", default="outputs/profile", help="where traces go (default outputs/profile)")
    parser.add_argument("--fused", action="store_true", help="one trace per step instead of one per region")
    parser.add_argument("--gzip", action="store_true", help="write .json.gz traces, compressed off the training thread")
    args = parser.parse_args()

    with tsp.schedule(steps=args.profile_steps), tsp.ranks(0), tsp.contents("cpu", "shapes"), tsp.configure(
        save_path=args.save_path, discrete=not args.fused, gzip=args.gzip
    ):
        train(args.steps)
    written = [t.path for t in tsp.records().traces if t.ok]
    print(f"{len(written)} trace(s) in {args.save_path}; open one in https://ui.perfetto.dev")


if __name__ == "__main__":
    main()
