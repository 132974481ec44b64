"""Composable configuration scopes: schedule, ranks, contents, on_finish, on_demand, stall, metrics, spans, auto_trace, configure.

Each scope pushes a frame (``selection/frames.py``) for its block and tells the engine it was entered
(the metrics endpoint and span log start, warm up) and exited (finish hooks, missed steps).
Scopes are entered rarely, so they are generator context managers: that makes each one usable
as a decorator for free.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar, Union, cast

from ._wrapping import around_each_call
from .config._scope_fields import evolve_checked
from .config.model import (
    AutoTraceConfig,
    DEFAULT_BUCKETS,
    DEFAULT_HOOK_TIMEOUT_S,
    DEFAULT_METRICS_PORT,
    FinishHookConfig,
    MetricsConfig,
    OnDemandConfig,
    ProfilerConfig,
    ScheduleConfig,
    SpansConfig,
    StallConfig,
)
from .engine import ENGINE, scope_opted_out
from .errors import ConfigError, Problem
from .selection.frames import _STACK, current_frame, frame_for

__all__ = [
    "Scope",
    "auto_trace",
    "configure",
    "contents",
    "effective_config",
    "metrics",
    "on_demand",
    "on_finish",
    "ranks",
    "schedule",
    "spans",
    "stall",
]


F = TypeVar("F", bound=Callable[..., Any])

# The entries of Scope objects in this context (scope, its entered manager), innermost last:
# kept per context so that one scope object entered in two threads or tasks exits each its own.
_ENTERED: contextvars.ContextVar[tuple[tuple[Scope, contextlib.AbstractContextManager[ProfilerConfig]], ...]] = (
    contextvars.ContextVar("torchstep_prof_entered_scopes", default=())
)


class Scope:
    """What each scope function returns: a context manager (``as`` gets the config in force
    inside), and a decorator of functions and coroutine functions (contextlib's decorators would
    exit before a coroutine runs).

    >>> import torchstep_prof as tsp
    >>> @tsp.schedule(steps=[2])
    ... def train():
    ...     return tsp.effective_config().schedule.steps
    >>> train()
    (2,)
    """

    __slots__ = ("_fields",)

    def __init__(self, fields: dict[str, Any] | ProfilerConfig, problems: Sequence[Problem] = ()) -> None:
        if not isinstance(fields, ProfilerConfig):
            # A bad key or value fails at the call, not at entry, all problems in one error.
            evolve_checked(ProfilerConfig(), fields, list(problems))
        self._fields = fields

    def __enter__(self) -> ProfilerConfig:
        entered = _pushed(self._fields)
        config = entered.__enter__()
        _ENTERED.set(_ENTERED.get() + ((self, entered),))
        return config

    def __exit__(self, *exc_info: Any) -> Optional[bool]:
        stack = _ENTERED.get()
        for index in range(len(stack) - 1, -1, -1):
            if stack[index][0] is self:
                _ENTERED.set(stack[:index] + stack[index + 1 :])
                return stack[index][1].__exit__(*exc_info)
        raise RuntimeError("torchstep_prof: a scope was exited in a context that did not enter it")

    def __call__(self, fn: F) -> F:
        fields = self._fields
        return around_each_call(  # type: ignore[no-any-return]
            fn, lambda: _pushed(fields), "a torchstep_prof scope", "Use the scope as a `with` block inside it."
        )


@contextlib.contextmanager
def _pushed(fields: dict[str, Any] | ProfilerConfig) -> Iterator[ProfilerConfig]:
    parent = current_frame()
    base = _CODE_CONFIG.get(ProfilerConfig())
    code_config = fields if isinstance(fields, ProfilerConfig) else evolve_checked(base, fields)
    sets_hook = isinstance(fields, ProfilerConfig) or "finish_hook" in fields
    frame = frame_for(code_config, parent, sets_hook)
    ENGINE.frame_in_force(frame)  # the metrics endpoint, the span log: started before the push
    frame_token = _STACK.set(frame)
    code_token = _CODE_CONFIG.set(code_config)
    ENGINE.prepare(frame)
    try:
        yield frame.config
    finally:
        _CODE_CONFIG.reset(code_token)
        _STACK.reset(frame_token)
        try:
            ENGINE.scope_exited(frame, parent)
        finally:
            scope_opted_out(frame, parent)  # the scope that opted in stops the poll thread and live status


def _section(key: str, cls: Callable[..., Any], **values: Any) -> Scope:
    """A scope setting the section ``key``; its problems named as the config file names them
    (``schedule.wait``)."""
    try:
        config = cls(**values)
    except ConfigError as exc:
        raise exc.under(key) from None
    return Scope({key: config})


# The code's config at each depth, kept beside the frames so that the environment layer is
# applied exactly once on top of it (never to an already-overridden config).
_CODE_CONFIG: contextvars.ContextVar[ProfilerConfig] = contextvars.ContextVar("torchstep_prof_code_config")


def effective_config() -> ProfilerConfig:
    """The configuration a region entered here would use (scopes and environment applied).

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[2]):
    ...     tsp.effective_config().schedule.steps
    (2,)
    """
    return current_frame().config


def schedule(
    steps: Optional[Sequence[int]] = None,
    *,
    skip_first: int = 0,
    wait: int = 0,
    warmup: int = 0,
    active: int = 1,
    repeat: int = 1,
) -> Scope:
    """Profile chosen steps: an explicit list of step numbers (>= 0), or torch.profiler's cycle,
    which counts steps from 1 (a step 0 is selected only by an explicit list).

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[0, 3]):          # steps 0 and 3
    ...     pass
    >>> with tsp.schedule(wait=1, warmup=1, active=2, repeat=0):  # 3,4 then 7,8 then ...
    ...     pass
    """
    if isinstance(steps, Sequence) and not isinstance(steps, (str, bytes)):
        steps = tuple(steps)  # range(0, 10, 2) too
    return _section(
        "schedule",
        ScheduleConfig,
        steps=steps,
        skip_first=skip_first,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
    )


def ranks(*ranks: Union[int, Sequence[int]], all_ranks: bool = False) -> Scope:
    """Profile on chosen global ranks (default: rank 0), or on every rank.

    >>> import torchstep_prof as tsp
    >>> with tsp.ranks(0, 2):
    ...     pass
    >>> with tsp.ranks(all_ranks=True):
    ...     pass
    """
    chosen: tuple[Any, ...] = ranks
    if len(ranks) == 1 and isinstance(ranks[0], (list, tuple, range)):
        chosen = tuple(ranks[0])
    problems: list[Problem] = []
    if not chosen and all_ranks is False:
        problems.append(Problem("ranks", "name at least one rank, or pass all_ranks=True (got none)"))
    return Scope({"ranks": chosen or (0,), "all_ranks": all_ranks}, problems)


def contents(*items: str) -> Scope:
    """Choose what traces hold: any of cpu, cuda, memory, shapes, stack, flops, modules, nvtx, memory_snapshot.

    >>> import torchstep_prof as tsp
    >>> with tsp.contents("cpu", "shapes", "memory"):
    ...     pass
    """
    chosen: tuple[Any, ...] = items
    if len(items) == 1 and isinstance(items[0], (list, tuple)):
        chosen = tuple(items[0])
    return Scope({"contents": chosen})


def on_finish(
    cmd: Union[str, Sequence[str]],
    *,
    ranks: Optional[Sequence[int]] = None,
    all_ranks: bool = False,
    per_node: bool = False,
    node_wait_s: float = 300.0,
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S,
    relocate: Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]]] = (),
    wait: bool = False,
) -> Scope:
    """Run ``cmd`` once on each selected rank when profiling under this scope is finished; it
    never runs longer than ``timeout_s`` (600 s by default), even if the training process is
    killed meanwhile.

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[1]), tsp.on_finish('upload-tool "$TORCHSTEP_PROF_SAVE_PATH"'):  # doctest: +SKIP
    ...     train()
    """
    return _section(
        "finish_hook",
        FinishHookConfig,
        cmd=cmd,
        ranks=ranks,
        all_ranks=all_ranks,
        per_node=per_node,
        node_wait_s=node_wait_s,
        timeout_s=timeout_s,
        relocate=relocate,
        wait=wait,
    )


def on_demand(dir: Union[str, os.PathLike[str]], *, poll_s: float = 1.0) -> Scope:
    """Serve on-demand trace requests (``torchstep-prof trigger DIR``) while this scope lasts: a
    background thread polls ``dir`` every ``poll_s`` seconds and writes this rank's step there.

    >>> import torchstep_prof as tsp
    >>> with tsp.on_demand("/shared/job7/on_demand", poll_s=2):   # doctest: +SKIP
    ...     train()
    """
    return _section("on_demand", OnDemandConfig, dir=dir, poll_s=poll_s)


def stall(
    dir: Union[str, os.PathLike[str], None] = None,
    *,
    after_s: Optional[float] = None,
    factor: float = 10.0,
    floor_s: float = 300.0,
    poll_s: float = 1.0,
    cmd: Union[str, Sequence[str], None] = None,
    timeout_s: float = DEFAULT_HOOK_TIMEOUT_S,
) -> Scope:
    """Keep this rank's live status in ``dir`` while this scope lasts (``torchstep-prof status
    DIR`` shows every rank), and report a stall: no new step for ``after_s`` seconds (unset:
    ``factor`` times the slowest recent step, at least ``floor_s``) writes ``stall-rank<R>.txt``
    once, warns and runs ``cmd`` (docs/stall.md). It never stops or slows the job.

    >>> import torchstep_prof as tsp
    >>> with tsp.stall("/shared/job7/status", after_s=600, cmd="page-oncall"):   # doctest: +SKIP
    ...     train()
    """
    return _section(
        "stall",
        StallConfig,
        dir=dir,
        after_s=after_s,
        factor=factor,
        floor_s=floor_s,
        poll_s=poll_s,
        cmd=cmd,
        timeout_s=timeout_s,
    )


def metrics(
    port: int = DEFAULT_METRICS_PORT,
    *,
    addr: str = "0.0.0.0",
    buckets: Sequence[float] = DEFAULT_BUCKETS,
    enable: bool = True,
) -> Scope:
    """Time every region and step for Prometheus, profiled or not, served at
    ``http://<addr>:<port + LOCAL_RANK>/metrics`` (one endpoint per process, from the first
    scope that turns metrics on; needs the ``[metrics]`` extra). ``addr="0.0.0.0"`` lets any
    host that reaches this one read the timings; ``127.0.0.1`` only this host (docs/metrics.md).

    >>> import torchstep_prof as tsp
    >>> with tsp.metrics(port=18400):            # doctest: +SKIP
    ...     with tsp.step(1), tsp.profile_region("actor", "update"):
    ...         pass
    """
    return _section(
        "metrics",
        MetricsConfig,
        port=port,
        addr=addr,
        buckets=buckets,
        enable=enable,
    )


def spans(dir: Union[str, os.PathLike[str]], *, enable: bool = True) -> Scope:
    """Log every region's and step's start and end, profiled or not, to one small file per
    process in ``dir`` (appended twice a second, off the training thread), for
    ``torchstep-prof timeline DIR`` (docs/timeline.md).

    >>> import torchstep_prof as tsp
    >>> with tsp.spans("/shared/job7/spans"):      # doctest: +SKIP
    ...     with tsp.step(1), tsp.profile_region("actor", "update"):
    ...         pass
    """
    return _section("spans", SpansConfig, dir=dir, enable=enable)


def auto_trace(
    on: str = "step",
    *,
    factor: float = 2.0,
    min_ms: float = 10.0,
    baseline_steps: int = 50,
    next: int = 2,
    peers: int = 1,
    cooldown_steps: int = 200,
    max_traces_per_hour: int = 6,
    max_bytes: int = 1 << 30,
) -> Scope:
    """Trace slow steps by themselves while this scope lasts: a step (or the region
    ``"<role>/<stage>"``) over ``factor`` x its rolling median, and ``min_ms`` over it, makes this
    rank trace its next ``next`` steps and ask ``peers`` ranks that did not slow to trace them
    too. Inside ``tsp.metrics`` and ``tsp.on_demand`` scopes (it reads their timings and folder).

    >>> import torchstep_prof as tsp
    >>> with tsp.metrics(), tsp.on_demand("/shared/job7/on_demand"), tsp.auto_trace(factor=3):  # doctest: +SKIP
    ...     train()
    """
    return _section(
        "auto_trace",
        AutoTraceConfig,
        on=on,
        factor=factor,
        min_ms=min_ms,
        baseline_steps=baseline_steps,
        next=next,
        peers=peers,
        cooldown_steps=cooldown_steps,
        max_traces_per_hour=max_traces_per_hour,
        max_bytes=max_bytes,
    )


def configure(config: Union[ProfilerConfig, str, os.PathLike[str], None] = None, **fields: Any) -> Scope:
    """Set any field (``save_path``, ``discrete``, ``gzip``, ...); a whole ``ProfilerConfig`` or a
    config file path sets every field, and ``fields`` then apply on top.

    >>> import torchstep_prof as tsp
    >>> with tsp.configure(save_path="/tmp/prof", gzip=True):
    ...     pass
    """
    if config is None:
        return Scope(fields)
    problems: list[Problem] = []
    if isinstance(config, (str, os.PathLike)):
        from .config.files import load_config

        try:
            config = load_config(config)
        except ConfigError as exc:
            problems += exc.problems
    elif not isinstance(config, ProfilerConfig):
        problems.append(
            Problem("config", f"must be a ProfilerConfig, the path of a config file or None (got {config!r})")
        )
    if problems:  # the fields are still checked, against the defaults, for the same error
        evolve_checked(ProfilerConfig(), fields, problems)
    loaded = cast(ProfilerConfig, config)  # anything else was reported above
    return Scope(evolve_checked(loaded, fields) if fields else loaded)
