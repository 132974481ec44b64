"""A slow finish hook must not make another rank's collective time out (tests/test_hook_background.py).

Run under torchrun with 2 ranks: ``slow_hook_worker.py OUT``. The all-reduces after the steps use
a gloo group with a 15 s timeout; rank 0's hook sleeps 30 s. Both ranks all-reduce right after
the step that triggers the hook: with the hook in the training thread, rank 1 would wait 30 s for
rank 0 and time out.

Start-up (the rendezvous, rank 0's profiler warm-up at scope entry: over 5 s on a loaded 2-core
machine) is not what is tested: it runs under the default group's 60 s timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import all_reduce, init_group, new_group, write_result  # noqa: E402

import torchstep_prof as tsp  # noqa: E402

out = Path(sys.argv[1])
rank, world = init_group(timeout_s=60.0)
after_steps = new_group(timeout_s=15.0)  # the timeout a training-thread hook would overrun
marker = out / f"hook-done-rank{rank}"
with tsp.configure(save_path=str(out / "save"), summary=False), tsp.schedule(steps=[1]), \
        tsp.ranks(0), tsp.on_finish(f'sleep 30; touch "{marker}"', timeout_s=60):
    # In step with rank 1 once rank 0 has paid the profiler's start-up (at scope entry, seconds
    # on a loaded machine; under the default group's 60 s timeout): only the hook could hold
    # rank 0 up from here.
    ready = torch.ones(1)
    all_reduce(ready)
    for n in range(1, 4):
        with tsp.step(n), tsp.profile_region("trainer", "update"):
            torch.ones(8).sum()
        total = torch.ones(1)
        all_reduce(total, after_steps)  # right after step 1's exit started rank 0's hook
result = {"sum": float(total.item()), "hook_done_before_exit": marker.exists()}
write_result(out, rank, result)
# Both ranks leave together: rank 0 once its hook is done (flush waits for it), rank 1 in a
# barrier under the default group's 60 s timeout. A rank that exited ~30 s before the other
# aborted inside gloo ("terminate called without an active exception") even with its groups
# destroyed, as below.
if rank == 0:
    tsp.flush()
torch.distributed.barrier()
# Groups left to interpreter teardown abort a rank inside gloo too: a plain two-rank gloo script
# without torchstep_prof did so 4 times in 5. Destroyed here, as training scripts should.
torch.distributed.destroy_process_group(after_steps)
torch.distributed.destroy_process_group()
