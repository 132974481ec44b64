"""torchstep_prof: torch.profiler traces of chosen steps, ranks and regions of distributed training."""

from __future__ import annotations

__version__ = "0.1.0"
