"""The job's side of on-demand traces: the poll thread, and the plan a step boundary reads.

A job that opts in (``on_demand: {dir: ...}``) gets one daemon thread per process. Every
``poll_s`` it writes this rank's status (status.py) and reads the request file (request.py);
a new, valid request becomes the process-wide :class:`Plan` in ``ON_DEMAND.watcher.plan``. The
training thread does the least it can: a step boundary stores its step number on the watcher
and reads ``plan`` (``None`` almost always). On a planned step it profiles under a frame made
once per plan from the frame in force there (the job's save path, hook and names), with the
request's steps, ranks, contents and discrete; the block pushes that frame, so regions inside
decide under it as under any schedule. The triggered steps' finish hook is a hook scope of the
plan's own: it runs after the plan's last step, once per request.

A request is served once: its id goes into the rank's status file when it is read, and a
restarted poll thread reads the ids back. Steps of a plan that a rank had passed when it read
the request are reported (a missed-steps row in the summary, a warning), never replaced.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections import deque
from typing import Any, Optional

import attrs

from ..config.model import OnDemandConfig, ScheduleConfig
from ..errors import ConfigError, TorchstepProfWarning, warn
from ..selection.frames import Frame, HookScope, frame_if_read, when_a_frame_opts_in
from ..selection.rules import rank_selected
from ..topology import current_topology
from .request import REQUEST_FILE, Request, read_request
from .status import MAX_SERVED, read_status, status_path

__all__ = ["ON_DEMAND", "Plan", "TriggeredFrame", "Watcher", "scope_left", "watch"]


class _State:
    """The one process-wide place a step boundary looks: ``watcher`` is None unless a scope
    opted in (so a job that did not pays one attribute read per step block)."""

    __slots__ = ("watcher",)

    def __init__(self) -> None:
        self.watcher: Optional[Watcher] = None


ON_DEMAND = _State()
_LOCK = threading.Lock()
_RATE_SAMPLES = 20  # polls the step rate is measured over


class TriggeredFrame(Frame):
    """The frame a planned step profiles under: ``base`` is the frame in force at that step
    (a scope's exit ends a ``begin_step`` step begun under it, triggered or not)."""

    __slots__ = ("base",)
    base: Frame


def _ranges(steps: Any) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for n in sorted(steps):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((n, n))
    return ranges


def _shown(steps: Any) -> str:
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _ranges(steps))


class Plan:
    """One request being served: its steps, which of them this rank began, and the frame they
    profile under (made at the first step boundary after the request arrived)."""

    def __init__(self, watcher: Watcher, request: Request, at_step: Optional[int], entry: dict[str, Any]) -> None:
        self.watcher = watcher
        self.entry = entry  # this request's line in the status file: its outcome is kept there
        self.request = request
        self.steps = frozenset(request.steps)
        self.last = max(request.steps)
        self.at_step_read = at_step  # this rank's step when the request was read
        self.seen: set[int] = set()
        self._lock = threading.Lock()
        self._base: Optional[Frame] = None
        self._frame: Optional[TriggeredFrame] = None

    def frame_over(self, base: Frame) -> TriggeredFrame:
        """The frame of this plan's steps under ``base`` (one per plan and base: the steps of
        one request share its hook scope)."""
        with self._lock:
            frame = self._frame
            if frame is not None and self._base is base:
                return frame
            request = self.request
            config = attrs.evolve(
                base.config,
                schedule=ScheduleConfig(steps=request.steps),
                ranks=request.ranks if request.ranks is not None else base.config.ranks,
                all_ranks=request.all_ranks,
                contents=request.contents if request.contents is not None else base.config.contents,
                discrete=bool(request.discrete),
            )
            hook_scope = HookScope(config, None) if config.finish_hook is not None else None
            frame = TriggeredFrame(config, hook_scope)
            frame.base = base
            self._base, self._frame = base, frame
            return frame

    def at_step(self, frame: Frame, number: int) -> Frame:
        """Step ``number`` begins under ``frame``: the plan's frame for a planned step."""
        if number in self.steps:
            self.seen.add(number)
            return self.frame_over(frame)
        if number > self.last:
            self.retire()
        elif self._frame is None and not frame.disabled:
            # Before the first planned step: pay the profiler's warm-up here, not inside it.
            from ..engine import ENGINE

            ENGINE.prepare(self.frame_over(frame))
        return frame

    def retire(self, ending: bool = False) -> None:
        """The plan is over (a later step began, or the job ends): report the steps missed."""
        watcher = self.watcher
        if watcher.plan is not self:
            return
        watcher.plan = None
        missed = sorted(self.steps - self.seen)
        frame = self._frame
        request = self.request
        if not rank_selected(request.ranks or (), request.all_ranks, current_topology().rank):
            self.entry["outcome"] = "not selected (--ranks)"
        elif missed:
            self._report_missed(missed, ending)
        else:
            self.entry["outcome"] = f"profiled {_shown(self.steps)}"
        if frame is not None and frame.hook_scope is not None and not frame.hook_scope.finished:
            from ..engine import ENGINE

            ENGINE.finish(frame.hook_scope, frame.config)  # as a schedule's scope exit would

    def _report_missed(self, missed: list[int], ending: bool) -> None:
        from ..engine import ENGINE
        from ..summary.records import STORE

        profiled = sorted(self.seen & self.steps)
        self.entry["outcome"] = (f"profiled {_shown(profiled)}, " if profiled else "") + f"missed {_shown(missed)}"
        where = ("the job ended first" if ending and self.at_step_read is not None and max(missed) > self.at_step_read
                 else f"this rank was at step {self.at_step_read} when it read the request")
        line = (f"on-demand request {self.request.id}: step(s) {_shown(missed)} not profiled ({where}); "
                "trigger again with a larger --align or at a later --at step")
        ENGINE.ensure_atexit()
        # A line of its own, not the missed-steps row: that one says the steps never ran, and
        # these did, unprofiled, before this rank read the request.
        STORE.add_attention(f"on-demand-{self.request.id}", line)
        warn(f"torchstep_prof: {line}", TorchstepProfWarning, stacklevel=2)


