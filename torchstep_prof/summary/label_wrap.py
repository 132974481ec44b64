"""Fitting a label into a table column: folded after a separator, never in the middle of a word.

rich folds an over-long cell wherever the column ends (``actor-upd`` / ``ate``) or cuts it with
an ellipsis, and shrinks every other column first, numbers included. The tables here instead give
the numbers their full width and fold only the label, after a ``-``, ``/``, ``_``, ``.`` or a
space: the pieces of a sanitized label are whole words. A piece longer than the column on its own
is cut with ``…``; the tables that cut one also print the whole name elsewhere (a file list).
"""

from __future__ import annotations

import re

__all__ = ["wrap_label"]

# A piece ends after a separator: "actor-" "compute-" "log-" "prob" ("/": a region's role/stage).
_PIECE = re.compile(r"[^-/_. =+]*[-/_. =+]*")
_ELLIPSIS = "…"


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
