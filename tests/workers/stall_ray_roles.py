"""Ray actors of two roles under one stall folder (tests/test_stall.py): ``stall_ray_roles.py DIR``.

An ``actor`` worker (rank 0) and a ``rollout`` worker (rank 1), each told its rank as torchrun
would and its role by ``configure(process_role=...)``, keep their live status in DIR. At step 2
the rollout worker's ``generate`` takes 3 s (its stall rule: 1 s, the actor's 30 s); the driver prints the
``torchstep-prof status DIR --json`` it ran meanwhile, then ends both workers.
"""

import contextlib
import json
import os
import subprocess
import sys
import time

import ray

import torchstep_prof as tsp

folder = sys.argv[1]
after_s = {"rollout": 1.0, "actor": 30.0}  # the actor waits for the driver meanwhile: no report of its own


@ray.remote(num_cpus=0)
class Worker:
    def __init__(self, role: str, rank: int) -> None:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"})
        self.role = role
        self.scopes = contextlib.ExitStack()
        self.scopes.enter_context(
            tsp.configure(
                process_role=role, summary=False, stall={"dir": folder, "after_s": after_s[role], "poll_s": 0.1}
            )
        )

    def generate(self, n: int) -> None:
        with tsp.step(n), tsp.profile_region(self.role, "generate"):
            time.sleep(3.0 if self.role == "rollout" and n == 2 else 0.05)

    def finish(self) -> None:
        self.scopes.close()


ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
workers = [Worker.remote("actor", 0), Worker.remote("rollout", 1)]
ray.get([w.generate.remote(1) for w in workers])
pending = [w.generate.remote(2) for w in workers]
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(folder, "stall-rank1-rollout.txt")) and time.monotonic() < deadline:
    time.sleep(0.1)
status = subprocess.run([sys.executable, "-m", "torchstep_prof", "status", folder, "--json"], capture_output=True,
                        text=True, timeout=120)  # fmt: skip
ray.get(pending)
ray.get([w.finish.remote() for w in workers])
ray.shutdown()
print("STATUS " + json.dumps(json.loads(status.stdout)))
