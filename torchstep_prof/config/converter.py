"""Configs to and from plain dicts, through one private cattrs converter.

``to_dict`` gives plain JSON-able data (lists, not tuples; ``None`` kept); ``from_dict`` is its
exact inverse, ``from_dict(to_dict(c)) == c``. Structuring is strict: unknown keys are errors
(with a close-match suggestion), nothing is coerced ("1" is not an int), and every problem in
the input comes out at once in one ``ConfigError``, each under its full key path::

    schedul: unknown key (did you mean 'schedule'?)
    finish_hook.cmd: required

cattrs' own structuring would coerce values, drop the attrs validators' messages and stop at the
first nested class, so the converter's structure hooks walk the input themselves and let the
config classes' validators speak.
"""

from __future__ import annotations

import functools
import math
import typing
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

import attrs

from .model import (
    AutoTraceConfig,
    FinishHookConfig,
    MetricsConfig,
    OnDemandConfig,
    ProfilerConfig,
    ScheduleConfig,
    SpansConfig,
    StallConfig,
)
from ..errors import ConfigError, Problem

if TYPE_CHECKING:
    import cattrs

__all__ = ["from_dict", "in_field_order", "schema", "suggest", "to_dict"]

C = TypeVar("C", bound=attrs.AttrsInstance)  # the config classes: attrs classes

_CONFIG_CLASSES = (
    ProfilerConfig,
    ScheduleConfig,
    FinishHookConfig,
    OnDemandConfig,
    MetricsConfig,
    AutoTraceConfig,
    StallConfig,
    SpansConfig,
)

# A required field that is missing (each has one here) still gets a stand-in value, so that the
# class's validators can report the *other* fields' problems in the same error ("every problem
# at once").
_STAND_INS: dict[tuple[type, str], Any] = {
    (FinishHookConfig, "cmd"): "true",
    (OnDemandConfig, "dir"): ".",
    (SpansConfig, "dir"): ".",
}


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config as plain data: dicts, lists, strings, numbers, booleans and ``None``.

    >>> to_dict(ScheduleConfig(steps=(1, 3)))
    {'steps': [1, 3], 'skip_first': 0, 'wait': 0, 'warmup': 0, 'active': 1, 'repeat': 1}
    """
    return _converter().unstructure(cfg)


# ignore: mypy rejects any default for a TypeVar-typed parameter; ProfilerConfig is one of the C.
def from_dict(data: Any, cls: type[C] = ProfilerConfig) -> C:  # type: ignore[assignment]
    """Build a config from plain data; raise ``ConfigError`` listing every problem.

    Missing keys take their defaults; lists become tuples; nothing else is converted.

    >>> from_dict({"schedule": {"steps": [1, 3]}, "ranks": [0, 2]}).ranks
    (0, 2)
    >>> from_dict({"schedul": {}, "ranks": ["0"]})
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: 2 problems in the configuration:
      ranks[0]: must be an integer (got '0')
      schedul: unknown key (did you mean 'schedule'?)
    """
    if cls not in _CONFIG_CLASSES:
        names = ", ".join(c.__name__ for c in _CONFIG_CLASSES)
        raise TypeError(f"from_dict builds one of {names}, not {cls!r}")
    return _converter().structure(data, cls)


@functools.lru_cache(maxsize=None)
def schema(cls: type) -> Mapping[str, type | None]:
    """The keys a config class accepts, each mapped to its section class (``None``: a value).

    >>> schema(ProfilerConfig)["schedule"].__name__, schema(ProfilerConfig)["ranks"]
    ('ScheduleConfig', None)
    """
    hints = typing.get_type_hints(cls)
    return {f.name: _section_class(hints[f.name]) for f in attrs.fields(cls)}


def suggest(key: str, allowed: Any) -> str:
    """The hint for an unknown key: a close match if there is one, else every allowed key.

    >>> suggest("schedul", ["schedule", "ranks"])
    "did you mean 'schedule'?"
    """
    import difflib  # only on the error path

    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"


def _section_class(hint: Any) -> type | None:
    """``ScheduleConfig`` for ``Optional[ScheduleConfig]`` (every section's hint); ``None`` for a
    plain value."""
    classes = [c for c in typing.get_args(hint) if isinstance(c, type) and attrs.has(c)]
    return classes[0] if classes else None


@functools.lru_cache(maxsize=None)
def _converter() -> cattrs.Converter:
    # Built on first use: importing cattrs costs more than the whole config model, and
    # `import torchstep_prof` must stay cheap.
    import cattrs

    converter = cattrs.Converter()
    converter.register_unstructure_hook(tuple, lambda t: [converter.unstructure(v) for v in t])
    for cls in _CONFIG_CLASSES:
        converter.register_structure_hook(cls, _structure_config)
    return converter


def _structure_config(data: Any, cls: type[C]) -> C:
    """The structure hook of every config class; raises one ``ConfigError`` with all problems."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            [
                Problem(
                    "",
                    f"the configuration must be a mapping of keys to values "
                    f"(got {data!r}; allowed keys: {', '.join(schema(cls))})",
                )
            ]
        )
    fields = schema(cls)
    problems: list[Problem] = []
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            problems.append(Problem(str(key), f"unknown key ({suggest(str(key), fields)})"))
        elif (section := fields[key]) is not None and value is not None:
            # A section, its problems under its key; a bad one is left out (its default, None).
            if not isinstance(value, Mapping):
                allowed = ", ".join(schema(section))
                problems.append(Problem(key, f"must be a mapping or null (got {value!r}; allowed keys: {allowed})"))
                continue
            try:
                kwargs[key] = _structure_config(value, section)
            except ConfigError as exc:
                problems += exc.under(key).problems
        elif _non_finite(str(key), value, problems):
            continue  # 1e400 read as inf, or .nan: reported as itself, not as a wrong type
        else:
            # Lists become tuples (how the classes store them); every other value reaches the
            # validators exactly as given, so "1" or 1.5 for an int is reported, not coerced.
            kwargs[key] = tuple(value) if isinstance(value, list) else value
    missing = [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING and f.name not in kwargs]
    problems += [Problem(name, "required") for name in missing]
    kwargs.update({name: _STAND_INS[cls, name] for name in missing})
    try:
        instance = cls(**kwargs)
    except ConfigError as exc:
        problems += exc.problems
    if problems:
        raise ConfigError(in_field_order(problems, list(fields), len(fields)))
    return instance


def _non_finite(key: str, value: Any, problems: list[Problem]) -> bool:
    """Add a problem for each non-finite number in ``value`` (a scalar or a list); True if any."""
    items = enumerate(value) if isinstance(value, list) else [(None, value)]
    found = [
        Problem(key if i is None else f"{key}[{i}]", f"must be a finite number (got {item!r})")
        for i, item in items
        if isinstance(item, float) and not math.isfinite(item)
    ]
    problems += found
    return bool(found)


def in_field_order(problems: list[Problem], fields: list[str], unknown: int) -> list[Problem]:
    """Problems sorted (stably) as ``fields`` are listed, so the report reads like the file or
    the call; a problem whose key is not in ``fields`` sorts as if at index ``unknown``."""

    def position(problem: Problem) -> int:
        head = problem.path.split(".", 1)[0].split("[", 1)[0]
        return fields.index(head) if head in fields else unknown

    return sorted(problems, key=position)
