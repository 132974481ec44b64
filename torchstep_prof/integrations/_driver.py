"""The scopes, the open step and the open regions of one framework callback, held in ExitStacks.

Framework callbacks see a training run as a series of events (train begins, a step begins, the
optimizer steps, training ends). ``StepDriver`` turns those events into the scopes and blocks that
training code would write as ``with`` statements: the scopes are entered when training begins,
step ``n`` stays open until the next step begins (so evaluation and checkpointing that step ``n``
triggers belong to it), and everything is closed in reverse order when training ends or raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Mapping, Optional, Sequence, Union

from ..config.model import FinishHookConfig
from ..errors import ConfigError, Problem
from ..regions import profile_region, step
from ..scopes import configure, contents, on_finish, ranks, schedule

__all__ = ["StepDriver", "build_scopes"]

ROLE = "trainer"


def build_scopes(
    steps: Union[int, Sequence[int], None],
    ranks_arg: Union[int, Sequence[int], None],
    contents_arg: Union[str, Sequence[str], None],
    on_finish_arg: Union[str, Sequence[str], Mapping[str, Any], FinishHookConfig, None],
    fields: dict[str, Any],
) -> list[contextlib.AbstractContextManager[Any]]:
    """The scope objects a callback enters when training begins, built (and so validated) now.

    ``fields`` are ``configure()`` fields (``config=`` a ``ProfilerConfig`` or a file path;
    ``metrics=`` a port, True, a mapping of ``tsp.metrics`` arguments or a ``MetricsConfig``;
    ``auto_trace=`` True, a mapping of ``tsp.auto_trace`` arguments or an ``AutoTraceConfig``;
    ``spans=`` a folder, a mapping or a ``SpansConfig``);
    traces are fused (``discrete=False``) unless ``discrete`` or a whole ``config`` is given.
    The explicit arguments are entered innermost, so they win over ``fields``.
    """
    fields = dict(fields)
    config = fields.pop("config", None)
    if "metrics" in fields:  # metrics=18400 (a port) or True: the metrics section, on
        metrics = fields["metrics"]
        if metrics is True or (isinstance(metrics, int) and not isinstance(metrics, bool)):
            fields["metrics"] = {} if metrics is True else {"port": metrics}
        elif metrics is False:
            fields["metrics"] = None
    if fields.get("auto_trace") is True:  # auto_trace=True: the section with its defaults
        fields["auto_trace"] = {}
    if isinstance(fields.get("spans"), (str, os.PathLike)):  # spans="/shared/spans": the span log's folder
        fields["spans"] = {"dir": os.fspath(fields["spans"])}
    if config is None and "discrete" not in fields:
        fields["discrete"] = False
    scopes: list[contextlib.AbstractContextManager[Any]] = [configure(config, **fields)]
    if steps is not None:
        scopes.append(schedule(steps=[steps] if isinstance(steps, int) else list(steps)))
    if ranks_arg is not None:
        # ranks() sets all_ranks too (False unless told): hand it the one given with the ranks,
        # or `ranks=[0, 1], all_ranks=True` would lose all_ranks to this innermost scope.
        chosen = [ranks_arg] if isinstance(ranks_arg, int) else ranks_arg
        scopes.append(ranks(*chosen, all_ranks=fields.get("all_ranks", False)))
    if contents_arg is not None:
        scopes.append(contents(*([contents_arg] if isinstance(contents_arg, str) else contents_arg)))
    if isinstance(on_finish_arg, FinishHookConfig):
        scopes.append(configure(finish_hook=on_finish_arg))
    elif isinstance(on_finish_arg, Mapping):
        hook = dict(on_finish_arg)
        if "cmd" not in hook:
            required = f"required in on_finish={on_finish_arg!r} (a string or a list)"
            raise ConfigError([Problem("finish_hook.cmd", required)])
        scopes.append(on_finish(hook.pop("cmd"), **hook))
    elif on_finish_arg is not None:
        scopes.append(on_finish(on_finish_arg))
    return scopes


class StepDriver:
    """Opens and closes scopes, one step and its regions as a framework reports its events.

    Each open thing sits in an ``ExitStack``: the scopes in one, the open step in another, each
    open region in its own (regions of one step may close in any order the framework reports).
    Regions are entered only inside a step this driver opened: a region outside every step would
    be numbered by a counter and own a trace of its own, which is not what a callback user means.
    """

    def __init__(self, scopes: Sequence[contextlib.AbstractContextManager[Any]]) -> None:
        self._scopes = list(scopes)
        self._outer: Optional[contextlib.ExitStack] = None
        self._step: Optional[contextlib.ExitStack] = None
        self.step_number: Optional[int] = None
        self._regions: dict[str, contextlib.ExitStack] = {}

    def start(self) -> None:
        """Enter the scopes (training begins); a run left open before is closed first."""
        self.close()
        with contextlib.ExitStack() as stack:
            for scope in self._scopes:
                stack.enter_context(scope)
            self._outer = stack.pop_all()

    def on_close(self, callback: Any) -> None:
        """Call ``callback()`` when the scopes close (before they do); only while running."""
        if self._outer is not None:
            self._outer.callback(callback)

    def begin_step(self, number: int) -> None:
        """Step ``number`` begins: the open step, if another one, ends first."""
        if self._outer is None or self.step_number == number:
            return
        self.end_step()
        with contextlib.ExitStack() as stack:
            stack.enter_context(step(number))
            self._step = stack.pop_all()
        self.step_number = number

    def end_step(self) -> None:
        """Close the open regions, then the open step (which may write its trace and run the hook)."""
        try:
            while self._regions:
                self._regions.popitem()[1].close()  # the latest opened first
        finally:
            stack, self._step, self.step_number = self._step, None, None
            if stack is not None:
                stack.close()

    def enter_region(self, stage: str) -> None:
        """Open ``trainer/<stage>`` inside the open step (an open one of that stage ends first)."""
        if self._step is None:
            return
        self.exit_region(stage)
        with contextlib.ExitStack() as stack:
            stack.enter_context(profile_region(ROLE, stage))
            self._regions[stage] = stack.pop_all()

    def exit_region(self, stage: str) -> None:
        stack = self._regions.pop(stage, None)
        if stack is not None:
            stack.close()

    def wrap_in_region(self, owner: Any, method: str) -> None:
        """Make ``owner.<method>`` (this instance only, until the scopes close) run in the region
        ``trainer/<method>``: for the framework steps that have no event of their own."""
        wrapped = getattr(owner, method)
        before = owner.__dict__.get(method)

        @functools.wraps(wrapped)
        def in_region(*args: Any, **kwargs: Any) -> Any:
            self.enter_region(method)
            try:
                return wrapped(*args, **kwargs)
            finally:
                self.exit_region(method)

        setattr(owner, method, in_region)

        def restore() -> None:
            if before is None:
                owner.__dict__.pop(method, None)
            else:
                setattr(owner, method, before)

        self.on_close(restore)

    def close(self) -> None:
        """Close everything still open, innermost first (training ended, or raised)."""
        try:
            self.end_step()
        finally:
            stack, self._outer = self._outer, None
            if stack is not None:
                stack.close()
