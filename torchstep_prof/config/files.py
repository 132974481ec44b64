"""Config files: JSON, YAML and TOML, chosen by the file's extension.

``load_config(path)`` reads and validates one; ``dump_config(cfg, path)`` writes one that loads
back equal. Every failure is a ``ConfigError`` naming the file (and the parser's line and column
where it has them). TOML has no null: a dump leaves ``None`` fields out and a load fills their
defaults, which are ``None``.
"""

from __future__ import annotations

import collections
import errno
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Union

from .._shared_files import SharedFileError, read_capped, replace_exclusively
from .model import ProfilerConfig
from .converter import from_dict, to_dict
from ..errors import ConfigError, Problem

__all__ = ["CONFIG_FORMATS", "dump_config", "format_config", "load_config", "parse_yaml"]

CONFIG_FORMATS: dict[str, str] = {".json": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}
"""The file extensions understood, each with its format."""

MAX_CONFIG_BYTES = 1024 * 1024
"""The largest config file read (a real one is a few hundred bytes)."""

PathLike = Union[str, "os.PathLike[str]"]


def load_config(path: PathLike) -> ProfilerConfig:
    """Read a config file (``.json``, ``.yaml``/``.yml`` or ``.toml``); missing keys take defaults.

    >>> cfg = load_config("profile.yaml")  # doctest: +SKIP
    >>> cfg.schedule.steps  # doctest: +SKIP
    (1, 3)
    """
    fmt = _format_of(path)
    try:
        text = _read_text(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _file_error(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise _file_error(path, f"cannot be read ({exc.strerror or exc})") from None
    data, problems = _PARSERS[fmt](path, text)
    if data is None and fmt == "yaml":
        data = {}  # an empty (or all-comments) YAML file means every default, as in TOML
    if not isinstance(data, dict):
        raise _file_error(path, f"must hold a mapping of keys to values at the top level (got {data!r})")
    try:
        cfg = from_dict(data, ProfilerConfig)
    except ConfigError as exc:
        problems += exc.problems
    if problems:  # duplicate keys too: the values' problems (of the last copies) come with them
        raise ConfigError(problems)
    return cfg


def _read_text(path: PathLike) -> bytes:
    """The file's bytes: a regular file of at most MAX_CONFIG_BYTES, opened without blocking
    (a FIFO or a device put in a config file's place is refused, never waited on); a link is
    followed (the user named the file)."""
    import stat

    try:
        return read_capped(os.fspath(path), MAX_CONFIG_BYTES, follow_links=True)
    except SharedFileError as exc:
        if exc.too_big:
            raise _file_error(
                path, f"is larger than {MAX_CONFIG_BYTES // 1024} KiB, the most a config file may hold"
            ) from None
        if exc.mode is not None and stat.S_ISDIR(exc.mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)) from None
        raise _file_error(path, "is not a regular file (a FIFO, socket or device is never read)") from None


def dump_config(cfg: ProfilerConfig, path: PathLike) -> None:
    """Write ``cfg`` to ``path`` in the format its extension names; it loads back equal.

    The file is written to a temporary name first and renamed, so it is complete or absent; a
    file that cannot be written raises the ``OSError``.

    >>> dump_config(ProfilerConfig(ranks=(0, 1)), "profile.toml")  # doctest: +SKIP
    """
    text = format_config(cfg, _format_of(path))
    replace_exclusively(os.path.abspath(path), text.encode("utf-8"))  # never through a planted link


def format_config(cfg: ProfilerConfig, fmt: str = "yaml") -> str:
    """``cfg`` as the text of a ``json``, ``yaml`` or ``toml`` file.

    >>> print(format_config(ProfilerConfig(ranks=(0, 2)), "toml"), end="")
    enable = true
    save_path = "outputs/profile"
    discrete = true
    gzip = false
    summary = true
    ranks = [0, 2]
    all_ranks = false
    contents = []
    """
    data = to_dict(cfg)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml  # costs more than the config model: only when a file is written

        # Flow style for lists of scalars (`ranks: [0, 2]`), block style for the sections.
        options = dict(Dumper=_yaml_dumper(), sort_keys=False, default_flow_style=None)
        text = yaml.dump(data, allow_unicode=True, **options)
        if parse_yaml(text) != data:
            # PyYAML writing raw Unicode folds a NEL (U+0085) in a string into a space;
            # escaped (`"\N"`) it survives. Rare enough to pay for the check with a re-read.
            text = yaml.dump(data, allow_unicode=False, **options)
        return text
    if fmt == "toml":
        return _to_toml(data)
    raise ValueError(f"unknown config format {fmt!r} (allowed: json, yaml, toml)")


def parse_yaml(text: str) -> Any:
    """YAML as torchstep_prof reads it: ``yaml.safe_load``, but ``1e-3`` is a number.

    PyYAML follows YAML 1.1, where a float needs a dot and ``1e-3`` is a string; YAML 1.2, JSON
    and TOML read it as a number, and so does a person writing ``timeout_s: 1e-3``.

    A key given twice in one mapping is a ``ConfigError`` naming its path (PyYAML would keep the
    last one silently). An alias (``*name``) is a ``yaml.YAMLError``: nested aliases expand
    exponentially (a few hundred bytes can take gigabytes), and a config never needs one.

    >>> parse_yaml("timeout_s: 1e-3")
    {'timeout_s': 0.001}
    >>> parse_yaml("schedule:\\n  steps: [1]\\n  steps: [2]\\n")
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: schedule.steps: duplicate key at line 3, column 3 (first at line 2); a key may appear once
    """
    data, problems = _load_yaml(text)
    if problems:
        raise ConfigError(problems)
    return data


def _load_yaml(text: str) -> tuple[Any, list[Problem]]:
    """The document (duplicate keys: the last one kept) and a problem for each duplicate key."""
    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
        return data, _duplicate_keys(node, "")
    finally:
        loader.dispose()


def _duplicate_keys(node: Any, path: str) -> list[Problem]:
    """Every key repeated within one mapping of a composed YAML document, under its key path."""
    import yaml

    problems: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            where = f"{path}.{key}" if path else str(key)
            if key is not None and key in first_line:
                mark = key_node.start_mark
                problems.append(
                    Problem(
                        where,
                        f"duplicate key at line {mark.line + 1}, column {mark.column + 1} "
                        f"(first at line {first_line[key]}); a key may appear once",
                    )
                )
            elif key is not None:
                first_line[key] = key_node.start_mark.line + 1
            problems += _duplicate_keys(value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            problems += _duplicate_keys(item, f"{path}[{index}]")
    return problems


_EXPONENT_FLOAT = r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"


@functools.lru_cache(maxsize=None)
def _yaml_loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"alias *{event.anchor} refused: a config file may not use YAML aliases (write the value out)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)

    # add_implicit_resolver copies the resolver table onto the subclass: SafeLoader is untouched.
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_EXPONENT_FLOAT), list("-+0123456789"))
    return Loader


