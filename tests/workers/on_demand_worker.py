"""On-demand traces of a running job (tests/test_on_demand.py); run under ``torchrun --nproc_per_node=2``.

``on_demand_worker.py OUT STEPS [begin]``: STEPS short steps (~50 ms each, every one all-reduces,
so the ranks run as one job) under ``on_demand: {dir: OUT/od, poll_s: 0.2}`` with no schedule
and a finish hook that appends ``<rank> <traces>`` to ``OUT/hook_runs.txt`` per run; traces go to ``OUT/traces``. With ``begin`` the
loop uses ``tsp.begin_step`` instead of ``with tsp.step``. Writes ``OUT/result_rank<r>.json``.
"""

import sys
import time
from pathlib import Path

import torch

import torchstep_prof as tsp
from _common import all_reduce, init_group, write_result

out = Path(sys.argv[1])
steps = int(sys.argv[2])
use_begin = sys.argv[3:4] == ["begin"]
rank, world = init_group(timeout_s=120)
x = torch.randn(32, 32)
# One line per hook run: the rank and the base names of the traces it was handed.
HOOK = [sys.executable, "-c", (
    "import os; traces = os.environ['TORCHSTEP_PROF_TRACES'].split(os.pathsep); "
    f"open({str(out / 'hook_runs.txt')!r}, 'a').write(os.environ['TORCHSTEP_PROF_RANK'] + ' ' + "
    "','.join(sorted(os.path.basename(t) for t in traces if t)) + chr(10))"
)]


def work() -> None:
    with tsp.profile_region("actor", "forward"):
        all_reduce(torch.tanh(x @ x))
    time.sleep(0.05)


with tsp.configure(save_path=str(out / "traces"), on_demand={"dir": str(out / "od"), "poll_s": 0.2}), \
        tsp.on_finish(HOOK, timeout_s=60):
    for n in range(1, steps + 1):
        if use_begin:
            tsp.begin_step(n)
            work()
        else:
            with tsp.step(n):
                work()
    tsp.end_step()

write_result(out, rank, {"world": world})
