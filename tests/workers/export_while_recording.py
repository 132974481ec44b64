"""What torch allows: export a stopped profiler on another thread while new ones record.

Plain torch, no torchstep_prof: the training side runs profiler windows back to back and hands
each stopped ``torch.profiler.profile`` to one writer thread, which calls
``export_chrome_trace`` while the next window starts, records and stops. Then every file is
checked: valid JSON, holding its own window's marker range and no other window's, the marker's
time inside the window's wall-clock span (``baseTimeNanoseconds`` + ``ts``), the metadata added
to that window, and ``traceName`` naming the file. Exit code 0 only when every file passes.

    python export_while_recording.py MODE WINDOWS OUT_DIR [OPS]

MODE: ``plain`` (windows in the main thread), ``threads`` (plus two threads running torch ops
meanwhile), ``trainer-thread`` (windows in a non-main thread), ``asyncio`` (windows inside a
coroutine, with tasks running torch ops between awaits).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

MODE, WINDOWS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
OPS = int(sys.argv[4]) if len(sys.argv) > 4 else 40

handed: queue.Queue = queue.Queue()
written: dict[int, tuple[str, int, int]] = {}


def writer() -> None:
    while True:
        item = handed.get()
        if item is None:
            return
        i, prof, t0, t1 = item
        path = os.path.join(OUT, f"w{i}.json")
        prof.export_chrome_trace(path)
        written[i] = (path, t0, t1)


def work(i: int) -> None:
    with record_function(f"window-{i}"):
        x = torch.ones(16, 16)
        for _ in range(OPS * (1 + (i * 7919) % 13)):  # windows of varied sizes: varied overlaps
            x = x.add(1)


def start(i: int) -> tuple[profile, int]:
    t0 = time.time_ns()
    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=(i % 3 == 0))
    prof.start()
    prof.add_metadata_json("window", json.dumps({"i": i}))
    return prof, t0


def stop(i: int, prof: profile, t0: int) -> None:
    prof.stop()
    handed.put((i, prof, t0, time.time_ns()))


def window(i: int) -> None:
    prof, t0 = start(i)
    work(i)
    stop(i, prof, t0)


def run_plain() -> None:
    for i in range(WINDOWS):
        window(i)


def run_threads() -> None:
    done = threading.Event()

    def noise() -> None:
        while not done.is_set():
            torch.ones(8).add(1)

    others = [threading.Thread(target=noise) for _ in range(2)]
    for thread in others:
        thread.start()
    try:
        run_plain()
    finally:
        done.set()
        for thread in others:
            thread.join()


def run_trainer_thread() -> None:
    trainer = threading.Thread(target=run_plain)
    trainer.start()
    trainer.join()


def run_asyncio() -> None:
    async def task() -> None:
        for _ in range(5):
            torch.ones(4).add(1)
            await asyncio.sleep(0)

    async def main() -> None:
        for i in range(WINDOWS):
            tasks = [asyncio.create_task(task()) for _ in range(4)]
            prof, t0 = start(i)
            work(i)
            await asyncio.sleep(0)
            stop(i, prof, t0)
            await asyncio.gather(*tasks)

    asyncio.run(main())


def check(i: int) -> list[str]:
    path, t0, t1 = written[i]
    with open(path) as handle:
        trace = json.load(handle)
    problems = []
    names = {e.get("name") for e in trace["traceEvents"]}
    if f"window-{i}" not in names:
        problems.append("its own marker is missing")
    strays = sorted(n for n in names if isinstance(n, str) and n.startswith("window-") and n != f"window-{i}")
    if strays:
        problems.append(f"other windows' markers: {strays}")
    base = trace["baseTimeNanoseconds"]
    for event in trace["traceEvents"]:
        if event.get("name") == f"window-{i}" and not t0 - 1e6 <= base + event["ts"] * 1000 <= t1 + 1e6:
            problems.append("its marker lies outside the window's wall-clock span")
    if trace.get("window", {}).get("i") != i:
        problems.append(f"metadata of another window: {trace.get('window')}")
    if trace.get("traceName") != path:
        problems.append(f"traceName {trace.get('traceName')!r}")
    return problems


def main() -> int:
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        {"plain": run_plain, "threads": run_threads, "trainer-thread": run_trainer_thread, "asyncio": run_asyncio}[MODE]()
    finally:
        handed.put(None)
        thread.join()
    bad = 0
    for i in range(WINDOWS):
        problems = check(i)
        if problems:
            bad += 1
            print(f"window {i}: {'; '.join(problems)}", file=sys.stderr)
    print(f"{WINDOWS} windows exported beside the next one: {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
