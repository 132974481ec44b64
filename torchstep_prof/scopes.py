"""Composable configuration scopes: ``schedule()``, ``ranks()``, ``contents()``, ``on_finish()``,
``configure()``.

Each scope pushes a frame onto a stack held in a ``ContextVar`` (threads and asyncio tasks see
their own stack). A frame stores the effective config, computed once when the scope is entered
(innermost field wins, the environment's word on top), so a region only reads one attribute to
know whether there is anything to do. Scopes are entered rarely, so they are generator context
managers: that makes each one usable as a decorator for free.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
import threading
from typing import Any, Iterator, Optional, Sequence, Union, cast

from ._scope_fields import evolve_checked
from ._wrapping import around_each_call
from .config import FinishHookConfig, ProfilerConfig, ScheduleConfig
from .errors import ConfigError, Problem
from .missed_steps import ScheduleScope
from .selection import StepAction, explicit_steps, rank_selected, step_action
from .topology import current_topology, default_group

__all__ = [
    "configure",
    "contents",
    "effective_config",
    "on_finish",
    "ranks",
    "schedule",
]


class HookScope:
    """The mutable state of one ``on_finish`` scope: what it collected, and whether it ran.

    Created when a scope sets ``finish_hook`` (or, for a hook set only through the environment,
    once per process). ``parent`` is the enclosing hook scope: a trace written under an inner
    scope is also under the outer one.
    """

    _ordinals: dict[Any, Iterator[int]] = {}
    _ordinals_lock = threading.Lock()

    def __init__(self, config: ProfilerConfig, parent: Optional[HookScope]) -> None:
        self.config = config
        self.parent = parent
        self.lock = threading.Lock()
        self.finished = False  # profiling under it is over: its hook has been started or skipped
        self.profiled = False  # this rank profiled a step under it (it then runs the hook)
        self.hook_started = False  # the traces below were handed to the command
        self.traces: list[str] = []
        self.roles: list[str] = []
        # Local ranks of one node must agree on which scope they finish, without talking to
        # each other: the n-th per-node hook scope of each process is the same one (SPEC.md:
        # every local rank enters the same on_finish scopes). Not keyed on the command, which
        # may well name the rank.
        hook = config.finish_hook
        key = "per-node" if hook is not None and hook.per_node else "local"
        with HookScope._ordinals_lock:
            counter = HookScope._ordinals.setdefault(key, itertools.count(1))
            self.scope_id = f"{key}-{next(counter)}"

    def chain(self) -> Iterator[HookScope]:
        scope: Optional[HookScope] = self
        while scope is not None:
            yield scope
            scope = scope.parent

    def add_trace(self, path: str, roles: Sequence[str]) -> None:
        for scope in self.chain():
            with scope.lock:
                if scope.hook_started:
                    # A step entered again after the hook ran (numbering restarted per epoch, a
                    # retried step): the hook's list stays what it was; the summary says so.
                    from .record_store import STORE

                    STORE.add_attention(
                        f"after-hook:{path}",
                        f"written after its finish hook ran (the hook never saw it): {os.path.basename(path)}",
                    )
                    continue
                scope.traces.append(path)
                scope.roles.extend(r for r in roles if r not in scope.roles)

    def mark_profiled(self) -> None:
        """This rank chose a step to profile under this scope (and under every enclosing one)."""
        for scope in self.chain():
            scope.profiled = True

    def start_hook(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The traces and roles to hand to the hook, now; later traces are not added to them."""
        with self.lock:
            self.hook_started = True
            return tuple(self.traces), tuple(self.roles)


class Frame:
    """One entry of the scope stack (kept small: regions read ``idle`` on every entry)."""

    __slots__ = (
        "config", "idle", "disabled", "hook_scope", "explicit_steps", "schedule_scope", "_rank_cache",
        "_label_check_steps",
    )  # fmt: skip

    def __init__(self, config: ProfilerConfig, hook_scope: Optional[HookScope]) -> None:
        self.config = config
        # The steps run under the scope that introduced this schedule (set by _frame_for).
        self.schedule_scope: Optional[ScheduleScope] = None
        self.disabled = not config.enable
        # Nothing can be profiled under this frame: regions return at once.
        self.idle = self.disabled or config.schedule is None
        self.hook_scope = hook_scope
        schedule = config.schedule
        self.explicit_steps = explicit_steps(schedule.steps) if schedule and schedule.steps is not None else None
        self._rank_cache: Optional[tuple[Any, bool]] = None
        self._label_check_steps = 2

    def labels_seen_enough(self) -> bool:
        """Whether a skipped step under this frame may skip its regions' label check: after the
        first two step blocks (a region seen in those is checked there; one first seen later is
        checked when it runs a profiled step, a nested range or a counter)."""
        if self._label_check_steps <= 0:
            return True
        self._label_check_steps -= 1
        return False

    def rank_selected(self) -> bool:
        # Keyed on the process group: a rank changes only when torch.distributed initializes.
        group = default_group()
        cache = self._rank_cache
        if cache is not None and cache[0] is group:
            return cache[1]
        topology = current_topology()
        selected = rank_selected(self.config.ranks, self.config.all_ranks, topology.rank)
        self._rank_cache = (group, selected)
        return selected

    def action(self, step: int) -> StepAction:
        """What to do for ``step`` on this rank under this frame."""
        explicit = self.explicit_steps
        if explicit is not None:  # the common case, kept to one set lookup
            action = StepAction.RECORD if step in explicit else StepAction.NONE
        else:
            action = step_action(self.config.schedule, step)
        if action is StepAction.NONE or not self.rank_selected():
            return StepAction.NONE
        return action


