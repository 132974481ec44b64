"""Why an automatic trace was taken: kept by step number, written into the trace's metadata.

A capture notes its steps here (watch.py, or the watcher for a peer's request); the trace
session adds :func:`metadata` of its step to the trace's ``torchstep_prof`` metadata, as
``auto_trace``: the metric, its value, the baseline and the factor. Bounded: the newest
:data:`MAX_STEPS_KEPT` steps.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

__all__ = ["MAX_STEPS_KEPT", "metadata", "note", "why_of"]

MAX_STEPS_KEPT = 256
_LOCK = threading.Lock()
_WHY: dict[int, dict[str, Any]] = {}


def note(steps: Iterable[int], why: dict[str, Any]) -> None:
    """Steps ``steps`` are traced because of ``why``."""
    with _LOCK:
        for step in steps:
            _WHY.pop(step, None)
            _WHY[step] = why
        while len(_WHY) > MAX_STEPS_KEPT:
            del _WHY[next(iter(_WHY))]


def why_of(step: int) -> dict[str, Any]:
    """Why step ``step`` was traced automatically ({} when it was not)."""
    return _WHY.get(step, {})


def metadata(step: Any) -> dict[str, Any]:
    """What a trace of ``step`` adds to its metadata: ``{"auto_trace": {...}}`` or nothing.

    >>> note([7], {"metric": "step"}); metadata(7)
    {'auto_trace': {'metric': 'step'}}
    """
    why = _WHY.get(step) if isinstance(step, int) else None
    return {"auto_trace": why} if why else {}
