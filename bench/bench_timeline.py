"""``torchstep-prof timeline`` over 1,000 steps x 16 processes: seconds and peak memory.

The folder: 16 span files as a job of a 8-rank trainer (ref then actor, waiting on rollout) and
8 rollout replicas (replica 5 is 1.5x slower) on 2 hosts would write them over 1,000 steps, a
clock anchor per step on every process; the second host's clock is 0.8 s off. The command runs in
a fresh interpreter, as a person runs it, and reports its own peak RSS. Information, not a
test: the issue asks for "seconds".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _timing  # noqa: E402
from _timing import Report, stat  # noqa: E402

TRAINERS, REPLICAS, STEPS = 8, 8, 1000
SLOW_REPLICA = 5
SKEW_S = 0.8  # the second host's clock


def make_folder(folder: str, steps: int) -> int:
    """Write the job's span files; the number of spans written."""
    count = 0
    for p in range(TRAINERS + REPLICAS):
        trainer = p < TRAINERS
        host = "node-a" if p % 2 == 0 else "node-b"
        skew = SKEW_S if host == "node-b" else 0.0
        header = {"kind": "process", "format": 1, "host": host, "pid": 1000 + p, "rank": p if trainer else 0,
                  "world_size": TRAINERS if trainer else 1, "process_role": "trainer" if trainer else "rollout"}  # fmt: skip
        lines = [json.dumps(header)]
        for n in range(steps):
            t = 1_700_000_000.0 + 10.0 * n + skew
            rollout = 4.0 * (1.5 if p - TRAINERS == SLOW_REPLICA else 1.0)
            if trainer:
                spans = [["ref", "compute_log_prob", t + 6.05, t + 7.0], ["actor", "update", t + 7.0, t + 9.0]]
            else:
                spans = [["rollout", "generate", t + 0.01 * k, t + 0.01 * k + rollout / 8] for k in range(8)]
            count += len(spans)
            anchor = [["step", n + 1, t + 9.0, t + 9.001]]
            lines.append(json.dumps({"kind": "batch", "thread": "MainThread", "rank": header["rank"], "spans": spans,
                                     "steps": [[n, t, t + 9.0]], "anchors": anchor}))  # fmt: skip
        lines.append(json.dumps({"kind": "end", "at": 0}))
        Path(folder, f"spans-{host}-{1000 + p}.jsonl").write_text("\n".join(lines) + "\n")
    return count


def run(quick: bool = False) -> Report:
    report = Report("bench_timeline")
    steps = 100 if _timing.SMOKE else STEPS
    with tempfile.TemporaryDirectory() as folder:
        spans = make_folder(folder, steps)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        samples, peaks = [], []
        for _ in range(1 if quick or _timing.SMOKE else 3):
            code = ("import resource, sys; from torchstep_prof.cli import main; "
                    "code = main(['timeline', sys.argv[1], '--json']); "
                    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr); sys.exit(code)")  # fmt: skip
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", code, folder], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(_timing.ROOT)})  # fmt: skip
            samples.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise RuntimeError(done.stderr)
            peaks.append(float(done.stderr.strip().splitlines()[-1]))
        report.add(stat(f"timeline --json of {steps} steps x {TRAINERS + REPLICAS} processes ({spans} spans)", samples))
        report.add(stat("peak RSS of that command", peaks, unit="B"))
        report.add(stat("span files' size", [float(size)], unit="B"))
    return report


if __name__ == "__main__":
    _timing.main(run)
