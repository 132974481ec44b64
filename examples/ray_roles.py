"""Rollout, actor and critic workers as Ray actors, each profiling its own role's regions.

Every worker is told its place in the job through RANK / WORLD_SIZE / LOCAL_RANK /
LOCAL_WORLD_SIZE, set in its environment before anything reads them (here in ``__init__``;
``Worker.options(runtime_env={"env_vars": {...}})`` works as well, as verl does it, but then
Ray cannot reuse the worker processes it started ahead): torchstep_prof reads them like
torchrun's, so traces are named by role and rank, and a per-node finish hook runs once, on local
rank 0, after every worker of the node has finished profiling (its output goes to a file the
driver prints at the end: Ray keeps a worker's own output in its log files). A local cluster, CPU
only:

    python examples/ray_roles.py                             # steps 2 and 3 of 4, into outputs/profile
    python examples/ray_roles.py --save-path /tmp/prof --on-finish 'ls "$TORCHSTEP_PROF_SAVE_PATH"'
    python examples/ray_roles.py --unranked                  # one more worker without rank variables:
                                                             # it warns once, naming the fix

Then: ``torchstep-prof ls outputs/profile``.

``--timeline DIR`` runs a small asynchronous RL loop instead, every process logging its spans
(``tsp.spans``) into DIR: two rollout replicas (the second slower by ``--slow-s``: the long
tail), a reference actor, and a 2-rank trainer (gloo) whose ranks each wait on a replica and on
the reference with ``ray.get`` (through ``torchstep_prof.integrations.ray``, whose calls align
the actors' clocks with the trainer's), then update and all-reduce. It prints what
``torchstep-prof timeline DIR`` says about it (docs/timeline.md):

    python examples/ray_roles.py --timeline /tmp/spans --steps 4
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import tempfile
import time
from typing import Any, Optional

import ray
import torch
from torch import nn

import torchstep_prof as tsp
from torchstep_prof.integrations import ray as tsp_ray

VOCAB, HIDDEN, SEQ, BATCH = 64, 32, 12, 8
# Workers per role, numbered in this order: rank 0, the node's uploader, is an actor worker.
ROLES = {"actor": 2, "critic": 1, "rollout": 1}


@ray.remote(num_cpus=1)
class Worker:
    """One role's worker: a tiny real model, its regions, and the scopes it profiles under.

    The scopes stay entered across the driver's calls (Ray runs a threaded actor's calls in one
    context), so the finish hook's scope covers every step; ``finish()`` closes them.
    """

    def __init__(
        self, role: str, rank_env: dict[str, str], save_path: str, steps: list[int], on_finish: Optional[str]
    ) -> None:
        os.environ.update(rank_env)  # first: torchstep_prof reads the rank once, when it first needs it
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.role = role
        self.model = nn.Sequential(
            nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, VOCAB)
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scopes = contextlib.ExitStack()
        self.scopes.enter_context(tsp.schedule(steps=steps))
        self.scopes.enter_context(tsp.ranks(all_ranks=True))
        self.scopes.enter_context(tsp.configure(save_path=save_path))
        if on_finish is not None:
            # wait=True: the node's upload is over when the driver's last step call returns (the
            # driver then shuts Ray down, which kills the workers and any hook still running).
            # The uploader's step waits for its node-mates, so it must not be one the driver
            # awaits before the others run theirs: here it runs beside them, in the last phase.
            self.scopes.enter_context(tsp.on_finish(on_finish, per_node=True, node_wait_s=120, wait=True))

    def step(self, n: int, tokens: Optional[torch.Tensor]) -> torch.Tensor:
        with tsp.step(n):
            if self.role == "rollout":
                with tsp.profile_region("rollout", "generate"), torch.no_grad():
                    tokens = torch.randint(0, VOCAB, (BATCH, 4))
                    while tokens.shape[1] < SEQ:
                        probs = torch.softmax(self.model(tokens)[:, -1], -1)
                        tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
                return tokens
            assert tokens is not None
            with tsp.profile_region(self.role, "forward"), torch.no_grad():
                self.model(tokens)
            with tsp.profile_region(self.role, "update"):
                logits = self.model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            return tokens

    def finish(self) -> list[str]:
        """Close the scopes and list the traces this worker wrote."""
        self.scopes.close()
        return [t.path for t in tsp.records().traces if t.ok]


@ray.remote(num_cpus=1)
class Rollout:
    """A rollout replica: generates a batch of tokens per step (``slow_s`` more for the long tail)."""

    def __init__(self, rank_env: dict[str, str], spans_dir: str, slow_s: float) -> None:
        os.environ.update(rank_env)
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB))
        self.slow_s = slow_s
        self.scopes = contextlib.ExitStack()
        self.scopes.enter_context(tsp.configure(process_role="rollout", summary=False))
        self.scopes.enter_context(tsp.spans(spans_dir))

    @tsp_ray.anchored  # its run, against the trainer's submit and get, aligns this actor's clock
    def generate(self, n: int) -> torch.Tensor:
        with tsp.step(n), tsp.profile_region("rollout", "generate"), torch.no_grad():
            tokens = torch.randint(0, VOCAB, (BATCH, 4))
            while tokens.shape[1] < SEQ:
                probs = torch.softmax(self.model(tokens)[:, -1], -1)
                tokens = torch.cat([tokens, torch.multinomial(probs, 1)], dim=1)
            time.sleep(0.2 + self.slow_s)  # a longer decode: the tail the timeline should find
            return tokens

    def close(self) -> None:
        self.scopes.close()
        tsp.flush()  # every span on disk: ray.shutdown kills the process, with no exit work


@ray.remote(num_cpus=1)
class Reference:
    """The reference policy: log-probabilities of a batch, for each trainer rank in turn."""

    def __init__(self, spans_dir: str) -> None:
        os.environ.update(rank_variables(0, 1))  # one reference actor: rank 0 of 1
        torch.set_num_threads(1)
        self.model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB))
        self.scopes = contextlib.ExitStack()
        self.scopes.enter_context(tsp.configure(process_role="ref", summary=False))
        self.scopes.enter_context(tsp.spans(spans_dir))

    @tsp_ray.anchored
    def compute_log_prob(self, n: int, tokens: torch.Tensor) -> torch.Tensor:
        with tsp.step(n), tsp.profile_region("ref", "compute_log_prob"), torch.no_grad():
            time.sleep(0.05)
            return torch.log_softmax(self.model(tokens), -1).amax(-1)

    def close(self) -> None:
        self.scopes.close()
        tsp.flush()


@ray.remote(num_cpus=1)
class Trainer:
    """One rank of a 2-rank gloo trainer: waits on its rollout replica and the reference with
    ``ray.get`` (that wait is its idle time), updates, all-reduces, and passes a clock anchor
    (aligning the two ranks; its Ray calls align the actors it calls)."""

    def __init__(self, rank: int, world_size: int, port: int, spans_dir: str) -> None:
        import torch.distributed as dist

        torch.manual_seed(0)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
        self.rank = rank
        self.model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, VOCAB))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.scopes = contextlib.ExitStack()
        self.scopes.enter_context(tsp.configure(process_role="trainer", summary=False))
        self.scopes.enter_context(tsp.spans(spans_dir))

    def step(self, n: int, rollouts: list[Any], reference: Any) -> None:
        import torch.distributed as dist

        with tsp.step(n):
            # ray.get(actor.method.remote(...)), each call's submission and return noted: the
            # anchors that align the rollout and reference actors' clocks with this one's.
            tokens = tsp_ray.get(tsp_ray.submit(rollouts[self.rank].generate, n))  # idle: waiting for rollout/generate
            tsp_ray.get(tsp_ray.submit(reference.compute_log_prob, n, tokens))  # idle: waiting for ref/compute_log_prob
            with tsp.profile_region("actor", "update"):
                logits = self.model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
            for p in self.model.parameters():
                dist.all_reduce(p.data)  # outside any region: the faster rank's wait shows as idle
            tsp.clock_anchor()  # a barrier whose entry and exit align the two ranks' clocks

    def close(self) -> None:
        import torch.distributed as dist

        self.scopes.close()
        tsp.flush()
        dist.destroy_process_group()


def run_timeline(args: argparse.Namespace) -> None:
    """The asynchronous RL loop, each process logging spans into ``args.timeline``."""
    import socket
    import subprocess
    import sys

    spans_dir = os.path.abspath(args.timeline)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=6, include_dashboard=False, configure_logging=False, log_to_driver=True)
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        rollouts = [Rollout.remote(rank_variables(i, 2), spans_dir, args.slow_s if i == 1 else 0.0) for i in range(2)]  # type: ignore[attr-defined]
        reference = Reference.remote(spans_dir)  # type: ignore[attr-defined]
        trainers = [Trainer.remote(r, 2, port, spans_dir) for r in range(2)]  # type: ignore[attr-defined]
        for n in range(1, args.steps + 1):
            ray.get([t.step.remote(n, rollouts, reference) for t in trainers])
            print(f"step {n} done")
        ray.get([a.close.remote() for a in [*trainers, *rollouts, reference]])
    finally:
        ray.shutdown()  # kills the actors' processes, nothing runs at their exit: close() flushed their spans
    subprocess.run([sys.executable, "-m", "torchstep_prof", "timeline", spans_dir], check=False)


def rank_variables(rank: int, world_size: int) -> dict[str, str]:
    # One node: local ranks are the global ones. On several nodes, number LOCAL_RANK within
    # each node and give LOCAL_WORLD_SIZE the node's worker count, as torchrun does.
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
    }


def logged(cmd: str, log: str) -> str:
    """``cmd`` with its output, after a line naming the rank it ran on, appended to ``log``."""
    # The newline before "}": a command ending in a comment or "&" still closes the group.
    return f'{{ echo "finish hook ran on rank $TORCHSTEP_PROF_RANK:"; {cmd}\n}} >> {shlex.quote(log)} 2>&1'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps the driver runs (default 4)")
    parser.add_argument("--profile-steps", type=int, nargs="+", default=[2, 3], help="steps to profile (default 2 3)")
    parser.add_argument("--save-path", default="outputs/profile", help="where traces go (default outputs/profile)")
    parser.add_argument(
        "--on-finish",
        default='echo "node done: $(ls "$TORCHSTEP_PROF_SAVE_PATH" | wc -l) trace(s)"',
        help="per-node finish hook command (run by /bin/sh on local rank 0)",
    )
    parser.add_argument("--unranked", action="store_true", help="also start a worker without rank variables")
    parser.add_argument("--timeline", metavar="DIR", help="run the asynchronous RL loop, logging spans into DIR")
    parser.add_argument("--slow-s", type=float, default=0.5, help="the slow rollout replica's extra seconds")
    args = parser.parse_args()
    if args.timeline is not None:
        run_timeline(args)
        return
    save_path = os.path.abspath(args.save_path)

    # The hook runs in a worker, whose output Ray keeps in its log files: it appends to a file
    # the driver prints once the workers are done.
    with tempfile.TemporaryDirectory(prefix="ray_roles_hook_") as hook_dir:
        hook_log = os.path.join(hook_dir, "hook.log")
        started = time.monotonic()
        written = run_workers(args, save_path, logged(args.on_finish, hook_log))
        print(f"{len(written)} trace(s) in {save_path} ({time.monotonic() - started:.0f} s)")
        for path in sorted(written):
            print(" ", os.path.basename(path))
        # With wait=True the hook was over before the last step call returned.
        if os.path.exists(hook_log):
            with open(hook_log) as handle:
                print(handle.read(), end="")
        else:
            print("the finish hook did not run")


def run_workers(args: argparse.Namespace, save_path: str, on_finish: str) -> list[str]:
    """Start the workers on a local cluster, drive their steps, and return the traces written."""
    world_size = sum(ROLES.values())
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline: no usage report
    ray.init(num_cpus=world_size + 1, include_dashboard=False, configure_logging=False, log_to_driver=True)
    try:
        workers: dict[str, list[Any]] = {}
        rank = 0
        for role, count in ROLES.items():
            for _ in range(count):
                env = rank_variables(rank, world_size)
                worker = Worker.remote(  # type: ignore[attr-defined]
                    role, env, save_path, args.profile_steps, on_finish
                )
                workers.setdefault(role, []).append(worker)
                rank += 1
        everyone = [w for group in workers.values() for w in group]
        if args.unranked:
            unranked = Worker.remote("critic", {}, save_path, args.profile_steps, None)  # type: ignore[attr-defined]
            everyone.append(unranked)
            workers["critic"].append(unranked)
        for n in range(1, args.steps + 1):
            tokens = ray.get([w.step.remote(n, None) for w in workers["rollout"]])[0]
            ray.get([w.step.remote(n, tokens) for role in ("actor", "critic") for w in workers[role]])
            print(f"step {n} done")
        return [path for paths in ray.get([w.finish.remote() for w in everyone]) for path in paths]
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
