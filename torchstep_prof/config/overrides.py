"""``key.path=value`` overrides on top of a config, as on a command line or in the environment.

Values parse as YAML scalars and flow lists (``schedule.steps=[1,3]``, ``all_ranks=true``); a
plain string stays the string it is (``finish_hook.cmd=echo hi``). Setting a field of a ``null``
section creates that section with its defaults. Every problem of every override is reported in
one ``ConfigError``, and nothing is half-applied: the result is a new config or an exception.
"""

from __future__ import annotations

import copy
import datetime as _dt
from typing import Any, Iterable, Optional, Tuple, Union, get_type_hints

import attrs

from .model import ProfilerConfig
from .files import parse_yaml
from .converter import from_dict, schema, suggest, to_dict
from ..errors import ConfigError, Problem

__all__ = ["Override", "apply_overrides", "parse_each"]


@attrs.frozen(kw_only=True)
class Override:
    """One parsed override: where it points (``("schedule", "steps")``) and the value to set."""

    text: str
    path: tuple[str, ...]
    value: Any


def parse_each(overrides: Iterable[str | Override]) -> tuple[tuple[Override, ...], list[Problem]]:
    """The overrides that parse, and the problems of those that do not (all reported together
    by whoever also checks the values: ``apply_overrides``, the environment's layer).

    >>> parsed, problems = parse_each(["gzip=true", "noequals"])
    >>> [o.path for o in parsed], [str(p) for p in problems]
    ([('gzip',)], ["override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])"])
    """
    parsed: list[Override] = []
    problems: list[Problem] = []
    for item in overrides:
        if isinstance(item, Override):
            parsed.append(item)
            continue
        try:
            parsed.append(_parse_one(item))
        except ConfigError as exc:
            problems += exc.problems
    return tuple(parsed), problems


def apply_overrides(cfg: ProfilerConfig, overrides: Iterable[str | Override]) -> ProfilerConfig:
    """A new config: ``cfg`` with every override applied in order (a later one wins).

    >>> cfg = apply_overrides(ProfilerConfig(), ["schedule.steps=[1,3]", "all_ranks=true"])
    >>> cfg.schedule.steps, cfg.all_ranks
    ((1, 3), True)
    >>> apply_overrides(ProfilerConfig(), ["schedule.wait=-1", "noequals"])
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: 2 problems in the configuration:
      override 'noequals' has no '=' (expected key=value, e.g. schedule.steps=[1,3])
      schedule.wait: must be >= 0 (got -1)
    """
    # The well-formed ones are still applied (to a copy), so that their value problems come out
    # in the same error as the malformed ones.
    parsed, problems = parse_each(overrides)
    data = to_dict(cfg)
    done: set[tuple[str, ...]] = set()
    for override in parsed:
        _set(data, override, done)
        done.add(override.path)
    try:
        result = from_dict(data, ProfilerConfig)
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(problems)
    return result


def _parse_one(text: str) -> Override:
    if not isinstance(text, str):
        raise ConfigError([Problem("", f"an override must be a string key=value (got {text!r})")])
    key, equals, raw = text.partition("=")
    key = key.strip()
    if not equals:
        raise ConfigError(
            [Problem("", f"override {text!r} has no '=' (expected key=value, e.g. schedule.steps=[1,3])")]
        )
    if not key:
        raise ConfigError([Problem("", f"override {text!r} has an empty key (expected key=value)")])
    path = tuple(segment.strip() for segment in key.split("."))
    if not all(path):
        raise ConfigError(
            [
                Problem(
                    key,
                    f"override {text!r} has an empty key segment (expected names joined by '.', e.g. schedule.wait)",
                )
            ]
        )
    field_type = _field_type(text, path)
    return Override(text=text, path=path, value=_parse_value(text, path, raw, field_type))


def _field_type(text: str, path: tuple[str, ...]) -> Any:
    """The type of the field the key path names, through sections only; raises if it names none."""
    cls: type | None = ProfilerConfig
    for depth, segment in enumerate(path):
        where = ".".join(path[: depth + 1])
        if cls is None:
            parent = ".".join(path[:depth])
            raise ConfigError(
                [
                    Problem(
                        where,
                        f"override {text!r} sets a key inside {parent}, which is "
                        f"a value, not a section (sections: "
                        f"{', '.join(k for k, section in schema(ProfilerConfig).items() if section)})",
                    )
                ]
            )
        fields = schema(cls)
        if segment not in fields:
            raise ConfigError([Problem(where, f"unknown key in override {text!r} ({suggest(segment, fields)})")])
        owner, cls = cls, fields[segment]
    return get_type_hints(owner)[path[-1]]  # the annotations are strings (PEP 563)


