"""The request file ``torchstep-prof trigger`` writes: its format, atomic write, and validation.

A request names absolute step numbers, so every rank that reads it profiles the same steps::

    {"id": "20261202T141503-3f9a2c", "steps": [30, 31], "ranks": null, "all_ranks": true,
     "contents": null, "discrete": null}

``ranks``/``all_ranks``, ``contents`` and ``discrete`` override the job's own configuration for
those steps (``null``: keep the job's; ``discrete`` defaults to fused traces, one per step). No
torch here: the command line imports this module.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import tempfile
from typing import Any, Mapping, Optional, Tuple

import attrs

from ..config.model import CONTENT_NAMES
from ..errors import ConfigError, Problem

__all__ = [
    "REQUEST_FILE",
    "Request",
    "new_id",
    "parse_request",
    "read_request",
    "write_json_atomically",
    "write_request",
]

REQUEST_FILE = "request.json"

_KEYS = ("id", "steps", "ranks", "all_ranks", "contents", "discrete", "created", "rule")


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


def _int_list(key: str, value: Any, *, non_empty: bool) -> list[Problem]:
    if not isinstance(value, list):
        return [Problem(key, f"must be a list of integers >= 0 (got {value!r})")]
    if non_empty and not value:
        return [Problem(key, "must list at least one step (got [])")]
    return [
        Problem(f"{key}[{i}]", f"must be an integer >= 0 (got {item!r})")
        for i, item in enumerate(value)
        if not isinstance(item, int) or isinstance(item, bool) or item < 0
    ]


def parse_request(data: Any) -> Request:
    """A request from the decoded JSON; ``ConfigError`` names every bad key.

    >>> parse_request({"id": "r1", "steps": [30, 31], "ranks": [1], "all_ranks": False}).ranks
    (1,)
    >>> parse_request({"steps": [-1]})
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: 2 problems in the configuration:
      id: required (a non-empty string)
      steps[0]: must be an integer >= 0 (got -1)
    """
    if not isinstance(data, dict):
        raise ConfigError([Problem("", f"must be a JSON object (got {type(data).__name__})")])
    problems: list[Problem] = []
    request_id = data.get("id")
    if not isinstance(request_id, str) or not request_id:
        problems.append(
            Problem(
                "id",
                "required (a non-empty string)"
                if request_id is None
                else f"must be a non-empty string (got {request_id!r})",
            )
        )
    if "steps" not in data:
        problems.append(Problem("steps", "required (a list of step numbers)"))
    else:
        problems += _int_list("steps", data["steps"], non_empty=True)
    if data.get("ranks") is not None:
        problems += _int_list("ranks", data["ranks"], non_empty=True)
    for key in ("all_ranks", "discrete"):
        if data.get(key) is not None and not isinstance(data[key], bool):
            problems.append(Problem(key, f"must be true, false or null (got {data[key]!r})"))
    contents = data.get("contents")
    if contents is not None:
        if not isinstance(contents, list):
            problems.append(
                Problem("contents", f"must be a list of names from {', '.join(CONTENT_NAMES)} (got {contents!r})")
            )
        else:
            problems += [
                Problem(f"contents[{i}]", f"{c!r} is not one of {', '.join(CONTENT_NAMES)}")
                for i, c in enumerate(contents)
                if c not in CONTENT_NAMES
            ]
    problems += [Problem(str(key), f"unknown key (allowed: {', '.join(_KEYS)})") for key in data if key not in _KEYS]
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
    (``OSError`` when it cannot be read)."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError([Problem("", f"not valid JSON ({exc})")]) from None
    return parse_request(data)


def write_json_atomically(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename: a reader sees
    the old file or the new one, never half of one."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)
            handle.write("\n")
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def write_request(folder: str, request: Request) -> str:
    """Write ``request`` as ``folder/request.json`` (write + rename); returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, REQUEST_FILE)
    write_json_atomically(path, request.to_json())
    return path
