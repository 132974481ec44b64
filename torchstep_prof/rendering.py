"""Text from outside made safe to print: control characters and escape sequences shown escaped.

Role and stage labels, request ids, operator names read from a trace, error messages and file
names come from code, files and requests the toolkit does not control. Printed raw, an ``ESC``
in one repaints the terminal (``\\x1b[2J`` clears it) and a newline forges a line of output.
Everything the toolkit prints that came from outside goes through :func:`safe_text` first.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_ms", "safe_text"]

# C0 and C1 controls and DEL; tabs too (they break column alignment) and the Unicode line and
# paragraph separators (some terminals and log viewers start a new line at them).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(text: object) -> str:
    """``text`` as a string in which every control character shows as an escape (``\\x1b``,
    ``\\n``): one printed line, and nothing a terminal acts on.

    >>> safe_text("req\\x1b[2J\\nfake line")
    'req\\\\x1b[2J\\\\nfake line'
    >>> safe_text("actor/update")
    'actor/update'
    """
    string = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_escaped, string) if _UNSAFE.search(string) else string


def format_ms(value: float) -> str:
    """A duration in ms for a table cell: one decimal, or a short exponent form for absurd
    values (a corrupt trace must not widen a column by hundreds of characters). Rounded to the
    µs first, so one duration reached by two sums of floats prints the same everywhere.

    >>> format_ms(170.44), format_ms(3.2e14), format_ms(float("nan"))
    ('170.4', '3.2e+14', '?')
    >>> format_ms(44050.0 / 1e6 * 1000) == format_ms(44050.0 / 1000)
    True
    """
    if not math.isfinite(value):
        return "?"
    return f"{round(value, 3):.1f}" if abs(value) < 1e7 else f"{value:.1e}"