class Watcher:
    """The poll thread of one trigger directory, and what the training thread shares with it:
    ``step`` (written at each step boundary) and ``plan`` (read there)."""

    def __init__(self, config: OnDemandConfig) -> None:
        self.config = config
        self.folder = os.path.abspath(config.dir)
        self.step: Optional[int] = None
        self.plan: Optional[Plan] = None
        self._stop = threading.Event()
        self._samples: deque[tuple[float, int]] = deque(maxlen=_RATE_SAMPLES)
        self._served: list[dict[str, Any]] = []
        self._served_ids: set[str] = set()
        self._request_seen: Any = None  # (inode, mtime, size) of the request file last read
        self._warned: set[str] = set()
        self._pid, self._host = os.getpid(), socket.gethostname()
        self._thread = threading.Thread(target=self._run, name="torchstep_prof-on-demand", daemon=True)

    # --- the training thread --------------------------------------------------------------

    def at_step(self, frame: Frame, number: int) -> Frame:
        """A step block begins: note the step; the frame to profile it under."""
        self.step = number
        plan = self.plan
        if plan is None:
            return frame
        try:
            return plan.at_step(frame, number)
        except Exception as exc:  # profiling never raises into training: drop the request
            self.plan = None
            plan.entry["outcome"] = f"failed: {exc!r}"
            self._warn_once(f"failed-{plan.request.id}", f"torchstep_prof: on-demand request {plan.request.id} "
                                                         f"dropped ({exc!r}); training goes on")
            return frame

    def wants(self, number: int) -> bool:
        """Whether a plan names step ``number`` (``torchstep-prof run`` arms such a step), noting
        the step; a plan whose steps have passed is retired here."""
        self.step = number
        plan = self.plan
        if plan is None:
            return False
        if number > plan.last:
            plan.retire()
            return False
        return number in plan.steps

    def start(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        self._load_served()
        self._write_status()
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (the scope that opted in exits, or the process does)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.poll_s + 5.0)
        plan = self.plan
        if plan is not None:
            plan.retire(ending=True)
        self._write_status(running=False)

    # --- the poll thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.config.poll_s):
            try:
                self._poll()
            except Exception as exc:  # never let the poll thread die silently, nor raise
                self._warn_once("poll", f"torchstep_prof: on-demand polling of {self.folder} failed ({exc!r})")

    def _poll(self) -> None:
        step = self.step
        if step is not None:
            self._samples.append((time.monotonic(), step))
        if self.plan is None:  # one request at a time: a newer one is read once this one is over
            self._read_request()
        self._write_status()

    def _read_request(self) -> None:
        path = os.path.join(self.folder, REQUEST_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if signature == self._request_seen:
            return
        self._request_seen = signature
        try:
            request = read_request(path)
        except ConfigError as exc:
            lines = "; ".join(f"{p.path or '(the file)'}: {p.message}" for p in exc.problems)
            self._warn_once(f"bad-{signature}", f"torchstep_prof: on-demand request {path} is malformed "
                                                f"({lines}); it is ignored, training goes on")
            return
        except OSError as exc:
            self._request_seen = None  # read again at the next poll
            self._warn_once(f"read-{path}", f"torchstep_prof: on-demand request {path} cannot be read ({exc})")
            return
        if request.id in self._served_ids:
            return  # served already (maybe by this rank's earlier poll thread)
        entry = {"id": request.id, "steps": list(request.steps), "outcome": "pending", "read_at_step": self.step}
        self._served.append(entry)
        self._served_ids.add(request.id)
        del self._served[:-MAX_SERVED]
        self.plan = Plan(self, request, self.step, entry)
        self._write_status()  # its id is recorded before any of its steps can begin

    def _rate(self) -> Optional[float]:
        samples = self._samples
        if len(samples) < 2:
            return None
        (t0, s0), (t1, s1) = samples[0], samples[-1]
        return max(0.0, (s1 - s0) / (t1 - t0)) if t1 > t0 else None

    def _status_path(self) -> tuple[str, Optional[str]]:
        frame = frame_if_read()
        role = frame.config.process_role if frame is not None else None
        return status_path(self.folder, current_topology().rank, role), role

    def _load_served(self) -> None:
        try:
            status = read_status(self._status_path()[0])
        except (OSError, ValueError):
            return
        self._served = list(status.served)[-MAX_SERVED:]
        self._served_ids = status.served_ids()

    def _write_status(self, running: bool = True) -> None:
        # Every poll, so kept cheap (a dict, compact JSON, a fixed temporary name): the poll
        # thread takes the GIL from the training thread while it runs.
        path, role = self._status_path()
        status = {
            "rank": current_topology().rank, "role": role, "pid": self._pid, "host": self._host,
            "step": self.step, "time": time.time(), "rate": self._rate(), "poll_s": self.config.poll_s,
            "served": self._served, "running": running,
        }  # fmt: skip
        temporary = path + ".tmp"  # not a status-rank*.json: readers never see it
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(status))
            os.replace(temporary, path)
        except OSError as exc:
            self._warn_once(f"write-{path}", f"torchstep_prof: on-demand status {path} cannot be written ({exc})")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, TorchstepProfWarning, stacklevel=2)


