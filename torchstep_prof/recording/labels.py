"""Region labels at first sight: one check, the same with metrics alone or under a schedule.

A label never fails a region: one that is not a string is used as its text (one warning), and
one that sanitizes to nothing is named by its encoded form (``naming.py``). Two labels
that name the same files (``actor_1`` and ``actor-1`` both become ``actor-1``) would merge in
every command-line group, so the second one seen gets one warning naming both. The check runs
once per distinct pair (regions cache its result), so turning profiling on never changes what a
label does to a loop that ran without it.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import LabelWarning, warn
from ..naming import file_label, label_text

__all__ = ["check_labels"]

_MAX_REMEMBERED = 10_000  # file-name pairs remembered for the collision check; later ones go unchecked
_LOCK = threading.Lock()
_BY_FILE_NAME: dict[tuple[str, str], tuple[str, str]] = {}  # (role, stage) in file names -> first text pair
_WARNED: set[Any] = set()


def check_labels(role: Any, stage: Any) -> tuple[str, str]:
    """``(role, stage)`` as text, warning once about a label that is not a string and once
    about a pair that names the same files as another pair seen before.

    >>> check_labels("actor", "update")
    ('actor', 'update')
    """
    texts = (label_text(role), label_text(stage))
    for what, label, text in (("role", role, texts[0]), ("stage", stage, texts[1])):
        if not isinstance(label, str):
            _warn_once(
                ("type", type(label).__name__, text),
                f"torchstep_prof: region {what} {text!r} is a {type(label).__name__}, not a string; "
                f"it is used as the text {text!r} (pass a string to silence this)",
            )
    named = (file_label(texts[0]), file_label(texts[1]))
    with _LOCK:
        first = _BY_FILE_NAME.get(named)
        if first is None and len(_BY_FILE_NAME) < _MAX_REMEMBERED:
            _BY_FILE_NAME[named] = texts
    if first is not None and first != texts:
        _warn_once(
            ("same file names", named),
            f"torchstep_prof: regions {'/'.join(first)!r} and {'/'.join(texts)!r} are both named "
            f"{named[0]}_{named[1]} in trace file names (labels keep only 0-9 A-Z a-z . = + -): "
            "summarize, merge and report group their traces as one; give them labels that differ there",
        )
    return texts


def _warn_once(key: Any, message: str) -> None:
    with _LOCK:
        if key in _WARNED or len(_WARNED) >= _MAX_REMEMBERED:
            return
        _WARNED.add(key)
    warn(message, LabelWarning)
