"""The stack of scope frames: what is in force where a region runs, and the ``on_finish`` state.

Each scope pushes a :class:`Frame` onto a stack held in a ``ContextVar`` (threads and asyncio
tasks see their own stack). A frame stores the effective config, computed once when the scope is
entered (innermost field wins, the environment's word on top), and holds the one rule for
whether a step is profiled on this rank (:meth:`Frame.action`) with the "no" it caches for
regions. Outside every scope the root frame holds the defaults plus the environment.
This module knows nothing of the engine: the engine reads frames, scopes push them.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from ..config.model import ProfilerConfig
from .rules import NONE, CyclePlan, ExplicitPlan, SchedulePlan, StepAction, rank_selected
from ..topology import current_topology, default_group

if TYPE_CHECKING:
    from .missed_steps import ScheduleScope

__all__ = [
    "Frame", "HookScope", "current_frame", "env_hook_scope", "frame_if_read", "opts_in", "when_a_frame_opts_in",
    "when_env_sets_a_hook", "when_the_root_resolves",
]  # fmt: skip

# Called when the environment sets a finish hook: the engine registers its at-exit work there, so
# a hook set only through the environment runs at interpreter exit at the latest, even with no trace.
_ON_ENV_HOOK: list[Callable[[], None]] = []


def when_env_sets_a_hook(callback: Callable[[], None]) -> None:
    """Call ``callback`` each time a frame takes the environment's finish hook."""
    _ON_ENV_HOOK.append(callback)


# Called with each new frame that opts in (see opts_in): the engine starts the on-demand poll
# thread and the live status there (it registers itself; this module may not import it).
_ON_DEMAND_FRAMES: list[Callable[[Frame], None]] = []


def when_a_frame_opts_in(callback: Callable[[Frame], None]) -> None:
    """Call ``callback(frame)`` for each frame made with an ``on_demand``, ``auto_trace`` or ``stall`` section."""
    _ON_DEMAND_FRAMES.append(callback)


def opts_in(config: ProfilerConfig) -> bool:
    """Whether a frame of ``config`` may start a background worker: the on-demand poll thread
    (``on_demand``, ``auto_trace``) or the live status (``on_demand``, ``stall``)."""
    return config.on_demand is not None or config.auto_trace is not None or config.stall is not None


# Called with the root frame once it has read the environment: the engine starts there what a
# scope's entry starts (the metrics endpoint, the span log), for a process that turns them on
# through the environment alone and enters no scope.
_ON_ROOT_RESOLVED: list[Callable[[Frame], None]] = []


def when_the_root_resolves(callback: Callable[[Frame], None]) -> None:
    """Call ``callback(root_frame)`` each time the root frame reads the environment."""
    _ON_ROOT_RESOLVED.append(callback)


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
        # On-demand requests served under it ran its hook for their own traces: at its end it
        # runs again only for traces of its own (triggers/plan.py).
        self.served_requests = False
        self.traces: list[str] = []
        self.roles: list[str] = []
        # Local ranks of one node must agree on which scope they finish, without talking to
        # each other: the n-th per-node hook scope of each process is the same one (every local
        # rank enters the same on_finish scopes; docs/finish-hook.md). Not keyed on the command,
        # which may well name the rank.
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
                    from ..summary.records import STORE

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


_UNDECIDED = object()  # a frame's rank decision before it is made: never a process group
_NO_PLAN = ExplicitPlan(())  # no schedule: no step is selected


