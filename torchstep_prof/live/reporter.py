"""The job's side of live status: the status thread, and what a step boundary tells it.

A job that opts in (a ``stall`` section, or an ``on_demand`` folder) gets one daemon thread per
process (with only an ``on_demand`` folder, the on-demand poll thread does this work: no second
thread). Every ``poll_s`` it samples the training thread (the thread of the last step
boundary, else the main thread) from outside: its stack and collective (sampling.py) and its
open regions (open_regions.py), and writes them to ``live-rank<R>.json`` (status.py) with a new
file and a rename. The training thread only stores its step number at each step boundary.
The stall detector (stall.py) runs on the same thread: it never touches the training thread.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from threading import get_ident
from typing import Any, Optional

import attrs

from .._shared_files import replace_exclusively
from ..config.model import ProfilerConfig, StallConfig
from ..errors import TorchstepProfWarning, warn, warn_once
from ..one_per_process import OnePerProcess
from ..selection.frames import Frame
from ..topology import current_topology
from ..triggers.watcher import ON_DEMAND
from . import sampling
from .open_regions import open_regions
from . import running
from .stall import fire
from .status import live_path, stall_path

__all__ = ["LIVE", "LiveSettings", "Reporter", "scope_left", "settings_of", "watch"]

_RECENT_STEPS = 20  # the slowest of the last few step times sets an adaptive stall threshold
_MAX_WARNINGS = 20


@attrs.frozen(kw_only=True)
class LiveSettings:
    """What one status thread does: where it writes, how often, and the stall rule (None: none)."""

    dir: str
    poll_s: float
    stall: Optional[StallConfig]


# Re-exported with its worker's type (what step boundaries read: running.py).
LIVE: OnePerProcess[Reporter] = running.LIVE


def settings_of(config: ProfilerConfig) -> Optional[LiveSettings]:
    """The live status a config asks for: the ``stall`` section's (its ``dir`` unset: the
    ``on_demand`` folder, else ``<save_path>/status``), else the ``on_demand`` folder's
    without a stall rule; None when it asks for none (or ``enable`` is false)."""
    stall, on_demand = config.stall, config.on_demand
    if not config.enable or (stall is None and on_demand is None):
        return None
    if stall is None:
        assert on_demand is not None  # (for mypy: one of the two is set)
        return LiveSettings(dir=os.path.abspath(on_demand.dir), poll_s=on_demand.poll_s, stall=None)
    folder = stall.dir or (on_demand.dir if on_demand is not None else os.path.join(config.save_path, "status"))
    return LiveSettings(dir=os.path.abspath(folder), poll_s=stall.poll_s, stall=stall)


class Reporter:
    """The status thread of one folder, and what the training thread shares with it: ``step``
    and ``thread`` (the ident of the thread that entered it), written at each step boundary."""

    def __init__(self, settings: LiveSettings, role: Optional[str], save_path: str) -> None:
        self.settings = settings
        self.role = role
        self.save_path = save_path
        self.step: Optional[int] = None
        self.thread: Optional[int] = None
        self._stop = threading.Event()
        self._pid, self._host = os.getpid(), socket.gethostname()
        self._seen_step: Optional[int] = None
        self._progress = time.monotonic()  # when the step last changed (or the thread started)
        self._step_since: Optional[float] = None
        self._durations: deque[float] = deque(maxlen=_RECENT_STEPS)
        self._collective: tuple[Optional[str], Optional[int]] = (None, None)
        self._collective_since: Optional[float] = None
        self._path: Optional[str] = None
        self._fired = False  # the stall rule fires once per process
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="torchstep_prof-live", daemon=True)
        self._rides: Any = None  # the on-demand poll thread's watcher this status rides, if any

    # --- the training thread --------------------------------------------------------------

    def at_step(self, number: int) -> None:
        """A step block begins on this thread."""
        self.step = number
        self.thread = get_ident()

    def start(self, rides: Any = None) -> None:
        """Start polling: on the on-demand poll thread's watcher ``rides`` (the same folder and
        poll: no second thread), else on a thread of its own. The training thread only makes
        the folder: every file in it is written by the polling thread (a FIFO planted there
        must never hold up training)."""
        os.makedirs(self.settings.dir, exist_ok=True)  # FileExistsError for a file there: not a folder
        if rides is not None:
            self._rides = rides
            rides.riders.append(self._poll_quietly)
        else:
            self._thread.start()

    def stop(self) -> None:
        """Stop (the scope that opted in exits, or the process does); the status says so."""
        self._stop.set()
        if self._rides is not None:
            try:
                self._rides.riders.remove(self._poll_quietly)
            except ValueError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.settings.poll_s + 5.0)
        try:
            self.poll(running=False)
        except Exception as exc:
            self._warn_failure(exc)

    # --- the status thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._poll_quietly()
            if self._stop.wait(self.settings.poll_s):
                return

    def _poll_quietly(self) -> None:
        if self._stop.is_set():
            return
        try:
            self.poll()
        except Exception as exc:  # never let the polling thread die silently, nor raise
            self._warn_failure(exc)

    def threshold_s(self) -> Optional[float]:
        """Seconds without a new step that make a stall (None: no stall rule)."""
        rule = self.settings.stall
        if rule is None:
            return None
        if rule.after_s is not None:
            return rule.after_s
        slowest = max(self._durations, default=0.0)
        return max(rule.floor_s, rule.factor * slowest)

    def poll(self, running: bool = True) -> dict[str, Any]:
        """Sample the training thread, write the status, run the stall rule; the status written."""
        now, mono = time.time(), time.monotonic()
        step = self.step
        if step != self._seen_step:
            if self._seen_step is not None and step is not None and step > self._seen_step:
                self._durations.append((mono - self._progress) / (step - self._seen_step))
            self._seen_step, self._progress, self._step_since = step, mono, now
        ident = self.thread if self.thread is not None else threading.main_thread().ident
        # The status thread's own stack says nothing (the final status, written as the scope exits).
        frames = sampling.frames_of(ident) if ident is not None and ident != get_ident() else []
        collective = sampling.collective_of(frames)
        key = (collective, sampling.sequence_number() if collective is not None else None)
        if key != self._collective:
            self._collective, self._collective_since = key, now if collective is not None else None
        user = sampling.user_frame(frames)
        where = f"{user.f_code.co_filename}:{user.f_lineno} in {user.f_code.co_name}" if user is not None else None
        regions = open_regions().get(ident, []) if ident is not None else []
        quiet_s = mono - self._progress
        threshold = self.threshold_s()
        # Armed from the first step on: imports, data loading and compiling before it may take long.
        stalled = running and threshold is not None and step is not None and quiet_s > threshold
        topology = current_topology()
        status: dict[str, Any] = {
            "kind": "torchstep_prof live status", "rank": topology.rank, "world_size": topology.world_size,
            "role": self.role, "pid": self._pid,
            "host": self._host, "time": now, "poll_s": self.settings.poll_s, "running": running, "step": step,
            "step_since": self._step_since,
            "regions": [{"role": str(r)[:300], "stage": str(s)[:300], "since": t} for r, s, t in regions[-64:]],
            "collective": key[0], "ordinal": key[1], "collective_since": self._collective_since,
            "where": where, "stack": sampling.stack_lines(frames), "quiet_s": round(quiet_s, 3),
            "threshold_s": threshold, "stalled_s": round(quiet_s, 3) if stalled else None,
        }  # fmt: skip
        self._write(topology.rank, status)
        if stalled and not self._fired:
            path = stall_path(self.settings.dir, topology.rank, self.role)
            fire(path, self.settings.dir, status, quiet_s, self.settings.stall, self.save_path, topology)
            self._fired = True
        return status

    def _write(self, rank: int, status: dict[str, Any]) -> None:
        # A new file and a rename: a link someone planted at the status name (or at any
        # temporary name) is replaced, never written through.
        path = live_path(self.settings.dir, rank, self.role)
        if self._path is not None and path != self._path:  # the rank became known (init_process_group)
            try:
                os.unlink(self._path)
            except OSError:
                pass
        self._path = path
        try:
            replace_exclusively(path, json.dumps(status).encode("utf-8"))
        except OSError as exc:
            self._warn_once(
                f"write-{path}-{exc.errno}", f"torchstep_prof: live status {path} cannot be written ({exc})"
            )

    def _warn_failure(self, exc: Exception) -> None:
        self._warn_once(
            f"poll-{type(exc).__name__}", f"torchstep_prof: live status in {self.settings.dir} failed ({exc!r})"
        )

    def _warn_once(self, key: str, message: str) -> None:
        warn_once(self._warned, key, message, limit=_MAX_WARNINGS)


def watch(frame: Frame) -> None:
    """A frame that opts in to live status was made (a scope entered, or the environment read):
    start its status thread, unless this process already runs one (one per process)."""
    settings = settings_of(frame.config)
    if settings is None:
        return

    def second(running: Reporter) -> None:
        if running.settings != settings and settings.stall is not None:
            running._warn_once(
                f"second-{settings}",
                f"torchstep_prof: stall settings for {settings.dir!r} ignored: this process already "
                f"keeps its live status in {running.settings.dir!r}",
            )

    def make() -> Optional[Reporter]:
        reporter = Reporter(settings, frame.config.process_role, frame.config.save_path)
        # Only the on-demand folder, no stall rule: its poll thread (started first, for the
        # same frame) writes the live status too.
        watcher = ON_DEMAND.running
        rides = watcher if settings.stall is None and watcher is not None and watcher.folder == settings.dir else None
        try:
            reporter.start(rides)
        except OSError as exc:
            warn(
                f"torchstep_prof: live status is off: {settings.dir!r} cannot be used ({exc})",
                TorchstepProfWarning,
            )
            return None
        return reporter

    LIVE.start(make, second)


def scope_left(frame: Frame, parent: Frame) -> None:
    """A scope exited: stop the status thread when it is the one that opted in."""
    settings = settings_of(frame.config)
    if settings is None or settings_of(parent.config) == settings:
        return
    LIVE.stop_if(lambda reporter: reporter.settings == settings)
