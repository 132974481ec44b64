"""One process's slow-step watch: samples in, decisions out, on the on-demand poll thread.

The training thread only appends ``(step, seconds)`` where the metrics already time the step
(``region_metrics.recorder.WATCHED``); a watched region's times come from the metrics' fold.
Every :data:`TICK_S` the on-demand watcher's thread (triggers/watcher.py) calls
:meth:`SlowWatch.check`, which runs the rule (rule.py) and, on a slowdown, decides within the
budget: this rank serves an on-demand plan of its own for the chosen steps, and the request
file asks ``peers`` ranks that did not slow to trace the same steps. Every decision is a line
in the exit summary and a count in the metrics; every automatic trace carries why (why.py).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from collections import deque
from typing import Any, Optional, Protocol

from .._shared_files import replace_exclusively
from ..config.model import AutoTraceConfig
from ..region_metrics import recorder as _recorder
from ..rendering import safe_text, step_ranges
from ..topology import current_topology
from . import why as _why
from .decisions import DECISIONS as _DECISIONS
from .decisions import own_auto_bytes
from .rule import HOUR_S, Budget, Detector, Slowdown


__all__ = ["DECISION_PREFIX", "MAX_DECISION_LINES", "TICK_S", "SlowWatch", "as_peer"]

TICK_S = 0.05
"""How often the watch reads its samples: a slowdown is acted on within this, off the training thread."""
DECISION_PREFIX = "auto-"
"""The name of a capture's record in the on-demand folder: ``auto-<id>.json``, one per capture."""
MAX_DECISION_LINES = 20  # exit-summary lines of decisions; later ones are counted in the metrics
_MAX_SAMPLES = 65_536  # per tick at most; a stalled watch thread keeps the newest
_MAX_RECORDS_READ = 10_000


class _Watcher(Protocol):
    """What the watch uses of the on-demand watcher (triggers/watcher.py) that runs it."""

    step: Optional[int]
    plan: Any
    folder: str

    def serve_own(self, request: Any) -> None: ...
    def ask_peers(self, request: Any) -> None: ...
    def statuses(self) -> list[Any]: ...
    def _warn_once(self, key: str, message: str) -> None: ...


def _note(key: str, line: str) -> None:
    """A decision's line in the exit summary (the first :data:`MAX_DECISION_LINES`)."""
    from ..summary.records import STORE

    if _DECISIONS.lines >= MAX_DECISION_LINES:
        return
    _DECISIONS.lines += 1
    STORE.add_attention(key, line)


