"""Children forked from a profiled process (run by tests/test_child_processes.py).

Usage: fork_child.py SAVE_PATH ROUNDS

Each round forks a child inside a region of a selected step (the parent's trace records), and
another after that trace is written. Every child enters a region and ends with ``sys.exit(3)``.
The parent prints one line per child: ``child <pid> status <exit status or signal>``.
"""

from __future__ import annotations

import os
import sys
import time

import torch

import torchstep_prof as tsp

SAVE_PATH, ROUNDS = sys.argv[1], int(sys.argv[2])


def fork_child() -> int:
    pid = os.fork()
    if pid == 0:
        with tsp.profile_region("child", "work"):
            torch.ones(4).sum()
        sys.exit(3)
    return pid


def wait(pid: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            print(f"child {pid} status {code}", flush=True)
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(f"child {pid} status hung", flush=True)


with tsp.configure(save_path=SAVE_PATH, summary=False), tsp.schedule(steps=list(range(1, ROUNDS + 1))):
    for n in range(1, ROUNDS + 1):
        with tsp.step(n), tsp.profile_region("parent", "update"):
            torch.ones(4).sum()
            inside = fork_child()
            wait(inside)
        wait(fork_child())
print("parent done", flush=True)