class Frame:
    """One entry of the scope stack (kept small: regions read ``quiet`` on every entry).

    The frame holds the one rule for what a step does on this rank (:meth:`action`) and the two
    answers a region may take without asking it, both "no", both written only by the rule:
    :attr:`cached_no`, ``(first, end)``, a run of steps ``first <= n < end`` the schedule does
    not profile (true for the frame's life: its config never changes); and :attr:`rank_no`, the
    process group under which this rank was found not selected (true while it is
    torch.distributed's default group).

    The trade-off, as structlog's filtering logger makes a level below the minimum a no-op
    method: a region on a step the rule said no to returns at once (a tuple read and two
    comparisons, or one identity check, where a call to the rule alone would cost a sixth of
    what the region may). The price is a cache that must stay true, so only :meth:`action`
    writes it, with the run its schedule plan gave or the group its rank decision holds for.
    Any other step (a selected one, the first of a new run, any step after the group changed)
    asks the rule, which then caches the run around it.
    """

    __slots__ = (
        "config", "idle", "disabled", "hook_scope", "plan", "cached_no", "rank_no", "schedule_scope",
        "rank_group", "rank_ok", "label_checks", "metrics", "quiet", "screened", "live", "timed_only",
    )  # fmt: skip

    def __init__(self, config: ProfilerConfig, hook_scope: Optional[HookScope]) -> None:
        self.config = config
        # The steps run under the scope that introduced this schedule (set by _frame_for).
        self.schedule_scope: Optional[ScheduleScope] = None
        self.disabled = not config.enable
        # Nothing can be profiled under this frame: regions return at once.
        self.idle = self.disabled or config.schedule is None
        # Metrics on (region_metrics/recorder.py): every region is timed, profiled or not. A
        # region returns at once only when the frame is idle and untimed (quiet); a timed frame
        # is screened, as the unresolved root frame is: regions take the path that checks both.
        metrics = config.metrics
        self.metrics: Any = metrics if metrics is not None and metrics.enable else None
        spans = config.spans  # spans on (timeline/span_log.py): regions are timed for their spans
        if self.metrics is None and spans is not None and spans.enable:
            self.metrics = spans
        # Live status on (live/open_regions.py): every region is shown while open, so none is quiet.
        self.live = not self.disabled and (config.stall is not None or config.on_demand is not None)
        self.quiet = self.idle and self.metrics is None and not self.live
        self.screened = self.metrics is not None or self.live
        # Only timed: what a region under this frame is when no trace records (one attribute
        # read on the spans-on and metrics-on path, which is measured against its budget).
        self.timed_only = self.idle and self.metrics is not None and not self.live
        self.hook_scope = hook_scope
        schedule = config.schedule
        self.plan: SchedulePlan = _NO_PLAN
        if schedule is not None:
            self.plan = ExplicitPlan(schedule.steps) if schedule.steps is not None else CyclePlan(schedule)
        # The cached no's (see the class docstring): none until the rule first answers no.
        self.cached_no: tuple[int, int] = (0, 0)
        self.rank_no: Any = _UNDECIDED
        self.rank_group: Any = _UNDECIDED
        self.rank_ok = False
        # The first regions under a frame check their labels even on steps they skip, so a
        # label's warnings (recording/labels.py) come early, not on the first profiled step.
        self.label_checks = 2

    def labels_seen_enough(self) -> bool:
        """Whether a skipped step under this frame may skip its regions' label check: after the
        first two step blocks (a region seen in those is checked there; one first seen later is
        checked when it runs a profiled step, a nested range or a counter)."""
        if self.label_checks <= 0:
            return True
        self.label_checks -= 1
        return False

    def rank_selected(self) -> bool:
        """Whether this rank profiles under this frame (decided again only when the process
        group changes: a rank changes only when torch.distributed initializes)."""
        group = default_group()
        if self.rank_group is not group:
            topology = current_topology()
            self.rank_ok = rank_selected(self.config.ranks, self.config.all_ranks, topology.rank)
            self.rank_group = group
        return self.rank_ok

    def decide(self, step: int) -> StepAction:
        """What to do for ``step`` on this rank under this frame, remembering a selected step
        (per schedule scope: see missed_steps; and that this rank profiled under its hook)."""
        action = self.action(step)
        if action is not NONE:
            if self.schedule_scope is not None:
                self.schedule_scope.saw(step)
            hook_scope = self.hook_scope
            if hook_scope is not None and not hook_scope.profiled:
                hook_scope.mark_profiled()
        return action

    def action(self, step: int) -> StepAction:
        """What to do for ``step`` on this rank under this frame: the one rule (regions, step
        blocks and the zero-code runner all ask here), which also keeps the no's it caches.

        >>> from torchstep_prof.config.model import ProfilerConfig, ScheduleConfig
        >>> frame = Frame(ProfilerConfig(schedule=ScheduleConfig(steps=(3, 7))), None)
        >>> frame.action(3).name, frame.action(5).name, frame.cached_no
        ('RECORD', 'NONE', (4, 7))
        """
        group = default_group()
        if not (self.rank_ok if self.rank_group is group else self.rank_selected()):
            self.rank_no = group  # a rank not selected profiles no step, while the group holds
            return NONE
        first, end, action = self.plan.run_of(step)
        if action is NONE:
            self.cached_no = (first, end)
        return action


class _RootFrame(Frame):
    """The frame in force outside every scope: the defaults plus the environment.

    The environment is read on first use, not at import, so a bad ``TORCHSTEP_PROF_*`` variable
    raises at the first region or scope that reads it.
    """

    __slots__ = ()

    def __init__(self) -> None:
        Frame.__init__(self, ProfilerConfig(), None)
        self.idle = self.quiet = self.timed_only = (
            False  # unknown until resolved: send the first region down the slow path
        )
        self.screened = True  # regions under the root frame check that it is resolved, until it is

    def resolve(self) -> Frame:
        resolved = frame_for(ProfilerConfig(), parent=None, sets_hook=False)
        Frame.__init__(self, resolved.config, resolved.hook_scope)  # screened now only if timed
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
        for callback in _ON_ROOT_RESOLVED:  # the engine: what the environment turns on starts now
            callback(_ROOT)
    return frame


def frame_if_read() -> Optional[Frame]:
    """The innermost frame, or None while it is the root frame and the environment is unread
    (at interpreter exit: reading it then could only raise)."""
    frame = _STACK.get(_ROOT)
    return None if frame is _ROOT and not _ROOT_RESOLVED else frame


def reset_root() -> None:
    """Forget the root frame's reading of the environment (tests that change it in-process)."""
    global _ROOT_RESOLVED, _ENV_HOOK_SCOPE
    _RootFrame.__init__(_ROOT)
    _ROOT_RESOLVED = False
    _ENV_HOOK_SCOPE = None


def env_hook_scope() -> Optional[HookScope]:
    """The process-wide scope of a hook set only through the environment, if one was made."""
    return _ENV_HOOK_SCOPE


def frame_for(code_config: ProfilerConfig, parent: Optional[Frame], sets_hook: bool) -> Frame:
    global _ENV_HOOK_SCOPE
    from ..config.environment import read_environment

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
        for callback in _ON_ENV_HOOK:  # the engine's at-exit work: the hook runs then at the latest
            callback()
    elif sets_hook and config.finish_hook is not None:
        hook_scope = HookScope(config, parent_hook)
    else:
        hook_scope = parent_hook
    frame = Frame(config, hook_scope)
    from .missed_steps import ScheduleScope

    frame.schedule_scope = ScheduleScope.for_frame(config.schedule, parent.schedule_scope if parent else None)
    if opts_in(config):
        for opted_in in _ON_DEMAND_FRAMES:
            opted_in(frame)
    return frame
