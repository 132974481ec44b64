"""A plain optimizer loop, no torchstep_prof in it, that slows down (``torchstep-prof run --auto-trace``).

    python slowing_loop.py STEPS SLOW_FROM

Each step sleeps ~20 ms (+-30%), three times that from step SLOW_FROM (counting from 1).
"""

import random
import sys
import time

import torch

steps, slow_from = int(sys.argv[1]), int(sys.argv[2])
random.seed(3)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(4, 8)
for n in range(1, steps + 1):
    loss = model(data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    time.sleep(0.02 * random.uniform(0.7, 1.3) * (3 if n >= slow_from else 1))
    optimizer.step()
print("done")
