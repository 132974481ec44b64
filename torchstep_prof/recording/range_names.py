"""The names of region ranges inside traces: ``<role>/<stage>``, checked once and cached.

Regions repeat, so each (role, stage) pair is checked once (``labels.py``: the same check as
metrics make, warnings on first sight, never an error) and made safe for torch's unescaped JSON.
"""

from __future__ import annotations

from ..naming import range_label
from .labels import check_labels

__all__ = ["RANGE_NAMES", "range_name"]

# role -> stage -> range name (docs/hot-path.md, "Two lookups of interned strings")
RANGE_NAMES: dict[str, dict[str, str]] = {}


def range_name(role: str, stage: str) -> str:
    """``<role>/<stage>`` made safe for torch's unescaped JSON (cached: regions repeat)."""
    names = RANGE_NAMES.get(role)
    name = names.get(stage) if names is not None else None
    if name is None:
        # First sight of this pair under a schedule: its warnings now, not on a profiled step.
        texts = check_labels(role, stage)
        name = RANGE_NAMES.setdefault(role, {})[stage] = range_label(f"{texts[0]}/{texts[1]}")
    return name
