"""The job's side of on-demand traces: the poll thread, and what a step boundary reads of it.

A job that opts in (``on_demand: {dir: ...}``) gets one daemon thread per process. Every
``poll_s`` it writes this rank's status (status.py) and reads the request file (request.py);
a new, valid request becomes the process-wide plan (plan.py) in ``ON_DEMAND.running.plan``. The
training thread does the least it can: a step boundary stores its step number on the watcher
and reads ``plan`` (``None`` almost always); on a planned step the block pushes the plan's
frame, so regions inside decide under it as under any schedule.

A request is served once: its id goes into the rank's status file when it is read, and a
restarted poll thread reads the ids back.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Optional


from .._shared_files import SharedFileError, replace_exclusively
from ..config.model import OnDemandConfig
from ..errors import ConfigError, TorchstepProfWarning, warn, warn_once
from ..one_per_process import OnePerProcess
from ..selection.frames import Frame, frame_if_read
from ..topology import current_topology
from .plan import Plan
from .request import MAX_ID_LENGTH, MAX_STEPS, REQUEST_FILE, Request, read_request, write_request
from . import running
from .running import ENGINE
from .status import MAX_SERVED, RankStatus, read_status, read_statuses, status_path

if TYPE_CHECKING:
    from ..config.model import AutoTraceConfig
    from ..slow_steps.watch import SlowWatch

__all__ = ["ON_DEMAND", "Watcher", "scope_left", "watch"]


# Re-exported with its worker's type (what step boundaries read: running.py).
ON_DEMAND: OnePerProcess[Watcher] = running.ON_DEMAND
_RATE_SAMPLES = 6  # the step rate is measured over the last few polls: it follows a job that speeds up
_MAX_WARNINGS = 20  # different warnings one poll thread gives


class Watcher:
    """The poll thread of one trigger directory, and what the training thread shares with it:
    ``step`` (written at each step boundary) and ``plan`` (read there)."""

    def __init__(self, config: OnDemandConfig) -> None:
        self.config = config
        self.folder = os.path.abspath(config.dir)
        self.step: Optional[int] = None
        self.plan: Optional[Plan] = None
        self.auto: Optional[SlowWatch] = None  # auto_trace: the slow-step watch this thread runs
        self._stop = threading.Event()
        self._samples: deque[tuple[float, int]] = deque(maxlen=_RATE_SAMPLES)
        self._served: list[dict[str, Any]] = []
        self._served_ids: set[str] = set()
        self._request_seen: Any = None  # (inode, mtime, size) of the request file last read
        self._warned: set[str] = set()
        self.riders: list[Any] = []  # called at each poll: the live status (live/reporter.py) rides here
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
            plan.entry["outcome"] = f"failed: {exc!r}"[:300]
            self._warn_once(
                f"failed-{plan.request.id}",
                f"torchstep_prof: on-demand request {plan.request.id} dropped ({exc!r}); training goes on",
            )
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
        """Start the poll thread. The training thread only makes the folder: every file in it
        is read and written on the poll thread (a FIFO or a huge file planted there must never
        hold up training)."""
        os.makedirs(self.folder, exist_ok=True)  # FileExistsError for a file there: not a folder
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
        try:
            self._load_served()  # before any request is read: a request served already stays so
            self._write_status()
        except Exception as exc:
            self._warn_failure(exc)
        from ..slow_steps.watch import TICK_S

        poll_s = self.config.poll_s
        next_poll = time.monotonic() + poll_s
        # With auto_trace the thread wakes every TICK_S to read the step times (slow_steps/watch.py);
        # the folder is still polled every poll_s.
        while not self._stop.wait(min(poll_s, TICK_S) if self.auto is not None else poll_s):
            auto = self.auto
            if auto is not None:
                try:
                    auto.check(self)
                except Exception as exc:
                    self._warn_failure(exc)
                if time.monotonic() < next_poll:
                    continue
            next_poll = time.monotonic() + poll_s
            try:
                self._poll()
            except Exception as exc:  # never let the poll thread die silently, nor raise
                self._warn_failure(exc)

    # --- auto_trace (slow_steps/watch.py), on this thread ------------------------------------

    def watch_slow_steps(self, config: Optional[AutoTraceConfig]) -> None:
        """Run the slow-step watch of ``config`` on this thread (None: stop it)."""
        old = self.auto
        if old is not None and config is not None and old.config == config:
            return
        if old is not None:
            self.auto = None
            old.close()
        if config is not None:
            from ..slow_steps.watch import SlowWatch

            self.auto = SlowWatch(config)

    def serve_own(self, request: Request) -> None:
        """Serve ``request`` here now, as if read from the folder (a slow step's own capture)."""
        plan = Plan(self, request, self._serving(request))  # its request file, for the peers, is not served again
        plan.at_step_read = self.step
        self.plan = plan
        self._write_status()  # the peers read this rank as slow from now on

    def _serving(self, request: Request) -> dict[str, Any]:
        """The entry of ``request`` in the served list, from now on read as served."""
        entry: dict[str, Any] = {"id": request.id, "steps": list(request.steps), "outcome": "pending"}
        self._served.append(entry)
        self._served_ids.add(request.id)
        del self._served[:-MAX_SERVED]
        return entry

    def ask_peers(self, request: Request) -> None:
        """Write ``request`` (its ranks: the peers) where every rank reads requests."""
        try:
            write_request(self.folder, request)
        except OSError as exc:
            self._warn_once(f"auto-ask-{exc.errno}", f"torchstep_prof: auto trace could not ask its peers ({exc})")

    def statuses(self) -> list[RankStatus]:
        """Every rank's status in the folder (this thread only)."""
        return read_statuses(self.folder)[0]

    def _warn_failure(self, exc: Exception) -> None:
        """One warning per kind of failure: a different one later is said too."""
        self._warn_once(
            f"poll-{type(exc).__name__}-{getattr(exc, 'errno', '')}",
            f"torchstep_prof: on-demand polling of {self.folder} failed ({exc!r})",
        )

    def _poll(self) -> None:
        step = self.step
        if step is not None:
            self._samples.append((time.monotonic(), step))
        if self.plan is None:  # one request at a time: a newer one is read once this one is over
            self._read_request()
        self._write_status()
        for rider in list(self.riders):
            rider()

    def _read_request(self) -> None:
        path = os.path.join(self.folder, REQUEST_FILE)
        try:
            st = os.lstat(path)  # the link itself, as read_request sees it (it follows none)
        except FileNotFoundError:
            return
        except OSError as exc:  # the folder gone or replaced: the status write says so too
            self._warn_once(f"stat-{exc.errno}", f"torchstep_prof: on-demand request {path} cannot be read ({exc})")
            return
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if signature == self._request_seen:
            return
        self._request_seen = signature
        try:
            request = read_request(path)
        except ConfigError as exc:
            lines = "; ".join(f"{p.path or '(the file)'}: {p.message}" for p in exc.problems)
            self._warn_once(
                f"bad-{signature}",
                f"torchstep_prof: on-demand request {path} is malformed ({lines}); it is ignored, training goes on",
            )
            return
        except OSError as exc:
            if not isinstance(exc, SharedFileError):
                self._request_seen = None  # maybe passing (a permission being fixed): read again
            self._warn_once(
                f"read-{type(exc).__name__}-{exc.errno}-{exc if isinstance(exc, SharedFileError) else ''}",
                f"torchstep_prof: on-demand request {path} cannot be read ({exc}); it is ignored, training goes on",
            )
            return
        if request.id in self._served_ids:
            return  # served already (maybe by this rank's earlier poll thread)
        entry = self._serving(request)
        auto = request.rule.get("auto_trace") if request.rule is not None else None
        if isinstance(auto, dict) and current_topology().rank in (request.ranks or ()):
            # A slow rank asks this one to trace the same steps; too late (a rank that slowed
            # too, busy with its own trace meanwhile) is said once, never warned as a miss.
            from ..slow_steps.watch import as_peer

            at = self.step
            if not as_peer(request, auto, at):
                entry["outcome"] = f"missed (auto trace): at step {at} when read"
                self._write_status()
                return
        plan = Plan(self, request, entry)
        self.plan = plan
        # The step read after the plan is published: a step that began meanwhile, without
        # seeing it, is at most this one, so a miss is reported against the right step.
        plan.at_step_read = entry["read_at_step"] = self.step
        self._write_status()  # its id is recorded before any of its steps can begin

    def _rate(self) -> Optional[float]:
        """The fastest step rate between two consecutive polls of the last few: the rule plans
        for it, so a job that speeds up again after a slow patch (its finish hooks starting, a
        checkpoint) does not run past the steps chosen for it before it reads the request."""
        samples = list(self._samples)
        rates = [(s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in zip(samples, samples[1:]) if t1 > t0]
        return max(0.0, *rates) if rates else None

    def _status_path(self) -> tuple[str, Optional[str]]:
        frame = frame_if_read()
        role = frame.config.process_role if frame is not None else None
        return status_path(self.folder, current_topology().rank, role), role

    def _load_served(self) -> None:
        try:
            status = read_status(self._status_path()[0])
        except (OSError, ValueError):
            return
        # Only well-formed entries are kept: this list is written back at every poll.
        self._served = [entry for entry in status.served if _served_entry(entry)][-MAX_SERVED:]
        self._served_ids = {entry["id"] for entry in self._served}

    def _write_status(self, running: bool = True) -> None:
        # Every poll, so kept cheap (a dict, compact JSON): the poll thread takes the GIL from
        # the training thread while it runs. A new file and a rename: a link someone planted at
        # the status name (or at any temporary name) is replaced, never written through.
        path, role = self._status_path()
        status: dict[str, Any] = {
            "rank": current_topology().rank, "role": role, "pid": self._pid, "host": self._host,
            "step": self.step, "time": time.time(), "rate": self._rate(), "poll_s": self.config.poll_s,
            "served": self._served, "running": running,
        }  # fmt: skip
        auto = self.auto
        if auto is not None:  # what a slow rank reads to choose peers and count the job's bytes
            from ..slow_steps.decisions import own_auto_bytes

            status["auto"] = {"slow": auto.is_slow(self.step), "bytes": own_auto_bytes()}
        try:
            replace_exclusively(path, json.dumps(status).encode("utf-8"))
        except OSError as exc:
            self._warn_once(  # once per kind: a different failure later is said too
                f"write-{path}-{exc.errno}", f"torchstep_prof: on-demand status {path} cannot be written ({exc})"
            )

    def _warn_once(self, key: str, message: str) -> None:
        """Warn once per ``key``; after :data:`_MAX_WARNINGS` different ones, say that later
        ones are not shown (anyone who can write the folder can make a new bad request each poll)."""
        warn_once(
            self._warned,
            key,
            message,
            limit=_MAX_WARNINGS,
            past_limit=f"torchstep_prof: on-demand: {_MAX_WARNINGS} warnings about {self.folder}; later ones are not shown",
        )


def _served_entry(entry: Any) -> bool:
    """Whether a served-request line read back from a status file is one this module wrote."""
    steps = entry.get("steps")
    return (
        isinstance(entry.get("id"), str)
        and len(entry["id"]) <= MAX_ID_LENGTH
        and isinstance(steps, list)
        and len(steps) <= MAX_STEPS
        and all(isinstance(n, int) for n in steps)
        and isinstance(entry.get("outcome"), str)
        and len(entry["outcome"]) <= 400
        and len(entry) <= 4
    )


def watch(frame: Frame) -> None:
    """A frame with ``on_demand`` was made (a scope entered, or the environment read): start
    polling its directory, unless this process already polls one (one per process)."""
    config = frame.config.on_demand
    if frame.disabled:
        return
    if frame.config.auto_trace is not None and (config is None or frame.metrics is None):
        _warn_auto_needs(config is None, frame.metrics is None)
        return
    if config is None:
        return

    def second(running: Watcher) -> None:
        if frame.config.auto_trace is not None:
            running.watch_slow_steps(frame.config.auto_trace)
        if running.config != config:
            running._warn_once(
                f"second-{config.dir}",
                f"torchstep_prof: on_demand.dir={config.dir!r} ignored: this process already polls {running.config.dir!r}",
            )

    def make() -> Optional[Watcher]:
        watcher = Watcher(config)
        watcher.watch_slow_steps(frame.config.auto_trace)
        try:
            watcher.start()
        except OSError as exc:
            warn(
                f"torchstep_prof: on-demand traces are off: {config.dir!r} cannot be used ({exc})",
                TorchstepProfWarning,
            )
            return None
        # The engine's exit work first: atexit runs the latest registered first, so the watcher's
        # stop (a plan's missed steps), registered next, comes before the summary.
        ENGINE[0].ensure_atexit()
        return watcher

    ON_DEMAND.start(make, second)


def scope_left(frame: Frame, parent: Frame) -> None:
    """A scope exited: stop polling when it is the one that opted in."""
    config = frame.config.on_demand
    auto = frame.config.auto_trace
    if auto is not None and parent.config.auto_trace != auto:
        watcher = ON_DEMAND.running
        if watcher is not None:  # the scope that turned it on exits: the parent's watch, if any
            watcher.watch_slow_steps(parent.config.auto_trace)
    if config is None or parent.config.on_demand == config:
        return
    ON_DEMAND.stop_if(lambda watcher: watcher.config == config)


_AUTO_WARNED: set[str] = set()


def _warn_auto_needs(no_folder: bool, no_metrics: bool) -> None:
    """auto_trace reads the metrics' step times and reaches peers through the on-demand folder."""
    missing = [name for name, off in (("metrics", no_metrics), ("on_demand", no_folder)) if off]
    examples = {"metrics": "tsp.metrics() or metrics: {port: 18400}", "on_demand": "on_demand: {dir: DIR}"}
    warn_once(
        _AUTO_WARNED,
        "+".join(missing),
        f"torchstep_prof: auto_trace is off: it needs {' and '.join(missing)} on too "
        f"({'; '.join(examples[m] for m in missing)})",
        TorchstepProfWarning,
    )