class _RootFrame(Frame):
    """The frame in force outside every scope: the defaults plus the environment.

    The environment is read on first use, not at import, so a bad ``TORCHSTEP_PROF_*`` variable
    raises at the first region or scope that reads it.
    """

    __slots__ = ()

    def __init__(self) -> None:
        Frame.__init__(self, ProfilerConfig(), None)
        self.idle = False  # unknown until resolved: send the first region down the slow path

    def resolve(self) -> Frame:
        resolved = _frame_for(ProfilerConfig(), parent=None, sets_hook=False)
        Frame.__init__(self, resolved.config, resolved.hook_scope)
        self.schedule_scope = resolved.schedule_scope
        return self


_ROOT = _RootFrame()
_ROOT_RESOLVED = False
_STACK: contextvars.ContextVar[Frame] = contextvars.ContextVar("torchstep_prof_scope")
_ENV_HOOK_SCOPE: Optional[HookScope] = None
_ENV_HOOK_LOCK = threading.Lock()


def current_frame() -> Frame:
    """The innermost frame, the root one resolved against the environment."""
    global _ROOT_RESOLVED
    frame = _STACK.get(_ROOT)
    if frame is _ROOT and not _ROOT_RESOLVED:
        _ROOT.resolve()
        _ROOT_RESOLVED = True
    return frame


def frame_if_read() -> Optional[Frame]:
    """The innermost frame, or None while it is the root frame and the environment is unread
    (at interpreter exit: reading it then could only raise)."""
    frame = _STACK.get(_ROOT)
    return None if frame is _ROOT and not _ROOT_RESOLVED else frame


def reset_root() -> None:
    """Forget the root frame's reading of the environment (tests that change it in-process)."""
    global _ROOT_RESOLVED, _ENV_HOOK_SCOPE
    _ROOT.__init__()
    _ROOT_RESOLVED = False
    _ENV_HOOK_SCOPE = None


def env_hook_scope() -> Optional[HookScope]:
    """The process-wide scope of a hook set only through the environment, if one was made."""
    return _ENV_HOOK_SCOPE


def _frame_for(code_config: ProfilerConfig, parent: Optional[Frame], sets_hook: bool) -> Frame:
    global _ENV_HOOK_SCOPE
    from .environment import read_environment

    layer = read_environment()
    config = code_config if layer.is_empty else layer.apply(code_config)
    parent_hook = parent.hook_scope if parent is not None else None
    hook_scope: Optional[HookScope]
    if layer.sets_finish_hook and config.finish_hook is not None:
        # A hook set through the environment belongs to the whole process: every frame shares
        # its one scope, so an on_finish in the code neither runs it early nor runs it twice.
        with _ENV_HOOK_LOCK:
            if _ENV_HOOK_SCOPE is None:
                _ENV_HOOK_SCOPE = HookScope(config, None)
            hook_scope = _ENV_HOOK_SCOPE
        from .engine import ENGINE

        ENGINE.ensure_atexit()  # "runs at interpreter exit at the latest", even with no trace
    elif sets_hook and config.finish_hook is not None:
        hook_scope = HookScope(config, parent_hook)
    else:
        hook_scope = parent_hook
    frame = Frame(config, hook_scope)
    frame.schedule_scope = ScheduleScope.for_frame(config.schedule, parent.schedule_scope if parent else None)
    return frame


# The entries of _Scope objects in this context (scope, its entered manager), innermost last:
# kept per context so that one scope object entered in two threads or tasks exits each its own.
_ENTERED: contextvars.ContextVar[tuple[tuple[Any, Any], ...]] = contextvars.ContextVar(
    "torchstep_prof_entered_scopes", default=()
)


