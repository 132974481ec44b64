"""The user's own torch profiler next to torchstep_prof's (run by tests/test_foreign_profiler.py).

Usage: foreign_profiler.py CASE SAVE_PATH USER_TRACE

Each case once crashed the interpreter (rc 139) at the user's profiler's exit or step. The user's
trace is exported to USER_TRACE; the script prints "done" at its end.
"""

from __future__ import annotations

import sys
import threading

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import torchstep_prof as tsp

CASE, SAVE_PATH, USER_TRACE = sys.argv[1:4]
CPU = [ProfilerActivity.CPU]


def in_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def selected_region() -> None:
    with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("worker", "update"):
        torch.ones(8).sum()


def only_a_scope() -> None:
    with tsp.schedule(steps=[5]):  # the scope's one-time warm-up window; no step runs
        pass


with tsp.configure(save_path=SAVE_PATH, summary=False):
    if CASE == "region-in-another-thread":
        with profile(activities=CPU) as user:
            torch.ones(4).sum()
            in_thread(selected_region)
    elif CASE == "scope-in-another-thread":
        with profile(activities=CPU) as user:
            torch.ones(4).sum()
            in_thread(only_a_scope)
    elif CASE == "their-warm-up":
        with profile(activities=CPU, schedule=schedule(wait=0, warmup=1, active=1)) as user:
            for n in (1, 2):
                with tsp.schedule(steps=[1]), tsp.step(n), tsp.profile_region("actor", "update"):
                    torch.ones(4).sum()
                user.step()
    elif CASE == "their-wait-phase":
        # Theirs is in its wait phase (entered, nothing of Kineto yet) when ours would start; its
        # step() inside our block then prepared Kineto under ours: our export crashed (rc 139).
        with profile(activities=CPU, schedule=schedule(wait=1, warmup=1, active=2)) as user:
            for n in range(5):
                with tsp.schedule(steps=[0, 1, 2, 3, 4]), tsp.step(n), tsp.profile_region("actor", "update"):
                    torch.ones(4).sum()
                    user.step()
    elif CASE == "theirs-warms-up-inside-ours":
        # Theirs is entered inside our trace and steps into its warm-up before ours stops.
        with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("actor", "update"):
            user = profile(activities=CPU, schedule=schedule(wait=1, warmup=1, active=2))
            user.__enter__()
            torch.ones(4).sum()
            user.step()
            torch.ones(4).sum()
        for _ in range(4):
            torch.ones(4).sum()
            user.step()
        user.__exit__(None, None, None)
    elif CASE == "theirs-between-ours":
        # Theirs starts and stops once between two of our written traces (no __exit__, so torch's
        # step tracker stays registered): our finished profiles, alive in reference cycles with
        # their results released, were taken for a profiler in its warm-up; steps 3-4 were lost.
        with tsp.schedule(steps=[1, 2, 3, 4]):
            for n in range(1, 5):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    torch.ones(3).sum()
                tsp.flush()
                if n == 2:
                    user = profile(activities=CPU)
                    user.start()
                    torch.ones(3).sum()
                    user.stop()
                    # One whose results its owner dropped once done (as bench scripts do): it
                    # was taken for a profiler in its warm-up too.
                    spent = profile(activities=CPU)
                    spent.start()
                    spent.stop()
                    spent.profiler.kineto_results = None
    elif CASE == "theirs-spans-our-end":
        # Theirs is opened inside our trace and still records when ours ends: stopping ours ended
        # theirs too, whose export then crashed (rc 139).
        with tsp.schedule(steps=[1]), tsp.step(1):
            region = tsp.profile_region("actor", "update")
            region.__enter__()
            user = profile(activities=CPU)
            user.__enter__()
            torch.ones(4).sum()
            region.__exit__(None, None, None)
            torch.ones(4).sum()
            user.__exit__(None, None, None)
    elif CASE == "theirs-inside-ours":
        with tsp.schedule(steps=[1]), tsp.step(1), tsp.profile_region("actor", "update"):
            with profile(activities=CPU) as user:
                torch.ones(4).sum()
    else:
        raise SystemExit(f"unknown case {CASE!r}")
    user.export_chrome_trace(USER_TRACE)

# After theirs: ours profiles again.
with tsp.configure(save_path=SAVE_PATH, summary=False), tsp.schedule(steps=[7]), tsp.step(7):
    with tsp.profile_region("after", "theirs"):
        torch.ones(4).sum()
print("done")
