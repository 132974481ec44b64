"""The request file ``torchstep-prof trigger`` writes: its format, atomic write, and validation.

A request names absolute step numbers, so every rank that reads it profiles the same steps::

    {"id": "20261202T141503-3f9a2c", "steps": [30, 31], "ranks": null, "all_ranks": true,
     "contents": null, "discrete": null}

``ranks``/``all_ranks``, ``contents`` and ``discrete`` override the job's own configuration for
those steps (``null``: keep the job's; ``discrete`` defaults to fused traces, one per step).
Whoever can write the folder can write a request, so it is bounded (the ``MAX_*`` constants:
docs/on-demand.md) and read as a shared file (``_shared_files.read_capped``). No torch here:
the command line imports this module.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
from typing import Any, Mapping, Optional, Tuple

import attrs

from .._shared_files import read_capped, replace_exclusively
from ..config.model import CONTENT_NAMES
from ..errors import ConfigError, Problem
from ..rendering import safe_text

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_RANKS",
    "MAX_REQUEST_BYTES",
    "MAX_STEP",
    "MAX_STEPS",
    "MAX_STEP_SPAN",
    "REQUEST_FILE",
    "Request",
    "new_id",
    "parse_request",
    "read_request",
    "write_request",
]

REQUEST_FILE = "request.json"

_KEYS = ("id", "steps", "ranks", "all_ranks", "contents", "discrete", "created", "rule")

# The bounds of a request (docs/on-demand.md). Anyone who can write the folder can write a
# request, and the job pays for it: every step of a request is a profiled step, and the id is
# copied into the status file rewritten every poll.
MAX_REQUEST_BYTES = 64 * 1024
"""The largest request file read (a request the command writes is well under 1 KiB)."""
MAX_STEPS = 100
"""The most steps one request profiles (``--next``)."""
MAX_STEP_SPAN = 10_000
"""The farthest apart a request's first and last steps may be."""
MAX_STEP = 2**53
"""The largest step number (and rank) a request names: an exact JSON number anywhere."""
MAX_ID_LENGTH = 64
"""The longest request id."""
MAX_RANKS = 65_536
"""The most ranks a request lists."""
_ID = re.compile(r"[0-9A-Za-z._:+-]+")
_ID_RULE = f"1 to {MAX_ID_LENGTH} characters of 0-9 A-Z a-z . _ : + -"


@attrs.frozen(kw_only=True)
class Request:
    """One on-demand request: profile ``steps`` on the chosen ranks.

    >>> Request(id="r1", steps=(30, 31)).all_ranks
    True
    """

    id: str
    steps: Tuple[int, ...]
    ranks: Optional[Tuple[int, ...]] = None
    all_ranks: bool = True
    contents: Optional[Tuple[str, ...]] = None
    discrete: Optional[bool] = None
    created: Optional[str] = None  # when the command wrote it (UTC, ISO 8601): information
    rule: Optional[Mapping[str, Any]] = None  # how the steps were chosen: information

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        for key in ("steps", "ranks", "contents"):
            if data[key] is not None:
                data[key] = list(data[key])
        return data