@functools.lru_cache(maxsize=None)
def _yaml_dumper() -> type:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    # The same rule when writing, so that the string "1e3" is quoted and reads back a string.
    Dumper.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(_EXPONENT_FLOAT), list("-+0123456789"))
    return Dumper


def _format_of(path: PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in CONFIG_FORMATS:
        got = repr(suffix) if suffix else "no extension"
        allowed = ", ".join(CONFIG_FORMATS)
        raise _file_error(path, f"unknown config file format (got {got}; allowed: {allowed})")
    return CONFIG_FORMATS[suffix]


def _file_error(path: PathLike, message: str) -> ConfigError:
    return ConfigError([Problem("", f"{os.fspath(path)}: {message}")])


# --- readers: each turns a parser's complaint into one line naming the file and the place --------


def _read_json(path: PathLike, text: str) -> tuple[Any, list[Problem]]:
    try:
        data = json.loads(text, object_pairs_hook=_JsonObject)
    except json.JSONDecodeError as exc:
        raise _file_error(path, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    problems: list[Problem] = []
    return _plain(data, "", problems), problems


class _JsonObject(dict):
    """A JSON object that remembers the keys it was given more than once (``json`` keeps the
    last silently); :func:`_plain` reports them under their key paths."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        counts = collections.Counter(key for key, _ in pairs)
        self.repeated = [key for key in self if counts[key] > 1]


def _plain(value: Any, path: str, problems: list[Problem]) -> Any:
    if isinstance(value, _JsonObject):
        for key in value.repeated:
            where = f"{path}.{key}" if path else key
            problems.append(Problem(where, "duplicate key (given more than once in one object); a key may appear once"))
        return {k: _plain(v, f"{path}.{k}" if path else k, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    return value


def _read_yaml(path: PathLike, text: str) -> tuple[Any, list[Problem]]:
    import yaml

    try:
        return _load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        detail = f"{problem} ({context})" if context else problem
        raise _file_error(path, f"invalid YAML{where}: {detail}") from None


def _read_toml(path: PathLike, text: str) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]  # the same API under the stdlib's name

    try:
        return tomllib.loads(text), []  # TOML itself forbids a key given twice
    except tomllib.TOMLDecodeError as exc:
        # tomllib puts "(at line L, column C)" in its message.
        raise _file_error(path, f"invalid TOML: {exc}") from None


_PARSERS = {"json": _read_json, "yaml": _read_yaml, "toml": _read_toml}


# --- a TOML writer for this schema: scalars and lists on top, then one table per section ------


def _to_toml(data: dict[str, Any]) -> str:
    lines = [
        f"{key} = {_toml_value(value)}"
        for key, value in data.items()
        if value is not None and not isinstance(value, dict)
    ]
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"]
            lines += [f"{k} = {_toml_value(v)}" for k, v in value.items() if v is not None]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    # A scalar or a list of scalars (the config classes refuse inf and nan) is written the same in
    # JSON and TOML, but for DEL, which TOML forbids raw in a string.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
