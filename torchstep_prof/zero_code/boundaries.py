"""Zero-code step boundaries: torch's global optimizer and module hooks drive step blocks and regions.

``torchstep-prof run`` cannot edit the script, so each ``Optimizer.step`` call (every K-th with
``step_every=K``) ends a step, and a selected step is a ``tsp.step(n)`` block entered and left
from those hooks. Ending a trace from the optimizer post-hook is safe; starting the next one
there is not (the hook runs inside torch's own ``Optimizer.step#...`` range, and a profiler
started inside it crashes about half the time, TORCH_FACTS.md). So the next selected step is
*armed* at the boundary and starts at the first module forward after it (or, for a script with
no ``nn.Module``, at the next optimizer pre-hook): its trace holds that step's forward, backward
and optimizer step, and nothing of the step before.

Not profiling costs one counter and one comparison per optimizer step: module hooks exist only
while a step is armed or records.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import attrs
from torch.nn.modules import module as _module_hooks
from torch.optim import optimizer as _optimizer_hooks

from ..errors import TorchstepProfWarning, warn
from ..triggers.watcher import ON_DEMAND as _ON_DEMAND
from ..summary.records import STORE
from ..regions import profile_region, step
from ..selection.frames import Frame
from ..selection.rules import StepAction, last_selected_step

__all__ = ["ModuleRegion", "StepDriver", "parse_region"]


@attrs.frozen(kw_only=True)
class ModuleRegion:
    """Forwards of ``nn.Module``s whose class is named ``class_name`` are the region
    ``<role>/<stage>`` (``--region CLASS[=ROLE[/STAGE]]``)."""

    class_name: str
    role: str
    stage: str = "forward"


def parse_region(text: str) -> ModuleRegion:
    """``CLASS[=ROLE[/STAGE]]`` as a :class:`ModuleRegion`; ``ValueError`` says what is wrong.

    >>> parse_region("Agent=actor/forward")
    ModuleRegion(class_name='Agent', role='actor', stage='forward')
    >>> parse_region("Linear").role
    'Linear'
    """
    from ..traces.names import sanitize_label

    class_name, equals, label = text.partition("=")
    class_name = class_name.strip()
    if not class_name.isidentifier():
        raise ValueError(f"--region {text!r}: {class_name!r} is not a class name (expected CLASS[=ROLE[/STAGE]])")
    role, slash, stage = label.partition("/") if equals else (class_name, "", "")
    role = role or class_name
    stage = stage if slash and stage else "forward"
    sanitize_label(role, "--region role")
    sanitize_label(stage, "--region stage")
    return ModuleRegion(class_name=class_name, role=role, stage=stage)


class StepDriver:
    """Turns optimizer steps into ``tsp.step(n)`` blocks under ``frame`` (the scopes the runner
    entered), and module forwards into regions while a selected step records.

    ``install()`` adds the optimizer hooks; ``close()`` ends whatever is open (a step that no
    optimizer step ended is dropped, not written) and removes every hook. One per process.
    """

    def __init__(self, frame: Frame, step_every: int = 1, regions: Sequence[ModuleRegion] = ()) -> None:
        self.frame = frame
        self.step_every = step_every
        self.regions = {r.class_name: r for r in regions}
        self.calls = 0  # Optimizer.step calls so far
        self.armed: Optional[int] = None  # the selected step to start at the next activity
        self._open_step: Optional[contextlib.ExitStack] = None
        self._open_number = 0
        self._open_regions: list[tuple[Any, contextlib.ExitStack]] = []  # (module, region), innermost last
        self._seen_classes: set[str] = set()
        self._recorded_steps = 0
        self._last = last_selected_step(frame.config.schedule)
        self._handles: list[Any] = []
        self._forward_pre: Any = None
        self._forward_post: Any = None
        self._failed = False

    # --- installation ---------------------------------------------------------------------

    def install(self) -> None:
        # Optimizer hooks stay for the whole run: torch iterates its global optimizer hook dicts
        # lazily, so adding or removing one from inside a hook would break the running step.
        self._handles.append(_optimizer_hooks.register_optimizer_step_pre_hook(self._on_optimizer_pre))
        self._handles.append(_optimizer_hooks.register_optimizer_step_post_hook(self._on_optimizer_post))
        self._arm(1)

    def close(self) -> None:
        """End the run: drop a step still open, remove every hook, note what the summary must say."""
        try:
            if self._open_step is not None:
                number = self._open_number
                from ..engine import ENGINE

                ENGINE.drop_running_trace()
                self._end_step()
                STORE.add_attention(
                    f"run-open-step-{number}",
                    f"torchstep-prof run: step {number} began but no optimizer step ended it; its trace was not written",
                )
        finally:
            self.armed = None
            self._set_module_hooks(pre=False, post=False)
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
        if self.calls < self.step_every:
            STORE.add_attention(
                "run-no-step",
                "torchstep-prof run: no step boundary was seen (no Optimizer.step call"
                + (f", or fewer than --step-every {self.step_every}" if self.step_every > 1 else "")
                + "): nothing was profiled",
            )
        elif self._recorded_steps:
            for name in sorted(set(self.regions) - self._seen_classes):
                STORE.add_attention(
                    f"run-region-{name}",
                    f"torchstep-prof run: --region {name}: no forward of a module of class {name} "
                    "ran in a selected step",
                )

    # --- optimizer hooks: step boundaries --------------------------------------------------

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.armed is not None:  # a selected step with no module forward before its update
            self._guarded(self._start_armed)

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.calls += 1
        if self.calls % self.step_every:
            return  # inside a --step-every group: not a boundary
        following = self.calls // self.step_every + 1
        watcher = _ON_DEMAND.watcher  # on-demand traces: the watcher notes the step (its status)
        requested = watcher is not None and watcher.wants(following)
        if self._open_step is None and self.armed is None and not requested:
            if self.frame.action(following) is StepAction.NONE:
                return  # the common case, not profiling: one counter, one check
        self._guarded(self._boundary)

    def _boundary(self) -> None:
        if self._open_step is not None:
            self._end_step()
        ended = self.calls // self.step_every
        if self._last is not None and ended >= self._last and _ON_DEMAND.watcher is None:
            return  # the schedule is over: nothing more to arm
        self._arm(ended + 1)

    def _arm(self, number: int) -> None:
        if self.frame.action(number) is StepAction.NONE and not self._requested(number):
            return
        self.armed = number
        self._set_module_hooks(pre=True, post=bool(self.regions))

    @staticmethod
    def _requested(number: int) -> bool:
        """Whether an on-demand request names step ``number``."""
        watcher = _ON_DEMAND.watcher
        plan = watcher.plan if watcher is not None else None
        return plan is not None and number in plan.steps

    def _start_armed(self) -> None:
        number, self.armed = self.armed, None
        if number is None:
            return
        stack = contextlib.ExitStack()
        stack.enter_context(step(number))
        self._open_step, self._open_number = stack, number
        self._recorded_steps += 1
        if not self.regions:
            self._set_module_hooks(pre=False, post=False)

    def _end_step(self) -> None:
        stack, self._open_step = self._open_step, None
        try:
            while self._open_regions:
                self._open_regions.pop()[1].close()
        finally:
            if stack is not None:
                stack.close()
            if self.armed is None:
                self._set_module_hooks(pre=False, post=False)

    # --- module hooks: the armed step's start, and regions -------------------------------------

    def _set_module_hooks(self, *, pre: bool, post: bool) -> None:
        if pre and self._forward_pre is None:
            self._forward_pre = _module_hooks.register_module_forward_pre_hook(self._on_forward_pre)
        elif not pre and self._forward_pre is not None:
            self._forward_pre.remove()
            self._forward_pre = None
        if post and self._forward_post is None:
            # always_call: a forward that raises still closes its region.
            self._forward_post = _module_hooks.register_module_forward_hook(self._on_forward_post, always_call=True)
        elif not post and self._forward_post is not None:
            self._forward_post.remove()
            self._forward_post = None

    def _on_forward_pre(self, module: Any, args: Any) -> None:
        if self.armed is not None:
            self._guarded(self._start_armed)
        if self._open_step is None:
            return
        region = self.regions.get(type(module).__name__)
        if region is not None:
            self._guarded(self._enter_region, module, region)

    def _enter_region(self, module: Any, region: ModuleRegion) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(profile_region(region.role, region.stage))
        self._open_regions.append((module, stack))
        self._seen_classes.add(region.class_name)

    def _on_forward_post(self, module: Any, args: Any, output: Any) -> None:
        open_regions = self._open_regions
        if not open_regions or all(entry[0] is not module for entry in open_regions):
            return
        # Regions nest like the forwards; one whose forward raised is closed with its parent.
        while open_regions:
            owner, stack = open_regions.pop()
            self._guarded(stack.close)
            if owner is module:
                break

    def _guarded(self, fn: Any, *args: Any) -> None:
        # Profiling never raises into training: say so once, go on unprofiled.
        try:
            fn(*args)
        except Exception as exc:
            if not self._failed:
                self._failed = True
                warn(f"torchstep_prof run: profiling a step failed ({exc!r}); training goes on", TorchstepProfWarning)