def new_id() -> str:
    """A request id: the UTC time and a random suffix (two triggers in one second differ).

    >>> len(new_id().split("-")[1])
    6
    """
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def _shown(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut short: a problem line never carries a 30 MB value."""
    return safe_text(repr(value), limit)


def _key(key: str) -> str:
    """A key as a problem names it: itself when short and printable, else its ``repr``, cut short."""
    return key if len(key) <= 40 and key.isprintable() else _shown(key, 40)


def _int_list(key: str, value: Any, most: int) -> list[Problem]:
    if not isinstance(value, list):
        return [Problem(key, f"must be a list of integers >= 0 (got {_shown(value)})")]
    if not value:
        return [Problem(key, "must list at least one step (got [])")]
    if len(value) > most:
        return [Problem(key, f"must list at most {most} (got {len(value)})")]
    bad = [
        Problem(f"{key}[{i}]", f"must be an integer from 0 to {MAX_STEP} (got {_shown(item)})")
        for i, item in enumerate(value)
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item <= MAX_STEP
    ]
    return bad[:5]  # the first few: a list of a million bad items is one mistake


def _id_problems(request_id: Any) -> list[Problem]:
    if request_id is None:
        return [Problem("id", f"required ({_ID_RULE})")]
    if not isinstance(request_id, str) or len(request_id) > MAX_ID_LENGTH or not _ID.fullmatch(request_id):
        return [Problem("id", f"must be {_ID_RULE} (got {_shown(request_id)})")]
    return []


def _steps_problems(steps: Any) -> list[Problem]:
    problems = _int_list("steps", steps, MAX_STEPS)
    if not problems and max(steps) - min(steps) > MAX_STEP_SPAN:
        problems.append(
            Problem("steps", f"must lie within {MAX_STEP_SPAN} steps of each other (got {min(steps)} to {max(steps)})")
        )
    return problems


def parse_request(data: Any) -> Request:
    """A request from the decoded JSON; ``ConfigError`` names every bad key.

    >>> parse_request({"id": "r1", "steps": [30, 31], "ranks": [1], "all_ranks": False}).ranks
    (1,)
    >>> parse_request({"steps": [-1]})
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: 2 problems in the configuration:
      id: required (1 to 64 characters of 0-9 A-Z a-z . _ : + -)
      steps[0]: must be an integer from 0 to 9007199254740992 (got -1)
    """
    if not isinstance(data, dict):
        raise ConfigError([Problem("", f"must be a JSON object (got {type(data).__name__})")])
    request_id = data.get("id")
    problems = _id_problems(request_id)
    if "steps" not in data:
        problems.append(Problem("steps", "required (a list of step numbers)"))
    else:
        problems += _steps_problems(data["steps"])
    if data.get("ranks") is not None:
        problems += _int_list("ranks", data["ranks"], MAX_RANKS)
    for key in ("all_ranks", "discrete"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            problems.append(Problem(key, f"must be true, false or null (got {_shown(data[key])})"))
    contents = data.get("contents")
    if contents is not None:
        allowed = ", ".join(CONTENT_NAMES)
        if not isinstance(contents, list) or len(contents) > len(CONTENT_NAMES):
            problems.append(Problem("contents", f"must be a list of names from {allowed} (got {_shown(contents)})"))
        else:
            problems += [
                Problem(f"contents[{i}]", f"{_shown(c)} is not one of {allowed}")
                for i, c in enumerate(contents)
                if c not in CONTENT_NAMES
            ]
    unknown = [key for key in data if key not in _KEYS]
    problems += [Problem(_key(key), f"unknown key (allowed: {', '.join(_KEYS)})") for key in unknown[:5]]
    if problems:
        raise ConfigError(problems)
    ranks = data.get("ranks")
    all_ranks = data.get("all_ranks")
    return Request(
        id=request_id,  # type: ignore[arg-type]  # a str: checked above (problems raise)
        steps=tuple(sorted(set(data["steps"]))),
        ranks=tuple(ranks) if ranks is not None else None,
        all_ranks=ranks is None if all_ranks is None else all_ranks,
        contents=tuple(contents) if contents is not None else None,
        discrete=data.get("discrete"),
        created=data.get("created") if isinstance(data.get("created"), str) else None,
        rule=data.get("rule") if isinstance(data.get("rule"), dict) else None,
    )


def read_request(path: str) -> Request:
    """The request in the file at ``path``; ``ConfigError`` for a file that is not one
    (``OSError`` when it cannot be read, or is not a regular file of at most
    :data:`MAX_REQUEST_BYTES`: see ``_shared_files.read_capped``)."""
    text = read_capped(path, MAX_REQUEST_BYTES)
    try:
        data = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError and too many digits included
        raise ConfigError([Problem("", f"not valid JSON ({_shown(str(exc), 120)})")]) from None
    except RecursionError:
        raise ConfigError([Problem("", "not valid JSON (nested too deeply)")]) from None
    return parse_request(data)


def write_request(folder: str, request: Request) -> str:
    """Write ``request`` as ``folder/request.json`` through a new file and a rename: a reader sees
    the old request or the new one, never half of one, and a link planted there is replaced,
    never written through; returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, REQUEST_FILE)
    replace_exclusively(path, (json.dumps(request.to_json(), indent=1) + "\n").encode("utf-8"))
    return path