def watch(frame: Frame) -> None:
    """A frame with ``on_demand`` was made (a scope entered, or the environment read): start
    polling its directory, unless this process already polls one (one per process)."""
    config = frame.config.on_demand
    if config is None or frame.disabled:
        return
    with _LOCK:
        running = ON_DEMAND.watcher
        if running is not None:
            if running.config != config:
                running._warn_once(f"second-{config.dir}", f"torchstep_prof: on_demand.dir={config.dir!r} "
                                   f"ignored: this process already polls {running.config.dir!r}")
            return
        watcher = Watcher(config)
        try:
            watcher.start()
        except OSError as exc:
            warn(f"torchstep_prof: on-demand traces are off: {config.dir!r} cannot be used ({exc})",
                 TorchstepProfWarning, stacklevel=3)
            return
        ON_DEMAND.watcher = watcher
    from ..engine import ENGINE

    # The engine's exit work first: atexit runs the latest registered first, so the watcher's
    # stop (a plan's missed steps) comes before the summary.
    ENGINE.ensure_atexit()
    atexit.register(_stop_at_exit, watcher)


def scope_left(frame: Frame, parent: Frame) -> None:
    """A scope exited: stop polling when it is the one that opted in."""
    config = frame.config.on_demand
    if config is None or parent.config.on_demand == config:
        return
    with _LOCK:
        watcher = ON_DEMAND.watcher
        if watcher is None or watcher.config != config:
            return
        ON_DEMAND.watcher = None
    watcher.stop()


def _stop_at_exit(watcher: Watcher) -> None:
    with _LOCK:
        if ON_DEMAND.watcher is not watcher:
            return
        ON_DEMAND.watcher = None
    try:
        watcher.stop()
    except Exception:  # interpreter exit: nothing to report to
        pass


def _forget_after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    ON_DEMAND.watcher = None  # the poll thread is the parent's


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

when_a_frame_opts_in(watch)
