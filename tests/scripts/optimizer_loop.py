"""A script with a plain optimizer loop, no torchstep_prof in it (``torchstep-prof run --on-demand``).

    python optimizer_loop.py STEPS [SLEEP_S]
"""

import sys
import time

import torch

steps = int(sys.argv[1])
sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(8, 16)
for _ in range(steps):
    loss = model(data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(sleep_s)
print("done")
