"""The environment's layer of configuration: switch profiling on with no code change.

``TORCHSTEP_PROF_CONFIG=<file>`` replaces the code's configuration with the file's;
``TORCHSTEP_PROF_OVERRIDES="schedule.steps=[2] 'finish_hook.cmd=upload x'"`` (split like a shell
command line) is applied on top. The environment's word wins over the code's scopes. The scopes
call :func:`read_environment` each time one is entered, so it caches its parse by the variables'
raw values (and the file's identity and mtime) and costs a few microseconds when nothing changed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import attrs

from .model import FinishHookConfig, ProfilerConfig
from .variables import ENV_CHILDREN, ENV_CONFIG, ENV_OVERRIDES, ENV_OWNER, ENV_SUMMARY
from ..errors import ConfigError, Problem

if TYPE_CHECKING:
    from .overrides import Override

__all__ = ["EnvironmentLayer", "owns_environment", "read_environment", "summary_disabled"]

_OFF_WORDS = frozenset({"0", "false", "no", "off"})
_MAX_CACHED_APPLIES = 64


@attrs.frozen(kw_only=True)
class EnvironmentLayer:
    """What the environment says about the configuration, parsed and checked.

    >>> layer = read_environment({"TORCHSTEP_PROF_OVERRIDES": "schedule.steps=[2] all_ranks=true"})
    >>> layer.apply(ProfilerConfig()).schedule.steps
    (2,)
    """

    config_path: str | None = None
    config: ProfilerConfig | None = None
    overrides: tuple[Override, ...] = ()
    sets_finish_hook: bool = False
    # Scopes apply the same layer to the same few configs over and over.
    _applied: dict[ProfilerConfig, ProfilerConfig] = attrs.field(
        factory=dict, init=False, eq=False, repr=False, hash=False
    )

    @property
    def is_empty(self) -> bool:
        """True when neither variable is set: ``apply`` returns its argument."""
        return self.config is None and not self.overrides

    def apply(self, cfg: ProfilerConfig) -> ProfilerConfig:
        """The environment's word over ``cfg``: the file's config replaces it, then the overrides.

        Raises ``ConfigError`` naming ``TORCHSTEP_PROF_OVERRIDES`` when an override's value does
        not fit ``cfg`` (``finish_hook.timeout_s=5`` with no hook command anywhere, say).
        """
        base = cfg if self.config is None else self.config
        if not self.overrides:
            return base
        cached = self._applied.get(base)
        if cached is not None:
            return cached
        try:
            result = _apply(base, self.overrides)
        except ConfigError as exc:
            raise ConfigError(_from_variable(exc.problems, ENV_OVERRIDES)) from None
        if len(self._applied) >= _MAX_CACHED_APPLIES:
            self._applied.clear()
        self._applied[base] = result
        return result


def _apply(base: ProfilerConfig, overrides: tuple[Override, ...]) -> ProfilerConfig:
    """``apply_overrides``, but overrides that only tune a hook's fields (``finish_hook.timeout_s=60``)
    wait for a config that has a hook.

    The layer is applied at every scope, also to those entered before the code's ``on_finish``
    (no hook yet): there such overrides are applied to a placeholder hook, which checks their
    values (no other field's value changes whether one is valid), and the hook is dropped again,
    instead of failing for want of a command.
    """
    from .overrides import apply_overrides

    makes_hook = any(o.path[0] == "finish_hook" and (len(o.path) == 1 or o.path[1] == "cmd") for o in overrides)
    if base.finish_hook is not None or makes_hook:
        return apply_overrides(base, overrides)
    placeholder = attrs.evolve(base, finish_hook=FinishHookConfig(cmd="the code's on_finish command"))
    return attrs.evolve(apply_overrides(placeholder, overrides), finish_hook=None)


_EMPTY = EnvironmentLayer()
_last: tuple[tuple[Any, ...], EnvironmentLayer | ConfigError] | None = None


def read_environment(environ: Mapping[str, str] | None = None) -> EnvironmentLayer:
    """The environment's layer (``os.environ`` unless ``environ`` is given), cached.

    Raises ``ConfigError`` naming the variable when the file or an override is bad.

    >>> read_environment({}).is_empty
    True
    >>> read_environment({"TORCHSTEP_PROF_OVERRIDES": "finish_hook.cmd='echo hi'"}).sets_finish_hook
    True
    """
    global _last
    env = os.environ if environ is None else environ
    path = env.get(ENV_CONFIG) or None
    overrides_text = env.get(ENV_OVERRIDES, "").strip() or None
    if path is None and overrides_text is None:
        return _EMPTY
    if environ is None and not owns_environment():
        return _EMPTY  # inherited from the process that read it (docs/reliability.md, "Child processes")
    key = (path, _file_identity(path), overrides_text)
    last = _last
    if last is not None and last[0] == key:
        result = last[1]
    else:
        try:
            result = _parse(path, overrides_text)
        except ConfigError as exc:
            result = exc
        _last = (key, result)  # one tuple assignment: safe to race with another thread
    if isinstance(result, ConfigError):
        raise ConfigError(result.problems)  # a fresh exception: no traceback piling up
    return result


def summary_disabled() -> bool:
    """True when ``TORCHSTEP_PROF_SUMMARY`` is ``0``, ``false``, ``no`` or ``off`` (any case)."""
    return os.environ.get(ENV_SUMMARY, "").strip().lower() in _OFF_WORDS


def _file_identity(path: str | None) -> tuple[int, ...] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # load_config will say why; a file that appears later changes the key
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _parse(path: str | None, overrides_text: str | None) -> EnvironmentLayer:
    config = None
    problems: list[Problem] = []  # a bad file and bad overrides are reported together
    if path is not None:
        from .files import load_config

        try:
            config = load_config(path)
        except ConfigError as exc:
            problems += _from_variable(exc.problems, ENV_CONFIG, path)
    overrides: tuple[Override, ...] = ()
    if overrides_text is not None:
        overrides, found = _parse_overrides(overrides_text, config or ProfilerConfig())
        problems += found
    if problems:
        raise ConfigError(problems)
    return EnvironmentLayer(
        config_path=path,
        config=config,
        overrides=overrides,
        sets_finish_hook=_sets_finish_hook(config, overrides),
    )


def _parse_overrides(text: str, base: ProfilerConfig) -> tuple[tuple[Override, ...], list[Problem]]:
    """The overrides that parse, and the problems (naming the variable) of those that do not and
    of every bad value of the others, checked against ``base`` (the file's config, or the
    defaults) as ``apply_overrides`` does."""
    import shlex

    from .overrides import parse_each

    try:
        words = shlex.split(text)
    except ValueError as exc:
        return (), [Problem("", f"{ENV_OVERRIDES}: cannot split {text!r} like a shell command line ({exc})")]
    overrides, problems = parse_each(words)
    # Every value is checked now, also those of hook fields whose command the code's on_finish
    # gives later (deferred, not ignored: a bad one is an error at the first scope either way).
    try:
        _apply(base, overrides)
    except ConfigError as exc:
        problems += exc.problems
    return overrides, _from_variable(problems, ENV_OVERRIDES)


def _sets_finish_hook(config: ProfilerConfig | None, overrides: tuple[Override, ...]) -> bool:
    has_hook = config is not None and config.finish_hook is not None
    for override in overrides:
        if override.path[0] == "finish_hook":
            # `finish_hook=null` removes the hook; anything else sets (part of) one.
            has_hook = len(override.path) > 1 or override.value is not None
    return has_hook


def _from_variable(problems: Iterable[Problem], variable: str, value: str | None = None) -> list[Problem]:
    """``problems``, each saying which variable it came from.

    A problem with the whole file already names it; a key path gets ``VAR=value:`` in front.
    """
    keyed = f"{variable}={value}" if value is not None else variable
    return [
        Problem(f"{keyed}: {p.path}", p.message) if p.path else Problem("", f"{variable}: {p.message}")
        for p in problems
    ]


# --- who owns the environment's configuration (docs/reliability.md, "Child processes") ---------

_ownership: tuple[tuple[Any, ...], bool] | None = None


def owns_environment(environ: dict[str, str] | None = None) -> bool:
    """Whether this process may use ``TORCHSTEP_PROF_CONFIG`` / ``_OVERRIDES``.

    The first process that reads them (at ``import torchstep_prof`` or its first scope) owns
    them and marks ``os.environ`` with ``TORCHSTEP_PROF_OWNER=<pid>:<digest>``, which its
    children inherit: a child (DataLoader worker, ``multiprocessing`` child, a finish hook's
    command) sees the mark of another pid over the same values and ignores them, unless
    ``TORCHSTEP_PROF_CHILDREN=1``. A launcher that never imports torchstep_prof (torchrun)
    leaves no mark: each of its ranks owns what it reads. Values that differ from the mark's
    (a child given its own configuration) belong to the child.

    >>> env = {"TORCHSTEP_PROF_OVERRIDES": "schedule.steps=[2]"}
    >>> owns_environment(env), env["TORCHSTEP_PROF_OWNER"].startswith(f"{os.getpid()}:")
    (True, True)
    >>> owns_environment({**env, "TORCHSTEP_PROF_OWNER": "1:" + env["TORCHSTEP_PROF_OWNER"].split(":")[1]})
    False
    """
    global _ownership
    env = os.environ if environ is None else environ
    path = env.get(ENV_CONFIG) or ""
    overrides = env.get(ENV_OVERRIDES, "").strip()
    if not path and not overrides:
        return True
    key = (os.getpid(), path, overrides, env.get(ENV_OWNER), env.get(ENV_CHILDREN))
    cached = _ownership
    if environ is None and cached is not None and cached[0] == key:
        return cached[1]
    import zlib

    digest = format(zlib.crc32("\0".join((path, overrides)).encode()), "08x")
    mark = env.get(ENV_OWNER, "")
    if env.get(ENV_CHILDREN, "").strip() == "1":
        owned = True
    elif mark.partition(":")[2] != digest:  # no mark, or a mark for other values: ours now
        env[ENV_OWNER] = f"{os.getpid()}:{digest}"
        owned = True
    else:
        owned = mark.partition(":")[0] == str(os.getpid())
    if environ is None:
        _ownership = ((os.getpid(), path, overrides, env.get(ENV_OWNER), env.get(ENV_CHILDREN)), owned)
    return owned


owns_environment()  # at import: before this process starts any child
