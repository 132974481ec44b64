"""Printing rich renderables the way logs want them: no trailing spaces on any line.

rich pads every cell to its column's width, so a table written to a log file ends most lines
with spaces. :func:`print_stripped` renders on the console it is given (same width, same colour
settings), then strips each line's trailing blanks, colour codes kept.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["print_stripped", "strip_trailing_blanks"]

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
