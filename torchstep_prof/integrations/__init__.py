"""Framework integrations: one-line callbacks for Hugging Face ``Trainer`` and Lightning.

Each submodule imports its framework when it is itself imported, never before:
``import torchstep_prof`` and ``import torchstep_prof.integrations`` import none of them.

>>> from torchstep_prof.integrations.transformers import TorchstepProfCallback  # doctest: +SKIP
>>> trainer = Trainer(..., callbacks=[TorchstepProfCallback(steps=[3, 5])])      # doctest: +SKIP

Ray actors need no integration to be profiled: set ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` in each actor (see ``examples/ray_roles.py``). ``integrations.ray`` notes
Ray calls in the span log, so the timeline can align the actors' clocks (docs/timeline.md).
"""

from __future__ import annotations

__all__: list[str] = []