def _parse_value(text: str, path: tuple[str, ...], raw: str, field_type: Any) -> Any:
    import yaml  # only when overrides are used: PyYAML costs more than the config model

    if field_type in _TEXT:  # save_path, process_role, a hook's cmd
        return _text_value(raw, field_type)
    try:
        value = parse_yaml(raw)
    except ConfigError as exc:  # a key given twice: `schedule={steps: [1], steps: [2]}`
        raise exc.under(".".join(path)) from None
    except yaml.YAMLError as exc:
        # Text that YAML cannot read (`@x`) is fine quoted; a broken list or quote is not text.
        hint = "" if raw.lstrip()[:1] in ("[", "{", "'", '"') else "; to pass text, quote it: key='...'"
        raise ConfigError(
            [
                Problem(
                    ".".join(path), f"override {text!r} has a value that is not valid YAML ({_yaml_reason(exc)}{hint})"
                )
            ]
        ) from None
    is_section = len(path) == 1 and schema(ProfilerConfig)[path[0]] is not None
    # YAML reads `2024-01-01` as a date and `a: b` as a mapping; where the schema has no room
    # for those, the user meant the text they typed.
    if isinstance(value, _dt.date) or (isinstance(value, dict) and not is_section):  # datetime too
        return raw.strip()
    return value


def _text_value(raw: str, field_type: Any) -> Any:
    """A text field's value: the text typed (`finish_hook.cmd=echo #hi` is that command,
    `save_path=on` that folder, `cmd='/opt/my tools/up' --all` that shell line), except a
    whole quoted string (unquoted), ``null`` for an optional field, and a ``[...]`` list for a
    command (run without a shell)."""
    text = raw.strip()
    if field_type == Optional[str] and text in ("null", "~", "Null", "NULL", ""):
        return None
    if text[:1] in ("'", '"') or (field_type == Union[str, Tuple[str, ...]] and text.startswith("[")):
        try:
            value = parse_yaml(text)
        except Exception:  # not one YAML value: the shell line it looks like
            return text
        if isinstance(value, str) or (isinstance(value, list) and text.startswith("[")):
            return value
    return text


_TEXT = (str, Optional[str], Union[str, Tuple[str, ...]])


def _yaml_reason(exc: Exception) -> str:
    problem = getattr(exc, "problem", None) or str(exc)
    mark = getattr(exc, "problem_mark", None)
    # The value is one line, so only the column is worth saying.
    return f"{problem} at column {mark.column + 1}" if mark is not None else problem


# A schedule is an explicit list of steps or a cycle, never both (ScheduleConfig says so).
_CYCLE_FIELDS: tuple[str, ...] = ("skip_first", "wait", "warmup", "active", "repeat")


def _set(data: dict[str, Any], override: Override, done: set[tuple[str, ...]]) -> None:
    """Apply ``override`` to ``data``; ``done`` holds the paths earlier overrides set."""
    if override.path[0] == "schedule" and len(override.path) == 2 and isinstance(data.get("schedule"), dict):
        # Overriding one form of the schedule replaces the other form where it came from the
        # base config (the code's `schedule(wait=1, ...)` under `schedule.steps=[2]`); where
        # an earlier override set it, the contradiction is the user's and is reported.
        if override.path[1] == "steps" and override.value is not None:
            replaced = _CYCLE_FIELDS
        else:
            replaced = ("steps",) if override.path[1] in _CYCLE_FIELDS else ()
        for field in replaced:
            if ("schedule", field) not in done:
                data["schedule"].pop(field, None)
    *parents, last = override.path
    node = data
    for segment in parents:
        if node.get(segment) is None:
            node[segment] = {}  # a field of a null section: create it with its defaults
        node = node[segment]
        if not isinstance(node, dict):
            return  # an earlier override set the section to a non-mapping: from_dict says so
    # A copy: a later `schedule.wait=1` must not edit the dict of an earlier `schedule={...}`,
    # which the environment's cached layer reuses.
    node[last] = copy.deepcopy(override.value)
