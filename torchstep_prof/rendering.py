"""Text for a terminal or a log: made safe, durations formatted once, labels fitted, no trailing blanks.

Safe text: role and stage labels, request ids, operator names read from a trace, error messages
and file names come from code, files and requests the toolkit does not control. Printed raw, an
``ESC`` in one repaints the terminal (``\\x1b[2J`` clears it) and a newline forges a line of
output. Everything the toolkit prints that came from outside goes through :func:`safe_text` first.

Fitted labels (:func:`wrap_label`): rich folds an over-long cell wherever the column ends
(``actor-upd`` / ``ate``) or cuts it with an ellipsis, and shrinks every other column first,
numbers included. The tables here instead give the numbers their full width and fold only the
label, after a ``-``, ``/``, ``_``, ``.`` or a space: the pieces of a sanitized label are whole
words. A piece longer than the column on its own is cut with ``…``; the tables that cut one also
print the whole name elsewhere (a file list).

No trailing blanks (:func:`print_stripped`): rich pads every cell to its column's width, so a
table written to a log file ends most lines with spaces; it renders on the console it is given
(same width, same colour settings), then strips each line's trailing blanks, colour codes kept.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Iterable, Optional

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "format_ms",
    "format_size",
    "print_stripped",
    "safe_text",
    "step_ranges",
    "strip_trailing_blanks",
    "wrap_label",
]

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


def safe_text(text: object, limit: Optional[int] = None) -> str:
    """``text`` as a string in which every control character shows as an escape (``\\x1b``,
    ``\\n``): one printed line, and nothing a terminal acts on; with ``limit``, cut to at most
    that many characters (ending in ``...``).

    >>> safe_text("req\\x1b[2J\\nfake line")
    'req\\\\x1b[2J\\\\nfake line'
    >>> safe_text("actor/update"), safe_text("actor/update", limit=8)
    ('actor/update', 'actor...')
    """
    string = text if isinstance(text, str) else str(text)
    shown = _UNSAFE.sub(_escaped, string) if _UNSAFE.search(string) else string
    return shown if limit is None or len(shown) <= limit else shown[: limit - 3] + "..."


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


def step_ranges(numbers: Iterable[int]) -> str:
    """Step numbers in order, runs of consecutive ones as ranges.

    >>> step_ranges([0, 1, 2, 3, 7]), step_ranges({5, 3})
    ('0-3, 7', '3, 5')
    """
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# A piece ends after a separator: "actor-" "compute-" "log-" "prob" ("/": a region's role/stage).
_PIECE = re.compile(r"[^-/_. =+]*[-/_. =+]*")
_ELLIPSIS = "…"


def format_size(size: float) -> str:
    """A byte count for a table cell, in B, KiB, MiB or GiB.

    >>> format_size(512), format_size(5 * 2**20), format_size(3 * 2**40)
    ('512 B', '5.0 MiB', '3072.0 GiB')
    """
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def wrap_label(text: str, width: int) -> str:
    """``text`` in lines of at most ``width`` characters, broken after separators.

    >>> wrap_label("rollout-actor-ref-critic/train", 14)
    'rollout-actor-\\nref-critic/\\ntrain'
    >>> wrap_label("a" * 10, 6)
    'aaaaa…'
    """
    width = max(1, width)
    out: list[str] = []
    for line in text.split("\n"):
        out.extend(_wrap_line(line, width))
    return "\n".join(out)


def _wrap_line(line: str, width: int) -> list[str]:
    if len(line) <= width:
        return [line]
    lines: list[str] = []
    current = ""
    for piece in _PIECE.findall(line):
        if not piece:
            continue
        if len(current) + len(piece.rstrip(" ")) <= width:
            current += piece
            continue
        if current:
            lines.append(current.rstrip(" "))
        current = piece if len(piece.rstrip(" ")) <= width else _cut(piece, width)
    if current:
        lines.append(current.rstrip(" "))
    return lines


def _cut(piece: str, width: int) -> str:
    """A piece too long for a line on its own: cut with ``…``, its separator kept (``rrr…/``
    still reads as a role followed by its stage)."""
    word = piece.rstrip("-/_. =+")
    sep = piece[len(word) :].rstrip(" ")[:1]
    if width < 2 + len(sep):
        sep = ""
    return word[: max(0, width - 1 - len(sep))] + _ELLIPSIS + sep


# Trailing blanks, possibly followed (or interleaved) by colour codes that end the line.
_TRAILING = re.compile(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$", re.MULTILINE)


def strip_trailing_blanks(text: str) -> str:
    """``text`` with the blanks at the end of every line removed (ANSI colour codes kept).

    >>> strip_trailing_blanks("a  \\nb \\x1b[0m\\n")
    'a\\nb\\x1b[0m\\n'
    """
    previous = None
    while previous != text:  # "x \x1b[1m \x1b[0m" needs two passes
        previous, text = text, _TRAILING.sub(r"\1", text)
    return text


def print_stripped(console: Console, *renderables: Any, **print_kwargs: Any) -> None:
    """``console.print(*renderables)`` with no trailing blanks on any line."""
    with console.capture() as capture:
        console.print(*renderables, **print_kwargs)
    console.file.write(strip_trailing_blanks(capture.get()))
    console.file.flush()