class _Scope:
    """What each scope function returns: a context manager, and a decorator of functions and
    coroutine functions (contextlib's decorators would exit before a coroutine runs)."""

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

    def __call__(self, fn: Any) -> Any:
        fields = self._fields
        return around_each_call(
            fn, lambda: _pushed(fields), "a torchstep_prof scope", "Use the scope as a `with` block inside it."
        )


@contextlib.contextmanager
def _pushed(fields: dict[str, Any] | ProfilerConfig) -> Iterator[ProfilerConfig]:
    from . import engine

    parent = current_frame()
    base = _CODE_CONFIG.get(ProfilerConfig())
    code_config = fields if isinstance(fields, ProfilerConfig) else evolve_checked(base, fields)
    sets_hook = isinstance(fields, ProfilerConfig) or "finish_hook" in fields
    frame = _frame_for(code_config, parent, sets_hook)
    frame_token = _STACK.set(frame)
    code_token = _CODE_CONFIG.set(code_config)
    engine.ENGINE.prepare(frame)
    try:
        yield frame.config
    finally:
        _CODE_CONFIG.reset(code_token)
        _STACK.reset(frame_token)
        engine.ENGINE.scope_exited(frame, parent)


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
) -> contextlib.AbstractContextManager[ProfilerConfig]:
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
    try:
        config = ScheduleConfig(
            steps=steps, skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat
        )
    except ConfigError as exc:  # name the key as the config file would: schedule.wait
        raise exc.under("schedule") from None
    return _Scope({"schedule": config})


def ranks(*ranks: Union[int, Sequence[int]], all_ranks: bool = False) -> contextlib.AbstractContextManager[ProfilerConfig]:
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
    return _Scope({"ranks": chosen or (0,), "all_ranks": all_ranks}, problems)


def contents(*items: str) -> contextlib.AbstractContextManager[ProfilerConfig]:
    """Choose what traces hold: any of cpu, cuda, memory, shapes, stack, flops, modules.

    >>> import torchstep_prof as tsp
    >>> with tsp.contents("cpu", "shapes", "memory"):
    ...     pass
    """
    chosen: tuple[Any, ...] = items
    if len(items) == 1 and isinstance(items[0], (list, tuple)):
        chosen = tuple(items[0])
    return _Scope({"contents": chosen})


def on_finish(
    cmd: Union[str, Sequence[str]],
    *,
    ranks: Optional[Sequence[int]] = None,
    all_ranks: bool = False,
    per_node: bool = False,
    node_wait_s: float = 300.0,
    timeout_s: Optional[float] = None,
    relocate: Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]]] = (),
    wait: bool = False,
) -> contextlib.AbstractContextManager[ProfilerConfig]:
    """Run ``cmd`` once on each selected rank when profiling under this scope is finished.

    >>> import torchstep_prof as tsp
    >>> with tsp.schedule(steps=[1]), tsp.on_finish('upload-tool "$TORCHSTEP_PROF_SAVE_PATH"'):  # doctest: +SKIP
    ...     train()
    """
    try:
        hook = FinishHookConfig(
            # Anything but a string or a list/tuple reaches the validator as given (None, 5):
            # "finish_hook.cmd: must be a string or a list of strings (got None)".
            cmd=list(cmd) if isinstance(cmd, (list, tuple)) else cmd,
            ranks=ranks,
            all_ranks=all_ranks,
            per_node=per_node,
            node_wait_s=node_wait_s,
            timeout_s=timeout_s,
            relocate=relocate,
            wait=wait,
        )
    except ConfigError as exc:  # finish_hook.timeout_s, as the config file names it
        raise exc.under("finish_hook") from None
    return _Scope({"finish_hook": hook})


def configure(
    config: Union[ProfilerConfig, str, os.PathLike[str], None] = None, **fields: Any
) -> contextlib.AbstractContextManager[ProfilerConfig]:
    """Set any field (``save_path``, ``discrete``, ``gzip``, ...); a whole ``ProfilerConfig`` or a
    config file path sets every field, and ``fields`` then apply on top.

    >>> import torchstep_prof as tsp
    >>> with tsp.configure(save_path="/tmp/prof", gzip=True):
    ...     pass
    """
    if config is None:
        return _Scope(fields)
    problems: list[Problem] = []
    if isinstance(config, (str, os.PathLike)):
        from .config_files import load_config

        try:
            config = load_config(config)
        except ConfigError as exc:
            problems += exc.problems
    elif not isinstance(config, ProfilerConfig):
        problems.append(Problem("config", f"must be a ProfilerConfig, the path of a config file or None "
                                          f"(got {config!r})"))
    if problems:  # the fields are still checked, against the defaults, for the same error
        evolve_checked(ProfilerConfig(), fields, problems)
    loaded = cast(ProfilerConfig, config)  # anything else was reported above
    return _Scope(evolve_checked(loaded, fields) if fields else loaded)
