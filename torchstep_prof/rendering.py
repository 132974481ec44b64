"""Text from outside made safe to print: control characters and escape sequences shown escaped.

Role and stage labels, request ids, operator names read from a trace, error messages and file
names come from code, files and requests the toolkit does not control. Printed raw, an ``ESC``
in one repaints the terminal (``\\x1b[2J`` clears it) and a newline forges a line of output.
Everything the toolkit prints that came from outside goes through :func:`safe_text` first.
"""

from __future__ import annotations

import re

__all__ = ["safe_text"]

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
