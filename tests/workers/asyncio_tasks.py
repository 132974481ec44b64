"""Asyncio tasks entering regions during selected steps (run by tests/test_asyncio.py).

Usage: asyncio_tasks.py SAVE_PATH TASKS STEPS [--nested] [--jitter SEED]

Each selected step gathers TASKS tasks, each ``with profile_region(f"task{i}", "a"):
await asyncio.sleep(0.001)`` (the case that crashed 2 to 5 runs in 10): steps 1..STEPS in
discrete mode (the first task's region owns the step's trace), then STEPS+1..2*STEPS fused (the
step block owns it).
``--nested`` adds a region inside each task's region; ``--jitter`` sleeps a random time before
and inside each region, so tasks enter and leave in every order, also after the trace stopped.
"""

from __future__ import annotations

import asyncio
import random
import sys

import torchstep_prof as tsp


async def task(index: int, nested: bool, rng: random.Random | None) -> None:
    if rng is not None:
        await asyncio.sleep(rng.random() * 0.003)
    with tsp.profile_region(f"task{index}", "a"):
        await asyncio.sleep(0.001 if rng is None else rng.random() * 0.003)
        if nested:
            with tsp.profile_region(f"task{index}", "inner"):
                await asyncio.sleep(0 if rng is None else rng.random() * 0.002)


async def main() -> None:
    save_path, tasks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    nested = "--nested" in sys.argv
    seed = int(sys.argv[sys.argv.index("--jitter") + 1]) if "--jitter" in sys.argv else None
    with tsp.schedule(steps=list(range(1, 2 * steps + 1))), tsp.configure(save_path=save_path, summary=False):
        for n in range(1, 2 * steps + 1):
            rng = random.Random(seed * 1000 + n) if seed is not None else None
            with tsp.configure(discrete=n <= steps), tsp.step(n):
                await asyncio.gather(*(task(i, nested, rng) for i in range(tasks)))


if __name__ == "__main__":
    asyncio.run(main())
