"""A training script profiled only through the environment, that starts child processes (run by
tests/test_child_processes.py with TORCHSTEP_PROF_OVERRIDES set).

Usage: env_children.py

Its children: DataLoader workers (``multiprocessing_context`` spawn and forkserver), a
``multiprocessing`` spawn child, each entering regions as often as the parent; the finish hook
is a Python command that imports a profiled helper (tests/workers/profiled_helper.py).
"""

from __future__ import annotations

import multiprocessing

import torch
from torch.utils.data import DataLoader, Dataset

import torchstep_prof as tsp


class Regions(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        with tsp.profile_region("data", "getitem"):  # counted: its 2nd entry is "step 2"
            return torch.ones(2) * index


def child() -> None:
    for _ in range(3):
        with tsp.profile_region("child", "work"):
            torch.ones(2).sum()


def main() -> None:
    for context in ("spawn", "forkserver"):
        for _ in DataLoader(Regions(), batch_size=1, num_workers=1, multiprocessing_context=context):
            pass
    process = multiprocessing.get_context("spawn").Process(target=child)
    process.start()
    process.join()
    assert process.exitcode == 0, process.exitcode
    for n in range(1, 4):
        with tsp.step(n), tsp.profile_region("train", "update"):
            torch.ones(4).sum()


if __name__ == "__main__":
    main()
