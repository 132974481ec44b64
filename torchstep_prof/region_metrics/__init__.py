"""Always-on region metrics for Prometheus: the recorder, its collector and the HTTP endpoint.

``tsp.metrics(port=18400)`` (or a ``metrics`` config section) times every region and step;
``endpoint()`` says where this process serves them. ``prometheus_client`` is imported only
when the endpoint starts.

>>> import torchstep_prof.region_metrics as m
>>> m.endpoint() is None or len(m.endpoint()) == 2
True
"""

from __future__ import annotations

from .endpoint import endpoint

__all__ = ["endpoint"]
