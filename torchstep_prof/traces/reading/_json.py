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


def loads(data: bytes | bytearray) -> Any:
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


def dumps_indented(value: Any) -> str:
    """JSON text indented by 2 spaces, as ``--json`` prints it.

    orjson writes it fast. Without orjson, json indents in pure Python (~10x slower than its C
    encoder, seconds on a summary of 20,000 traces): a document with more than
    :data:`INDENT_ITEMS` list items then keeps the indentation of the top-level keys and
    writes each item of their lists on one compact line, with the C encoder.
    """
    orjson = _orjson()
    if orjson is not None:
        try:
            return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
        except TypeError:
            pass
    if not isinstance(value, dict) or sum(len(v) for v in value.values() if isinstance(v, list)) <= INDENT_ITEMS:
        return json.dumps(value, indent=2)
    compact = json.JSONEncoder(separators=(", ", ": ")).encode
    lines = []
    for key, item in value.items():
        if isinstance(item, list) and item:
            body = ",\n".join(f"    {compact(element)}" for element in item)
            lines.append(f"  {compact(key)}: [\n{body}\n  ]")
        else:
            lines.append(f"  {compact(key)}: {compact(item)}")
    return "{\n" + ",\n".join(lines) + "\n}"


INDENT_ITEMS = 200
"""Past this many items in a document's top-level lists, :func:`dumps_indented` writes one item a
line (without orjson)."""
