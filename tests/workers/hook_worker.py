"""When and where the finish hook runs (tests/test_distributed.py); run under
``torchrun --nproc_per_node=2``.

``hook_worker.py OUT``: one phase per ``on_finish`` scope, each with its traces in
``OUT/<phase>/save`` and the hook's counter and dumps in ``OUT/<phase>/`` (see hook_probe.py),
then ``OUT/result_rank<r>.json`` with what each rank saw between blocks.

- ``counter``: steps {1,2} of 4 on ranks [0, 1], regions of roles ``actor`` and ``ref_model``;
- ``profiled_1``: profiled ranks [1], no hook ranks (the command given as a list: no shell);
- ``hook_ranks_1``: profiled ranks [0], hook ranks [1];
- ``all_ranks_wins``: profiled ranks [0], hook ``ranks=[0], all_ranks=True``;
- ``late_steps``: steps {2,10} of a 3-step loop on ranks [0, 1].
"""

import contextlib
import sys
from pathlib import Path

import torch

import torchstep_prof as tsp
from _common import all_reduce, hook_command, init_group, write_result

out = Path(sys.argv[1])
rank, world = init_group()
x = torch.randn(32, 32)
result: dict = {"world": world}


def own_line_in(counter: Path) -> bool:
    return counter.exists() and any(line.split()[0] == str(rank) for line in counter.read_text().splitlines())


def one_step(n: int) -> None:
    with tsp.step(n):
        with tsp.profile_region("actor", "compute_log_prob"):
            y = torch.tanh(x @ x)
        with tsp.profile_region("ref_model", "forward"):
            all_reduce(y)


@contextlib.contextmanager
def phase(name: str, *, steps, profiled, shell: bool = True, **hook):
    folder = out / name
    # wait=True: these phases check *when* the hook runs, right after the step's exit.
    with tsp.configure(save_path=str(folder / "save")), tsp.schedule(steps=steps), tsp.ranks(*profiled), \
            tsp.on_finish(hook_command(folder, shell=shell), timeout_s=60, wait=True, **hook):
        yield folder / "counter"


with phase("counter", steps=[1, 2], profiled=[0, 1]) as counter:
    for n in range(1, 5):
        one_step(n)
        if n == 1:
            # Every rank all-reduces in step 2: no rank can have finished it yet.
            result["counter_exists_after_step1"] = counter.exists()
        if n == 2:
            result["own_line_after_step2"] = own_line_in(counter)

for name, profiled, hook in [
    ("profiled_1", [1], {"shell": False}),
    ("hook_ranks_1", [0], {"ranks": [1]}),
    ("all_ranks_wins", [0], {"ranks": [0], "all_ranks": True}),
]:
    with phase(name, steps=[1], profiled=profiled, **hook):
        for n in range(1, 3):
            one_step(n)

with phase("late_steps", steps=[2, 10], profiled=[0, 1]) as counter:
    for n in range(1, 4):
        one_step(n)
    result["own_line_after_loop"] = own_line_in(counter)
result["own_line_after_block"] = own_line_in(counter)

write_result(out, rank, result)
