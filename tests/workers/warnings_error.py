"""Profiling warnings under ``python -W error`` (run by tests/test_warnings_never_raise.py).

Usage: python -W error warnings_error.py CASE SAVE_PATH

Prints "training continues" after the profiled step; the ``user-exception`` case raises the
user's own ValueError from inside a region whose trace cannot be written.
"""

from __future__ import annotations

import sys

import torch

import torchstep_prof as tsp

CASE, SAVE_PATH = sys.argv[1], sys.argv[2]


def train() -> None:
    with tsp.step(1), tsp.profile_region("actor", "update"):
        torch.ones(4).sum()
        if CASE == "user-exception":
            raise ValueError("the user's own error")


with tsp.configure(save_path=SAVE_PATH, summary=False), tsp.schedule(steps=[1]):
    if CASE == "failed-hook":
        with tsp.on_finish("exit 7", wait=True):
            train()
    else:
        train()
print("training continues", flush=True)
