"""The names of region ranges inside traces: ``<role>/<stage>``, checked once and cached.

Regions repeat, so each (role, stage) pair is checked (a label that cannot name a file fails on
first sight, not on the step that is profiled) and made safe for torch's unescaped JSON once.
"""

from __future__ import annotations

from ..traces.names import range_label, sanitize_label

__all__ = ["RANGE_NAMES", "range_name"]

# role -> stage -> range name (docs/hot-path.md, "Two lookups of interned strings")
RANGE_NAMES: dict[str, dict[str, str]] = {}


def range_name(role: str, stage: str) -> str:
    """``<role>/<stage>`` made safe for torch's unescaped JSON (cached: regions repeat)."""
    names = RANGE_NAMES.get(role)
    name = names.get(stage) if names is not None else None
    if name is None:
        # First sight of this pair under a schedule: a label that cannot name a file fails
        # now, not hours later on the step that is profiled.
        sanitize_label(role, "role"), sanitize_label(stage, "stage")
        name = RANGE_NAMES.setdefault(role, {})[stage] = range_label(f"{role}/{stage}")
    return name
