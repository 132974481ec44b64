"""The configuration model: frozen attrs classes holding data and validation only.

Every class validates all of its fields at construction and raises one ``ConfigError`` listing
every problem (``schedule.wait: must be >= 0 (got -1)``). Change a config with
``attrs.evolve``; turn it to and from dicts and files with :mod:`torchstep_prof.config.converter`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Optional, Tuple, Union

import attrs

from ..errors import ConfigError, Problem

__all__ = [
    "CONTENT_NAMES", "AutoTraceConfig", "FinishHookConfig", "MetricsConfig", "OnDemandConfig", "ProfilerConfig",
    "ScheduleConfig", "SpansConfig", "StallConfig",
]  # fmt: skip

CONTENT_NAMES: tuple[str, ...] = (
    "cpu",
    "cuda",
    "memory",
    "shapes",
    "stack",
    "flops",
    "modules",
    "nvtx",
    "memory_snapshot",
)
"""What a trace can hold, as named in ``contents``."""

DEFAULT_SAVE_PATH = "outputs/profile"


# --- field converters: accept the natural Python spellings, keep the stored value hashable ----


def _tuple_or_none(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else value


def _path_text(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _paths(value: Any) -> Any:
    if isinstance(value, (str, os.PathLike)):
        return (os.fspath(value),)
    if isinstance(value, (list, tuple)):
        return tuple(_path_text(v) for v in value)
    return value


# --- checks: each returns the problems it found, so a class can report all at once -----------

_Check = Callable[[str, Any], "list[Problem]"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(minimum: int) -> _Check:
    def check(key: str, value: Any) -> list[Problem]:
        if not _is_int(value):
            return [Problem(key, f"must be an integer (got {value!r})")]
        if value < minimum:
            return [Problem(key, f"must be >= {minimum} (got {value!r})")]
        return []

    return check


def _seconds(*, allow_zero: bool) -> _Check:
    def check(key: str, value: Any) -> list[Problem]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [Problem(key, f"must be a number of seconds (got {value!r})")]
        if isinstance(value, float) and not math.isfinite(value):
            return [Problem(key, f"must be a finite number of seconds (got {value!r})")]
        if value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            return [Problem(key, f"must be {bound} (got {value!r})")]
        return []

    return check


def _bool(key: str, value: Any) -> list[Problem]:
    if not isinstance(value, bool):
        return [Problem(key, f"must be true or false (got {value!r})")]
    return []


def _text(key: str, value: Any) -> list[Problem]:
    if not isinstance(value, str) or not value:
        return [Problem(key, f"must be a non-empty string (got {value!r})")]
    return []


# Torch writes the trace's own path (traceName) into the JSON with its weak escaping, and a newline
# breaks the export: such a folder is refused up front, not failed later as a write blamed on the disk.
_PATH_FORBIDDEN = frozenset('"\\') | frozenset(map(chr, range(0x20))) | frozenset(map(chr, range(0x7F, 0xA0)))


def _save_path(key: str, value: Any) -> list[Problem]:
    found = _text(key, value)
    if found:
        return found
    bad = sorted({ch for ch in value if ch in _PATH_FORBIDDEN})
    if bad:
        listed = ", ".join(repr(ch) for ch in bad)
        return [
            Problem(
                key, f"must not hold {listed} (got {value!r}; allowed: a path without '\"', '\\' or control characters)"
            )
        ]
    return []


def _optional(check: _Check) -> _Check:
    return lambda key, value: [] if value is None else check(key, value)


def _at_most(check: _Check, most: float, unit: str = "") -> _Check:
    def bounded(key: str, value: Any) -> list[Problem]:
        found = check(key, value)
        if not found and value > most:
            found.append(Problem(key, f"must be at most {most:g}{unit} (got {value!r})"))
        return found

    return bounded


# A list of integers >= 0 (steps, ranks), none repeated.
def _int_list(*, non_empty: bool) -> _Check:
    item_check = _int_at_least(0)

    def check(key: str, value: Any) -> list[Problem]:
        if not isinstance(value, tuple):
            return [Problem(key, f"must be a list of integers (got {value!r})")]
        if non_empty and not value:
            return [Problem(key, "must list at least one value (got [])")]
        found = [p for i, item in enumerate(value) for p in item_check(f"{key}[{i}]", item)]
        if not found and len(set(value)) != len(value):
            repeated = sorted({v for v in value if value.count(v) > 1})
            found.append(Problem(key, f"must not repeat a value (got {list(value)}; repeated {repeated})"))
        return found

    return check


def _validate(instance: Any, checks: dict[str, _Check]) -> list[Problem]:
    return [p for name, check in checks.items() for p in check(name, getattr(instance, name))]


def _raise_if(problems: list[Problem]) -> None:
    if problems:
        raise ConfigError(problems)


# --- the model ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ScheduleConfig:
    """Which steps are profiled.

    Either an explicit list of step numbers (integers >= 0), ``ScheduleConfig(steps=(0, 3))``,
    or torch.profiler's cycle: skip ``skip_first`` steps, then ``repeat`` cycles of ``wait``
    idle, ``warmup`` traced-and-discarded and ``active`` recorded steps (``repeat=0`` cycles for
    as long as the scope lasts). The cycle counts steps from 1: step 1 is its first step, and a
    step 0 is selected only by an explicit list.

    >>> ScheduleConfig(skip_first=1, wait=1, warmup=1, active=2, repeat=2).active
    2
    """

    steps: Optional[Tuple[int, ...]] = attrs.field(default=None, converter=_tuple_or_none)
    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 1

    def __attrs_post_init__(self) -> None:
        problems = _validate(
            self,
            {
                "steps": _optional(_int_list(non_empty=True)),
                "skip_first": _int_at_least(0),
                "wait": _int_at_least(0),
                "warmup": _int_at_least(0),
                "active": _int_at_least(1),
                "repeat": _int_at_least(0),
            },
        )
        if self.steps is not None:
            # An explicit list and a cycle would contradict each other; say so instead of
            # silently ignoring one of them.
            for name, default in (("skip_first", 0), ("wait", 0), ("warmup", 0), ("active", 1), ("repeat", 1)):
                value = getattr(self, name)
                if value != default and not any(p.path == name for p in problems):
                    problems.append(
                        Problem(
                            name,
                            f"cannot be combined with an explicit steps list (got {value!r}; "
                            f"leave it at {default} or set steps to null)",
                        )
                    )
        _raise_if(problems)


DEFAULT_HOOK_TIMEOUT_S = 600.0
"""How long a finish-hook command may run unless ``timeout_s`` says otherwise."""


def _hook_timeout(key: str, value: Any) -> list[Problem]:
    if value is None:
        return [
            Problem(
                key,
                f"must be a number of seconds > 0 (got None; a hook always has a time limit, "
                f"{DEFAULT_HOOK_TIMEOUT_S:g} by default: set a larger one for a long upload)",
            )
        ]
    return _seconds(allow_zero=False)(key, value)


@attrs.frozen(kw_only=True)
class FinishHookConfig:
    """The command run once when profiling is finished (see ``on_finish``).

    ``cmd`` as a string runs through ``/bin/sh -c``; as a list it runs without a shell.

    >>> FinishHookConfig(cmd=["echo", "done"], timeout_s=60).cmd
    ('echo', 'done')
    """

    cmd: Union[str, Tuple[str, ...]] = attrs.field(converter=_tuple_or_none)
    ranks: Optional[Tuple[int, ...]] = attrs.field(default=None, converter=_tuple_or_none)
    all_ranks: bool = False
    per_node: bool = False
    node_wait_s: float = 300.0
    # Finite: a hung command must never keep a finished job (and its allocation) alive.
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S
    relocate: Tuple[str, ...] = attrs.field(default=(), converter=_paths)
    wait: bool = False  # True: the block whose exit triggers the hook waits for the command

    def __attrs_post_init__(self) -> None:
        problems = _validate(
            self,
            {
                "cmd": _check_command,
                "ranks": _optional(_int_list(non_empty=False)),
                "all_ranks": _bool,
                "per_node": _bool,
                "wait": _bool,
                "node_wait_s": _seconds(allow_zero=True),
                "timeout_s": _hook_timeout,
            },
        )
        if not isinstance(self.relocate, tuple):
            problems.append(Problem("relocate", f"must be a list of directories (got {self.relocate!r})"))
        else:
            problems += [p for i, d in enumerate(self.relocate) for p in _text(f"relocate[{i}]", d)]
        _raise_if(problems)


def _check_command(key: str, cmd: Any) -> list[Problem]:
    if isinstance(cmd, str):
        return [] if cmd.strip() else [Problem(key, f"must be a non-empty command (got {cmd!r})")]
    if isinstance(cmd, tuple):
        if not cmd:
            return [Problem(key, "must be a non-empty command (got [])")]
        wrong = [
            Problem(f"{key}[{i}]", f"must be a string (got {arg!r})")
            for i, arg in enumerate(cmd)
            if not isinstance(arg, str)
        ]
        if wrong:
            return wrong
        return [] if cmd[0] else [Problem(f"{key}[0]", "must name a program (got '')")]
    return [Problem(key, f"must be a string or a list of strings (got {cmd!r})")]


@attrs.frozen(kw_only=True)
class OnDemandConfig:
    """Opt in to on-demand traces: a thread polls ``dir`` every ``poll_s`` seconds for a request
    written by ``torchstep-prof trigger DIR`` (and writes this rank's current step there).

    >>> OnDemandConfig(dir="/shared/job7/on_demand", poll_s=2).poll_s
    2
    """

    dir: str = attrs.field(converter=_path_text)
    poll_s: float = 1.0

    def __attrs_post_init__(self) -> None:
        _raise_if(_validate(self, {"dir": _save_path, "poll_s": _poll_seconds}))


MAX_POLL_S = 3600.0
"""The longest ``on_demand.poll_s``: a job that polls less often than hourly cannot serve requests."""


_poll_seconds = _at_most(_seconds(allow_zero=False), MAX_POLL_S, " seconds")


DEFAULT_METRICS_PORT = 18400
"""The default base port of the metrics endpoint (``port + LOCAL_RANK`` per process)."""

# Prometheus' default histogram buckets (seconds), less its 10 s top, plus longer steps.
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def _port(key: str, value: Any) -> list[Problem]:
    if not _is_int(value) or not 0 <= value <= 65535:
        return [Problem(key, f"must be a TCP port, an integer from 0 to 65535 (got {value!r}; 0: any free port)")]
    return []


def _address(key: str, value: Any) -> list[Problem]:
    import ipaddress

    if isinstance(value, str) and value:
        try:
            ipaddress.ip_address(value)
            return []
        except ValueError:
            if _is_host_name(value):
                return []  # a host name this machine resolves (checked when the endpoint starts)
    return [
        Problem(key, f"must be an IP address or a host name to listen on (got {value!r}; e.g. 0.0.0.0, 127.0.0.1, ::)")
    ]


def _is_host_name(text: str) -> bool:
    """A host name as RFC 1123 spells one: dot-separated labels of letters, digits and inner
    hyphens, the last one not all digits (``999.1.2.3`` is a bad address, not a name)."""
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    if len(text) > 253 or labels[-1].isdigit():
        return False
    return all(
        0 < len(label) <= 63 and label.isascii() and label.replace("-", "").isalnum() and label[0] != "-" != label[-1]
        for label in labels
    )


def _buckets(key: str, value: Any) -> list[Problem]:
    allowed = "a non-empty list of increasing upper bounds in seconds, each > 0"
    if not isinstance(value, tuple) or not value:
        return [Problem(key, f"must be {allowed} (got {value!r})")]
    found = [
        Problem(f"{key}[{i}]", f"must be a finite number of seconds > 0 (got {item!r})")
        for i, item in enumerate(value)
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item) or item <= 0
    ]
    if not found and any(b <= a for a, b in zip(value, value[1:])):
        found.append(Problem(key, f"must be {allowed}: sorted, no repeats (got {list(value)})"))
    return found


@attrs.frozen(kw_only=True)
class MetricsConfig:
    """Always-on region metrics for Prometheus (see ``tsp.metrics``): every region and step
    records its wall time, profiled or not, served at ``http://<addr>:<port + LOCAL_RANK>/metrics``.

    >>> MetricsConfig(port=18400, buckets=[0.01, 0.1, 1]).buckets
    (0.01, 0.1, 1)
    """

    enable: bool = True
    # The base port: each process serves port + its local rank. Not in 9100-9999, Prometheus'
    # exporter range (dcgm-exporter, on the GPU nodes this runs on, takes 9400 there).
    port: int = DEFAULT_METRICS_PORT
    addr: str = "0.0.0.0"
    buckets: Tuple[float, ...] = attrs.field(default=DEFAULT_BUCKETS, converter=_tuple_or_none)

    def __attrs_post_init__(self) -> None:
        _raise_if(_validate(self, {"enable": _bool, "port": _port, "addr": _address, "buckets": _buckets}))


def _over_one(key: str, value: Any) -> list[Problem]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return [Problem(key, f"must be a finite number > 1 (got {value!r})")]
    if value <= 1:
        return [Problem(key, f"must be > 1 (got {value!r})")]
    return []


def _watched(key: str, value: Any) -> list[Problem]:
    if isinstance(value, str) and (value == "step" or all(value.partition("/")[::2])):
        return []
    return [Problem(key, f"must be 'step', or a region as '<role>/<stage>' (got {value!r})")]


def _milliseconds(key: str, value: Any) -> list[Problem]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return [Problem(key, f"must be a finite number of milliseconds >= 0 (got {value!r})")]
    return []


@attrs.frozen(kw_only=True)
class AutoTraceConfig:
    """Trace slow steps by themselves (docs/auto-trace.md): a step (``on: step``) or a region
    (``on: "<role>/<stage>"``) over ``factor`` x its rolling median and ``min_ms`` over it, once
    ``baseline_steps`` are in, makes this rank trace its next ``next`` steps and ask ``peers``
    ranks that did not slow to trace them too; within ``cooldown_steps``, ``max_traces_per_hour``
    and ``max_bytes`` per job. Needs the ``metrics`` and ``on_demand`` sections.

    >>> AutoTraceConfig(factor=3, next=1).baseline_steps
    50
    """

    on: str = "step"
    factor: float = 2.0
    min_ms: float = 10.0
    baseline_steps: int = 50
    next: int = 2
    peers: int = 1
    cooldown_steps: int = 200
    max_traces_per_hour: int = 6
    max_bytes: int = 1 << 30

    def __attrs_post_init__(self) -> None:
        _raise_if(
            _validate(
                self,
                {
                    "on": _watched,
                    "factor": _over_one,
                    "min_ms": _milliseconds,
                    "baseline_steps": _int_at_least(3),
                    "next": _at_most(_int_at_least(1), 100),  # an on-demand request's most steps
                    "peers": _int_at_least(0),
                    "cooldown_steps": _int_at_least(0),
                    "max_traces_per_hour": _int_at_least(1),
                    "max_bytes": _int_at_least(1),
                },
            )
        )


# --- stall: live status and the stall detector (docs/stall.md) ----------------------------------


@attrs.frozen(kw_only=True)
class StallConfig:
    """Keep this rank's live status in ``dir`` (``torchstep-prof status DIR``) and call a step
    stalled after ``after_s`` seconds without progress (unset: ``factor`` times the slowest recent
    step, at least ``floor_s``); a stalled rank writes ``stall-rank<R>.txt`` once, warns and runs
    ``cmd`` (at most ``timeout_s`` seconds, as a finish hook). ``dir`` unset: the ``on_demand``
    folder, else ``<save_path>/status``.

    >>> StallConfig(after_s=600, cmd="page-oncall").after_s
    600
    """

    dir: Optional[str] = attrs.field(default=None, converter=_path_text)
    after_s: Optional[float] = None
    factor: float = 10.0
    floor_s: float = 300.0
    poll_s: float = 1.0
    cmd: Optional[Union[str, Tuple[str, ...]]] = attrs.field(default=None, converter=_tuple_or_none)
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S

    def __attrs_post_init__(self) -> None:
        _raise_if(
            _validate(
                self,
                {
                    "dir": _optional(_save_path),
                    "after_s": _optional(_seconds(allow_zero=False)),
                    "factor": _stall_factor,
                    "floor_s": _seconds(allow_zero=False),
                    "poll_s": _poll_seconds,
                    "timeout_s": _hook_timeout,
                    "cmd": _optional(_check_command),
                },
            )
        )


def _stall_factor(key: str, value: Any) -> list[Problem]:
    problems = _seconds(allow_zero=False)(key, value)
    if problems or value < 1:
        return [Problem(key, f"must be a number >= 1, times the slowest recent step (got {value!r})")]
    return []


@attrs.frozen(kw_only=True)
class SpansConfig:
    """The span log (see ``tsp.spans``): every region and step block, profiled or not, appends
    its start and end to one small file per process in ``dir``, read by ``torchstep-prof timeline``.

    >>> SpansConfig(dir="/shared/job7/spans").enable
    True
    """

    dir: str = attrs.field(converter=_path_text)
    enable: bool = True

    def __attrs_post_init__(self) -> None:
        _raise_if(_validate(self, {"dir": _save_path, "enable": _bool}))


def _check_contents(key: str, value: Any) -> list[Problem]:
    if not isinstance(value, tuple):
        return [Problem(key, f"must be a list of names from {', '.join(CONTENT_NAMES)} (got {value!r})")]
    return [
        Problem(key, f"{item!r} is not one of {', '.join(CONTENT_NAMES)}")
        for item in value
        if item not in CONTENT_NAMES
    ]


def _check_role(key: str, value: Any) -> list[Problem]:
    # Any text names a file (naming.py encodes one with nothing left after sanitizing).
    if not isinstance(value, str) or not value:
        return [Problem(key, f"must be a non-empty string or null (got {value!r})")]
    return []


@attrs.frozen(kw_only=True)
class ProfilerConfig:
    """Everything torchstep_prof needs to know; the scopes each set some of these fields.

    >>> cfg = ProfilerConfig(schedule=ScheduleConfig(steps=(1, 3)), ranks=(0, 2))
    >>> cfg.save_path, cfg.discrete
    ('outputs/profile', True)
    """

    enable: bool = True
    save_path: str = attrs.field(default=DEFAULT_SAVE_PATH, converter=_path_text)
    discrete: bool = True
    gzip: bool = False
    summary: bool = True
    process_role: Optional[str] = None
    ranks: Tuple[int, ...] = attrs.field(default=(0,), converter=_tuple)
    all_ranks: bool = False
    contents: Tuple[str, ...] = attrs.field(default=(), converter=_tuple)
    schedule: Optional[ScheduleConfig] = None
    finish_hook: Optional[FinishHookConfig] = None
    on_demand: Optional[OnDemandConfig] = None
    metrics: Optional[MetricsConfig] = None
    auto_trace: Optional[AutoTraceConfig] = None
    stall: Optional[StallConfig] = None
    spans: Optional[SpansConfig] = None

    def __attrs_post_init__(self) -> None:
        problems = _validate(
            self,
            {
                "enable": _bool,
                "save_path": _save_path,
                "discrete": _bool,
                "gzip": _bool,
                "summary": _bool,
                "process_role": _optional(_check_role),
                "ranks": _int_list(non_empty=False),
                "all_ranks": _bool,
                "contents": _check_contents,
            },
        )
        for name, cls in (
            ("schedule", ScheduleConfig),
            ("finish_hook", FinishHookConfig),
            ("on_demand", OnDemandConfig),
            ("metrics", MetricsConfig),
            ("auto_trace", AutoTraceConfig),
            ("stall", StallConfig),
            ("spans", SpansConfig),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                problems.append(Problem(name, f"must be a {cls.__name__} or null (got {value!r})"))
        _raise_if(problems)