def _number(value: Any, spec: str) -> str:
    """A number from a request file as the exit line shows it (anything else: escaped text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return safe_text(str(value)[:40])


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


class SlowWatch:
    """The rule and budget of one ``auto_trace`` config, fed by the watcher's thread."""

    def __init__(self, config: AutoTraceConfig) -> None:
        self.config = config
        self.detector = Detector(
            metric=config.on, factor=config.factor, min_ms=config.min_ms, baseline_steps=config.baseline_steps
        )
        self.budget = Budget(
            max_per_hour=config.max_traces_per_hour, max_bytes=config.max_bytes, cooldown_steps=config.cooldown_steps
        )
        self.last_capture_step: Optional[int] = None
        self.quiet_until = -1  # samples of steps up to this one are left out (a trace near them)
        self.slow_at: Optional[int] = None  # the step of this rank's last slowdown (its status says so)
        watched = _recorder.WATCHED
        if config.on == "step":
            self._samples: Any = deque(maxlen=_MAX_SAMPLES)
            watched.steps = self._samples
        else:
            role, _, stage = config.on.partition("/")
            watched.region = []
            watched.key = (role, stage)

    def close(self) -> None:
        watched = _recorder.WATCHED
        if watched.steps is getattr(self, "_samples", None):
            watched.steps = None
        watched.key = None

    # --- the watcher's thread ---------------------------------------------------------------

    def _drain(self, watcher: _Watcher) -> list[tuple[int, float]]:
        if self.config.on == "step":
            samples = self._samples
            return [samples.popleft() for _ in range(len(samples))]
        _recorder.drain()  # the watched region's times, folded now
        watched = _recorder.WATCHED
        taken = watched.region[: len(watched.region)]
        del watched.region[: len(taken)]
        step = watcher.step if watcher.step is not None else 0
        return [(step, seconds) for seconds in taken[-_MAX_SAMPLES:]]

    def check(self, watcher: _Watcher) -> None:
        """Read the samples since the last tick; decide on the first slowdown among them.

        Steps near a trace are left out: a profiled step (any: scheduled, requested or this
        watch's own), the warm-up before it, and the step after it are slower for it."""
        from ..triggers.running import ENGINE

        plan = watcher.plan
        if plan is not None:
            self.quiet_until = max(self.quiet_until, plan.last + 1)
        if ENGINE and ENGINE[0].slot.session is not None:
            self.quiet_until = max(self.quiet_until, (watcher.step or 0) + 1)
        for step, seconds in self._drain(watcher):
            if step <= self.quiet_until:
                continue
            slow = self.detector.observe(step, seconds)
            if slow is not None:
                self.decide(watcher, slow)
                self.detector.relearn()  # one decision per slowdown: a rank that stays slow is traced once

    def is_slow(self, step: Optional[int]) -> bool:
        """Whether this rank slowed lately (within a baseline of steps): no peer for another."""
        return self.slow_at is not None and (step is None or step - self.slow_at <= self.config.baseline_steps)

    def decide(self, watcher: _Watcher, slow: Slowdown) -> None:
        rank = current_topology().rank
        self.slow_at = slow.step
        head = f"auto trace: step {slow.step}, rank {rank}: {slow.ratio:.1f}x its median {slow.baseline_ms:.0f} ms"
        refusal = self._refusal(watcher, slow)
        if refusal is not None:
            _DECISIONS.counts["skipped"] += 1
            _note(f"auto-trace-skip-{rank}-{slow.step}", f"{head}; not traced ({refusal})")
            return
        steps, peers = self._choose(watcher, rank)
        request_id = f"{DECISION_PREFIX}{rank}-{slow.step}-{secrets.token_hex(3)}"
        why = dict(slow.why(), rank=rank, request=request_id, peers=peers)
        from ..triggers.request import Request

        own = Request(id=request_id, steps=steps, ranks=(rank,), all_ranks=False, rule={"auto_trace": why})
        watcher.serve_own(own)
        self.quiet_until = steps[-1] + 1
        _why.note(steps, why)
        _DECISIONS.steps.update(steps)
        self.last_capture_step = slow.step
        self._record(watcher, request_id, why, steps)
        if peers:
            asked = Request(id=request_id, steps=steps, ranks=tuple(peers), all_ranks=False, rule={"auto_trace": why})
            watcher.ask_peers(asked)
        _DECISIONS.counts["traced"] += 1
        _note(f"auto-trace-{request_id}", f"{head}; traced steps {step_ranges(steps)} on {_ranks([rank, *peers])}")

    def _refusal(self, watcher: _Watcher, slow: Slowdown) -> Optional[str]:
        if watcher.plan is not None:
            return "busy: a trace of this rank's is planned already"
        statuses = watcher.statuses()
        job_bytes = sum(s.auto_bytes for s in statuses if s.rank != current_topology().rank) + own_auto_bytes()
        return self.budget.refuse(
            step=slow.step,
            last_capture_step=self.last_capture_step,
            captures_last_hour=_captures_since(watcher.folder, time.time() - HOUR_S),
            bytes_written=job_bytes,
        )

    def _choose(self, watcher: _Watcher, rank: int) -> tuple[tuple[int, ...], list[int]]:
        """The steps (every rank asked can still reach them: the on-demand rule) and the peers:
        the lowest ranks running that did not slow lately."""
        from ..triggers.planning import choose_steps

        from ..triggers.status import is_stale

        now = time.time()
        statuses = [s for s in watcher.statuses() if s.running and not is_stale(s, now)]
        now_step = watcher.step if watcher.step is not None else 0
        others = sorted({s.rank for s in statuses if s.rank != rank and not s.slow})
        peers = others[: self.config.peers]
        asked = [s for s in statuses if s.rank in peers]
        first = now_step + 2  # one to spare: the step after the one running now may begin meanwhile
        if asked:
            first = max(first, choose_steps(asked, now, self.config.next, 1)[0][0])
        return tuple(range(first, first + self.config.next)), peers

    def _record(self, watcher: _Watcher, request_id: str, why: dict[str, Any], steps: tuple[int, ...]) -> None:
        """The capture's record in the folder: the job's hourly budget counts these."""
        data = dict(why, steps=list(steps), time=time.time())
        try:
            replace_exclusively(os.path.join(watcher.folder, f"{request_id}.json"), json.dumps(data).encode())
        except OSError as exc:
            watcher._warn_once(f"auto-record-{exc.errno}", f"torchstep_prof: auto trace record not written ({exc})")


def _captures_since(folder: str, since: float) -> int:
    """The job's captures recorded in ``folder`` since ``since`` (every rank writes its own)."""
    count = 0
    try:
        with os.scandir(folder) as entries:
            for i, entry in enumerate(entries):
                if i >= _MAX_RECORDS_READ:
                    break
                name = entry.name
                if name.startswith(DECISION_PREFIX) and name.endswith(".json"):
                    try:
                        if entry.stat(follow_symlinks=False).st_mtime >= since:
                            count += 1
                    except OSError:
                        continue
    except OSError:
        return 0
    return count


def as_peer(request: Any, why: dict[str, Any], at_step: Optional[int]) -> bool:
    """This rank, at ``at_step``, is asked by a slow rank to trace ``request``'s steps: whether
    it still can (its traces then carry the same why); the decision is written down either way."""
    steps = tuple(request.steps)
    rank = current_topology().rank
    why = _checked(why)
    slow = (
        f"rank {_number(why.get('rank'), '')} (its step {_number(why.get('step'), '')}: "
        f"{_number(why.get('ratio'), '.1f')}x its median {_number(why.get('baseline_ms'), '.0f')} ms)"
    )
    if at_step is not None and steps[0] <= at_step:
        _DECISIONS.counts["peer-missed"] += 1
        _note(
            f"auto-trace-peer-{request.id}",
            f"auto trace: rank {rank} could not trace steps {step_ranges(steps)} for {slow}: it was at step {at_step}",
        )
        return False
    _why.note(steps, dict(why, peer=rank))
    _DECISIONS.steps.update(steps)
    _DECISIONS.counts["peer"] += 1
    _note(
        f"auto-trace-peer-{request.id}",
        f"auto trace: rank {rank} traces steps {step_ranges(steps)} as a peer of {slow}",
    )
    return True


_WHY_NUMBERS = ("step", "value_ms", "baseline_ms", "factor", "ratio", "rank")


def _checked(why: dict[str, Any]) -> dict[str, Any]:
    """A why read from the request file, as written into traces: its known keys, numbers as
    numbers and short text (anyone who can write the folder can write a request)."""
    kept: dict[str, Any] = {
        key: why[key]
        for key in _WHY_NUMBERS
        if isinstance(why.get(key), (int, float)) and not isinstance(why.get(key), bool) and math.isfinite(why[key])
    }
    for key in ("metric", "request"):
        if isinstance(why.get(key), str):
            kept[key] = why[key][:200]
    return kept
