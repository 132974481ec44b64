"""Scope arguments checked and applied: every problem of a call in one ``ConfigError``."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import attrs

from .model import ProfilerConfig
from ..errors import ConfigError, Problem


def evolve_checked(
    base: ProfilerConfig, fields: Mapping[str, Any], problems: Optional[list[Problem]] = None
) -> ProfilerConfig:
    """``base`` with ``fields`` set; one ``ConfigError`` listing every problem (unknown keys,
    bad values, bad sections, plus any already in ``problems``), as a config file gets."""
    from .converter import from_dict, in_field_order, schema, suggest

    sections = schema(ProfilerConfig)  # each key, and its section class (None: a plain value)
    problems = list(problems or ())
    values: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in sections:
            problems.append(Problem(name, f"unknown key ({suggest(name, sections)})"))
        elif (section := sections[name]) is not None and isinstance(value, Mapping):
            try:
                values[name] = from_dict(value, section)
            except ConfigError as exc:
                problems += exc.under(name).problems
        else:
            values[name] = value
    try:
        result = attrs.evolve(base, **values)
    except ConfigError as exc:
        problems += exc.problems
    if problems:  # in the order the fields were given; any about another key first
        raise ConfigError(in_field_order(problems, list(fields), -1))
    return result
