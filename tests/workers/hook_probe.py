"""The finish hook of the distributed tests: ``hook_probe.py FOLDER``.

Appends one line ``<rank> <training pid>`` to ``FOLDER/counter`` (one write, O_APPEND: lines
from several ranks never mix), and dumps its environment and the listing of
``$TORCHSTEP_PROF_SAVE_PATH`` to ``FOLDER/hook_rank<rank>.json``.
"""

import json
import os
import sys

folder = sys.argv[1]
rank = os.environ["TORCHSTEP_PROF_RANK"]
save_path = os.environ["TORCHSTEP_PROF_SAVE_PATH"]
dump = {"env": dict(os.environ), "listing": sorted(os.listdir(save_path)), "hook_pid": os.getpid()}
with open(os.path.join(folder, f".hook_rank{rank}.json.tmp"), "w") as handle:
    json.dump(dump, handle)
os.replace(os.path.join(folder, f".hook_rank{rank}.json.tmp"), os.path.join(folder, f"hook_rank{rank}.json"))
with open(os.path.join(folder, "counter"), "a") as handle:
    handle.write(f"{rank} {os.environ['TORCHSTEP_PROF_PID']}\n")
print(f"hook ran on rank {rank}")
