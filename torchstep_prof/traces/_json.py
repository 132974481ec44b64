"""JSON for trace files: orjson where it is installed (2-3x faster on large traces), else json.

Imported only by the trace readers and the merge, never by the training path.
"""

from __future__ import annotations

import functools
import json
from typing import Any


@functools.lru_cache(maxsize=1)
def _orjson() -> Any:
    try:
        import orjson
    except ImportError:
        return None
    return orjson


def loads(data: bytes) -> Any:
    """Parse ``data``; json decides what orjson rejects (NaN and Infinity, which json accepts)."""
    orjson = _orjson()
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def dumps(value: Any) -> bytes:
    """Compact JSON bytes; json writes what orjson cannot (an integer past 64 bits, say)."""
    orjson = _orjson()
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":")).encode()
