"""Zero-code step boundaries: a step ends where ``--step-on`` says, and its trace holds all of it.

``torchstep-prof run`` cannot edit the script, so each boundary (an ``Optimizer.step`` call by
default, every K-th with ``step_every=K``; see ``step_on``) ends a step, and a selected step is a
``tsp.step(n)`` block entered and left by :class:`StepDriver`. Step 1 begins when the script
does. A step's trace ends, and the next one's begins, at the same instant: the first point after
the boundary at which every ``record_function`` range the training thread opened since the
step began has closed (``open_ranges``): torch's own ``Optimizer.step#...`` range (a profiler
started inside it crashes: docs/known-torch-behaviours.md), and a user's range around the iteration, which is
so held whole by its own step's trace. The data loader, ``zero_grad`` and anything else before
the next forward are the next step's. A range that outlives the step (an epoch's) cannot be
waited for: the next range that opens ends the step, and no trace of ours starts until that
range closes (the summary names the steps this skipped).

Not profiling costs one counter and one comparison per boundary: the range watch exists only
near selected steps, and module hooks only while a selected step records, except with spans or
metrics on: then every step is timed, and so is every forward of a ``--region`` class (the
hooks stay for the whole run; outside a selected step such a forward is a timed region, never
a trace's).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Optional, Sequence

import attrs
from torch.nn.modules import module as _module_hooks

from ..errors import TorchstepProfWarning, warn
from ..triggers.watcher import ON_DEMAND as _ON_DEMAND
from ..live.reporter import LIVE as _LIVE
from ..region_metrics import recorder as _recorder
from ..summary.records import STORE
from ..regions import profile_region, step, timed_and_shown
from ..selection.frames import Frame
from ..selection.rules import StepAction
from ..selection.step_meaning import RunCounting, counting_run
from .open_ranges import RangeWatch
from .step_on import StepOn, install_source

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
    class_name, equals, label = text.partition("=")
    class_name = class_name.strip()
    if not class_name.isidentifier():
        raise ValueError(f"--region {text!r}: {class_name!r} is not a class name (expected CLASS[=ROLE[/STAGE]])")
    role, slash, stage = label.partition("/") if equals else (class_name, "", "")
    role = role or class_name
    stage = stage if slash and stage else "forward"
    return ModuleRegion(class_name=class_name, role=role, stage=stage)


class StepDriver:
    """Turns boundaries into ``tsp.step(n)`` blocks under ``frame`` (the scopes the runner
    entered), and module forwards into regions while a selected step records.

    ``install()`` begins step 1 and starts the boundary source; ``close()`` ends whatever is
    open (a step no boundary ended is dropped, not written) and removes every hook. One per
    process, driven from the thread that installs it (the script's).
    """

    def __init__(self, frame: Frame, step_every: int = 1, regions: Sequence[ModuleRegion] = (),
                 step_on: StepOn = StepOn("optimizer"), main_names: tuple[str, ...] = ("__main__",)) -> None:  # fmt: skip
        self.frame = frame
        self.step_every = step_every
        self.step_on = step_on
        self.main_names = main_names
        self.regions = {r.class_name: r for r in regions}
        self.calls = 0  # boundary events so far
        self._pending: Optional[int] = None  # a boundary passed: the step to begin once ranges close
        self._open_step: Optional[contextlib.ExitStack] = None
        self._open_number = 0
        self._open_regions: list[tuple[Any, contextlib.ExitStack]] = []  # (module, region), innermost last
        self._seen_classes: set[str] = set()
        self._recorded_steps = 0
        self._first_recorded = 0  # the first step recorded: the summary's example
        self._skipped: list[tuple[int, str]] = []  # (step, the range that kept it from starting)
        self._remove_source: Optional[Callable[[], None]] = None
        self._module_hooks: list[Any] = []  # the forward pre- and post-hooks' handles, while on
        self._failed = False
        self._owner = threading.get_ident()
        self._counting = RunCounting(boundary=step_on.boundary(), every=step_every)
        self._watch = RangeWatch(self._owner, on_ready=self._ranges_done)
        # Metrics on: every step is timed, boundary to boundary (a selected step's block times itself).
        self._timed = frame.metrics is not None
        self._step_t0 = _recorder._perf() if self._timed else 0.0
        # ... and so is every --region forward: its module hooks stay for the whole run.
        self._always_hooked = self._timed and bool(self.regions)

    # --- installation ---------------------------------------------------------------------

    def install(self) -> None:
        counting_run(self._counting)
        self._remove_source = install_source(self.step_on, self._on_boundary, self._owner, self.main_names)
        if self._always_hooked:
            self._set_module_hooks(True)
        self._guarded(self._begin, 1)

    def close(self) -> None:
        """End the run: drop a step still open, remove every hook, note what the summary must say."""
        seen = self.calls >= self.step_every
        try:
            self._pending = None
            if self._open_step is not None:
                number = self._open_number
                from ..engine import ENGINE

                ENGINE.drop_running_trace()
                self._end_step()
                if seen:
                    STORE.add_attention(
                        f"run-open-step-{number}",
                        f"torchstep-prof run: step {number} began but no boundary ({self.step_on.describe()}) "
                        "ended it; its trace was not written",
                    )
        finally:
            self._open_regions.clear()  # timed forwards the script left open (it raised): not logged
            self._set_module_hooks(False)
            self._watch.remove()
            if self._remove_source is not None:
                self._remove_source()
                self._remove_source = None
            counting_run(None)
        example = self._first_recorded or 1
        STORE.add_attention(
            "run-step-on",
            f"torchstep-prof run: a step ended at {self.step_on.describe()}"
            + (f", {self.step_every} to a step" if self.step_every > 1 else "")
            + f", from step 1; {self._counting.sentence(example)}",
        )
        if not seen:
            STORE.add_attention(
                "run-no-step",
                f"torchstep-prof run: no step boundary was seen (no {self.step_on.boundary()}"
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
        for number, name in self._skipped:
            STORE.add_attention(
                f"run-skipped-{number}",
                f"torchstep-prof run: step {number} not profiled: the range {name!r}, opened in a profiled "
                "step, was still open (a profiler started inside it crashes torch)",
            )

    # --- boundaries -----------------------------------------------------------------------------

    def _on_boundary(self) -> None:
        if threading.get_ident() != self._owner:
            return  # another thread's work: its steps are not the script's
        self.calls += 1
        if self.calls % self.step_every:
            return  # inside a --step-every group: not a boundary
        ended = self.calls // self.step_every
        if self._timed:
            now = _recorder._perf()
            if self._open_step is None:  # no step block times this step
                _recorder.record_step(now - self._step_t0, ended, self._step_t0)
            self._step_t0 = now
        if _LIVE.running is not None:  # live status: the status thread reads the step
            _LIVE.running.at_step(ended + 1)
        watcher = _ON_DEMAND.running  # on-demand traces: the watcher notes the step (its status)
        requested = watcher is not None and (watcher.wants(ended + 1) or self._requested(ended + 2))
        if self._open_step is None and self._pending is None and not self._watch.installed and not requested:
            if self.frame.action(ended + 1) is StepAction.NONE and self.frame.action(ended + 2) is StepAction.NONE:
                return  # the common case, not profiling: one counter, two checks
        self._guarded(self._boundary, ended + 1)

    def _boundary(self, following: int) -> None:
        if self._pending is not None:  # a boundary before the last one's ranges closed
            self._transition()
        self._pending = following
        if self._watch.current:
            self._watch.waiting = True  # _ranges_done carries it out
        else:
            self._transition()

    def _ranges_done(self) -> None:
        # The ranges the step opened have closed, or the next step's work opens a range while
        # one from before the boundary is still open.
        self._guarded(self._transition)

    def _transition(self) -> None:
        number, self._pending = self._pending, None
        self._watch.waiting = False
        if self._open_step is not None:
            self._end_step()
        if number is not None:
            self._begin(number)

    def _begin(self, number: int) -> None:
        """Step ``number`` begins now: its trace starts if selected; the range watch is on while
        this step or the next is selected (the next one's start waits for this one's ranges)."""
        self._watch.new_step()
        requested = self._requested(number)
        selected = requested or self.frame.action(number) is not StepAction.NONE
        if selected:
            unsafe = self._watch.unsafe()
            if unsafe is not None:
                self._skipped.append((number, unsafe))
                selected = False
        requested_next = self._requested(number + 1)
        near = selected or requested_next or self.frame.action(number + 1) is not StepAction.NONE
        self._watch.recording = selected
        if near:
            self._watch.install()
            self._warm_up(requested or requested_next)
        else:
            self._watch.uninstall_if_idle()
        if not selected:
            return
        stack = contextlib.ExitStack()
        self._watch.ignoring = True
        try:
            # Entered here, not by stack.enter_context: a Ctrl-C between the step's entry and its
            # exit being pushed then lands in our frame, which holds it (interrupts.py).
            block = step(number)
            block.__enter__()
            stack.push(block.__exit__)
        finally:
            self._watch.ignoring = False
        self._open_step, self._open_number = stack, number
        self._recorded_steps += 1
        self._first_recorded = self._first_recorded or number
        if self.regions:
            self._set_module_hooks(True)

    @staticmethod
    def _requested(number: int) -> bool:
        """Whether an on-demand request (``torchstep-prof trigger``) names step ``number``."""
        watcher = _ON_DEMAND.running
        plan = watcher.plan if watcher is not None else None
        return plan is not None and number in plan.steps

    def _warm_up(self, requested: bool) -> None:
        # Deferred from the scope's entry (ENGINE.warm_up_deferred): a run that profiles no step
        # never starts torch's profiler, its writer thread, or imports what only they need.
        from ..engine import ENGINE

        # A request may name ranks the run's own --ranks do not: it warms up wherever it profiles.
        if not ENGINE.slot.warmed and (requested or self.frame.rank_selected()):
            self._watch.ignoring = True  # its throw-away window's ranges are ours
            try:
                ENGINE.slot.warm_up(self.frame.config.contents)
            finally:
                self._watch.ignoring = False

    def _end_step(self) -> None:
        stack, self._open_step = self._open_step, None
        self._watch.recording = False
        try:
            while self._open_regions:
                self._open_regions.pop()[1].close()
        finally:
            if stack is not None:
                stack.close()
            if not self._always_hooked:
                self._set_module_hooks(False)

    # --- module hooks: regions -----------------------------------------------------------------

    def _set_module_hooks(self, on: bool) -> None:
        if on and not self._module_hooks:
            self._module_hooks = [
                _module_hooks.register_module_forward_pre_hook(self._on_forward_pre),
                # always_call: a forward that raises still closes its region.
                _module_hooks.register_module_forward_hook(self._on_forward_post, always_call=True),
            ]
        elif not on:
            while self._module_hooks:
                self._module_hooks.pop().remove()

    def _on_forward_pre(self, module: Any, args: Any) -> None:
        if (self._open_step is None and not self._always_hooked) or threading.get_ident() != self._owner:
            return
        region = self.regions.get(type(module).__name__)
        if region is not None:
            self._guarded(self._enter_region, module, region)

    def _enter_region(self, module: Any, region: ModuleRegion) -> None:
        stack = contextlib.ExitStack()
        if self._open_step is None:
            # Spans or metrics on, no step recording: timed only. Not profile_region, whose rule
            # could start a trace of the region's own in a step this driver chose not to record.
            stack.enter_context(timed_and_shown(self.frame, region.role, region.stage))
        else:
            self._watch.ignoring = True
            try:
                stack.enter_context(profile_region(region.role, region.stage))
            finally:
                self._watch.ignoring = False
            self._seen_classes.add(region.class_name)
        self._open_regions.append((module, stack))

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
