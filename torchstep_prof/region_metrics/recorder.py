"""Region and step wall times, kept in plain per-thread lists: what the metrics and the span log read.

With metrics on (``tsp.metrics``, the ``metrics`` config section) or spans on (``tsp.spans``, the
span log of timeline/span_log.py), every region and step block is timed, profiled or not. Each
thread appends ``role, stage, start, end`` to its own flat list at a region's exit, and only it
ever appends there: the training thread takes no lock per region and pays one ``list.extend``
(a bucket search and three sums cost twice as much, so they are left to readers; one flat list,
four items a span, because a tuple kept per span is a container the garbage collector tracks).
Step blocks append ``None, number, start, end``; clock anchors ``ANCHOR, "name\\0seq", start,
end``; Ray calls and tasks ``RAY, "what\\0task id", start, end``.

One reader drains the lists (:func:`drain`: the folding thread once a second, the span log's
thread, a scrape, the exit summary): it takes the first ``n`` items of each and deletes exactly
those, two atomic list operations, so a span appended meanwhile is drained next time, never
lost. With metrics on it folds the durations into process-wide histograms; with spans on it
keeps the batches for the span log (:func:`take_spans`). Metrics, spans, or both: a region costs
the same, one append.

Every asyncio task and decorated call times on its own region object, so interleaved tasks
never mix their start times.

A process keeps a series of its own for at most :data:`MAX_PAIRS` distinct (role, stage) pairs;
pairs seen after that (labels made from data, ``f"step{n}"``) are all counted under
:data:`OTHER_KEY`, with one warning, so a scrape, the summary and memory stay bounded.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Any, Iterator, Optional

import attrs

from .._fork import at_fork_in_child

__all__ = [
    "BOUNDS",
    "MAX_PAIRS",
    "OTHER_KEY",
    "CellStats",
    "TimedInner",
    "TimedRegion",
    "WATCHED",
    "drain",
    "quantile",
    "record_step",
    "snapshot",
]

_perf = time.perf_counter
_LOCAL = threading.local()  # .spans: this thread's flat list (role, stage, start, end, ...)
_SPAN_LISTS: list[tuple[threading.Thread, list[Any]]] = []  # every thread's list
_STORES_LOCK = threading.Lock()  # taken once per thread (its list's registration), and by readers
_DRAIN_LOCK = threading.Lock()  # one drain at a time: the histograms and the batches stay in order
_FOLDED: dict[tuple[Any, Any], list[Any]] = {}  # (role, stage) -> [sum_s, max_s, n_0, ..., n_k]
_UNWRITTEN: list[tuple[threading.Thread, list[Any]]] = []  # drained batches the span log has not taken
FOLD_EVERY_S = 1.0

STEP_KEY = None  # the (role, stage) key of step blocks' series: (None, None), never a label
ANCHOR = "\x00anchor"  # the first item of an anchor's span: never a label (labels are checked text)
RAY = "\x00ray"  # the first item of a Ray call's or task's span (integrations/ray.py)

MAX_PAIRS = 256
"""Distinct (role, stage) pairs a process times each in a series of its own (about 20 series each)."""
OTHER_KEY = ("other", "other")
"""Where the times of every pair past :data:`MAX_PAIRS` go (one series, role and stage ``other``)."""
# The series each key folds into: an admitted pair's own (labels as text). Written by the
# drain, at most MAX_PAIRS + 1 keys plus the non-text spellings of admitted pairs.
_SERIES: dict[tuple[Any, Any], tuple[Any, Any]] = {(STEP_KEY, STEP_KEY): (STEP_KEY, STEP_KEY)}
_ADMITTED: set[tuple[str, str]] = set()  # the pairs with a series of their own
_capped: set[bool] = set()  # not empty once a pair went past the cap (warned once)

BOUNDS: list[float] = []
"""The buckets' upper bounds in seconds, set once per process (:func:`set_bounds`)."""
_SPANS_ON: list[bool] = []  # not empty while spans are on in this process

_folding: list[threading.Thread] = []  # the folding thread, once started


def set_bounds(bounds: tuple[float, ...]) -> None:
    """Use ``bounds`` from now on and start the folding thread (bounds already set are kept)."""
    with _STORES_LOCK:
        if BOUNDS:
            return
        BOUNDS[:] = [float(b) for b in bounds]
        if not _folding:
            _folding.append(threading.Thread(target=_fold_forever, name="torchstep_prof metrics", daemon=True))
            _folding[0].start()


def forget() -> None:
    """Drop every time recorded and the buckets (tests that start metrics afresh in-process)."""
    with _DRAIN_LOCK, _STORES_LOCK:
        BOUNDS.clear()
        _FOLDED.clear()
        _IDLE.clear()
        _ADMITTED.clear()
        _SERIES.clear()
        _SERIES[STEP_KEY, STEP_KEY] = (STEP_KEY, STEP_KEY)
        _capped.clear()
        _UNWRITTEN.clear()
        for _, spans in _SPAN_LISTS:
            spans.clear()


class TimedRegion(tuple):  # type: ignore[type-arg]
    """A region timed and not profiled: ``TimedRegion((role, stage, t0))``, timed from ``t0``
    (``perf_counter`` as it is made, in ``with profile_region(...)`` as it is entered) to its exit.

    A tuple made by ``tuple``'s own C constructor: no Python frame on creation, as no
    ``__init__`` runs (the region's cost is mostly frames; docs/hot-path.md).
    """

    __slots__ = ()
    # A C callable, as _IdleRegion's __exit__ (regions.py): no Python frame on entry. ``as``
    # gets () (a not-profiled region has nothing to offer there): ``tuple`` is vectorcalled,
    # ~9 ns cheaper than ``str`` or ``"".format``.
    __enter__ = staticmethod(tuple)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            _LOCAL.spans.extend(self + (_perf(),))
        except AttributeError:  # this thread's first span
            _spans_here().extend(self + (_perf(),))


class TimedInner:
    """A timed region that is also something else (a range in a trace, a trace of its own):
    the time is the block's, inside ``inner`` (a profiler's start and stop are not in it)."""

    __slots__ = ("role", "stage", "t0", "inner")

    def __init__(self, role: str, stage: str, inner: Any) -> None:
        self.role = role
        self.stage = stage
        self.inner = inner

    def __enter__(self) -> Any:
        entered = self.inner.__enter__()
        self.t0 = _perf()
        return entered

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        TimedRegion((self.role, self.stage, self.t0)).__exit__(exc_type, exc, tb)
        return self.inner.__exit__(exc_type, exc, tb)


def _spans_here() -> list[Any]:
    try:
        return _LOCAL.spans  # type: ignore[no-any-return]
    except AttributeError:
        spans: list[Any] = []
        with _STORES_LOCK:
            _SPAN_LISTS.append((threading.current_thread(), spans))
        _LOCAL.spans = spans
        return spans


class _Watched:
    """What slow-step tracing (slow_steps/watch.py) reads: ``steps`` gets ``(number, seconds)``
    of each step (None: not watching steps, the usual case, one attribute read per step);
    ``key`` is the watched region's (role, stage), whose folded durations go to ``region``;
    ``last_step_at`` is the wall time a fold last found a new step (the last-step gauge: a
    fold's second of precision costs the training thread nothing)."""

    __slots__ = ("steps", "key", "region", "last_step_at")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps: Optional[Any] = None  # a deque, appended to by the thread that ends a step
        self.key: Optional[tuple[str, str]] = None
        self.region: list[float] = []
        self.last_step_at: Optional[float] = None


WATCHED = _Watched()


def record_step(seconds: float, number: Optional[int] = None, start: Optional[float] = None) -> None:
    """A step block lasted ``seconds`` (its end calls this, in whichever thread ends it), from
    ``start`` (``perf_counter``), its ``number`` if it said one."""
    if start is None:
        start = _perf() - seconds
    _spans_here().extend((None, number, start, start + seconds))
    watched = WATCHED.steps
    if watched is not None and number is not None:
        watched.append((number, seconds))  # a deque's append: atomic, no lock


def spans_on(on: bool = True) -> None:
    """Keep spans for the span log from now on (``on``), or stop (the span log starts and stops them)."""
    with _STORES_LOCK:
        _SPANS_ON[:] = [True] if on else []
        if not on:
            _UNWRITTEN.clear()


def record_anchor(name: str, seq: int, start: float, end: float) -> None:
    """A clock anchor (``tsp.clock_anchor``) was entered at ``start`` and left at ``end``."""
    if _SPANS_ON:
        _spans_here().extend((ANCHOR, f"{name}\x00{seq}", start, end))


def record_ray(what: str, task: str, start: float, end: float) -> None:
    """A Ray task ``task`` was submitted or got (``what``: ``submitted``, ``returned``; an
    instant, ``start == end``) here, or ran here from ``start`` to ``end`` (``ran``)."""
    if _SPANS_ON:
        _spans_here().extend((RAY, f"{what}\x00{task}", start, end))


def drain() -> None:
    """Take every thread's spans recorded since the last drain: their durations into the
    histograms (metrics on), the batches kept for :func:`take_spans` (spans on)."""
    with _DRAIN_LOCK:
        taken = []
        with _STORES_LOCK:
            lists = list(_SPAN_LISTS)
            _SPAN_LISTS[:] = [(t, spans) for t, spans in lists if t.is_alive() or spans]
        for thread, spans in lists:
            n = len(spans)  # a multiple of 4: list.extend of a tuple is atomic
            if n:
                batch = spans[:n]
                del spans[:n]  # exactly those: one appended meanwhile stays for next time
                taken.append((thread, batch))
        over = None
        if BOUNDS:
            for _, batch in taken:
                over = _fold(batch) or over
        if _SPANS_ON:
            with _STORES_LOCK:
                _UNWRITTEN.extend(taken)
    if over is not None:
        from ..errors import MetricsWarning, warn

        warn(
            f"torchstep_prof: more than {MAX_PAIRS} distinct (role, stage) pairs are timed; "
            f"{over[0]!r}/{over[1]!r} and every later new pair are counted as role 'other', stage 'other' "
            "(labels should name code, not data such as step numbers or sample ids)",
            MetricsWarning,
        )


def take_spans() -> list[tuple[threading.Thread, list[Any]]]:
    """Every thread's spans recorded since the last call (the span log's thread only), each
    thread's as one flat list: role, stage, start, end, role, stage, ..."""
    drain()
    with _STORES_LOCK:
        taken = list(_UNWRITTEN)
        _UNWRITTEN.clear()
    return taken


def _fold(batch: list[Any]) -> Optional[tuple[str, str]]:
    """Fold one thread's spans into the histograms (under the drain lock); the first pair that
    went past the cap, if one did now."""
    bounds = BOUNDS
    width = len(bounds) + 1
    watched_key = WATCHED.key
    over = None
    for i in range(0, len(batch), 4):
        role, stage, start, end = batch[i : i + 4]
        if role is None:
            key: tuple[Any, Any] = (STEP_KEY, STEP_KEY)
            WATCHED.last_step_at = time.time()
        elif role is ANCHOR or role is RAY:
            continue
        else:
            try:
                key = _SERIES[role, stage]
            except (KeyError, TypeError):  # TypeError: an unhashable label, timed under its text
                key, first_over = _admit(role, stage)
                over = over or first_over
        seconds = end - start
        if key == watched_key:
            WATCHED.region.append(seconds)
        into = _FOLDED.get(key)
        if into is None:
            into = _FOLDED[key] = [0.0, 0.0] + [0] * width
        into[0] += seconds
        if seconds > into[1]:
            into[1] = seconds
        into[bisect_left(bounds, seconds) + 2] += 1
    return over


def _admit(role: Any, stage: Any) -> tuple[tuple[Any, Any], Optional[tuple[str, str]]]:
    """The series a pair seen for the first time is timed under, admitting it while there is
    room (its labels are checked here, as a schedule's regions check theirs); and the pair, if
    it is the first past the cap."""
    from ..recording.labels import check_labels

    text = check_labels(role, stage)
    if text in _ADMITTED or len(_ADMITTED) < MAX_PAIRS:
        _ADMITTED.add(text)
        try:
            _SERIES[role, stage] = text
        except TypeError:  # an unhashable label: looked up by its text each time
            pass
        return text, None
    first_over = not _capped and text != OTHER_KEY
    _capped.add(True)
    return OTHER_KEY, text if first_over else None


_IDLE: dict[tuple[Any, Any], list[Any]] = {}  # (role, stage) -> [sum_s, max_s, n_0, ..., n_k], idle before it


def record_idle(role: Any, stage: Any, seconds: float) -> None:
    """A step's thread sat ``seconds`` idle before (role, stage) began (timeline/idle.py, with
    spans and metrics on; the span log's thread only, so the lock costs training nothing)."""
    bounds = BOUNDS
    if not bounds:
        return
    with _STORES_LOCK:
        key = _SERIES.get((role, stage), OTHER_KEY) if (role, stage) != ("step", "end") else ("step", "end")
        into = _IDLE.get(key)
        if into is None:
            into = _IDLE[key] = [0.0, 0.0] + [0] * (len(bounds) + 1)
        into[0] += seconds
        into[1] = max(into[1], seconds)
        into[bisect_left(bounds, seconds) + 2] += 1


def idle_snapshot() -> dict[tuple[Any, Any], CellStats]:
    """Idle time before each (role, stage), and before the step's end (``("step", "end")``)."""
    with _STORES_LOCK:
        return {k: CellStats(counts=tuple(v[2:]), sum_s=v[0], max_s=v[1]) for k, v in _IDLE.items()}


def _fold_forever() -> None:
    while True:
        time.sleep(FOLD_EVERY_S)
        try:
            drain()
        except Exception:  # never let the folding thread die of one bad pass  # pragma: no cover
            pass


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) serves nothing, logs no spans and starts with none of
    # the parent's times; its own are still folded, so its lists stay short. The locks may have
    # been held by a thread that does not exist here.
    global _STORES_LOCK, _DRAIN_LOCK
    _STORES_LOCK = threading.Lock()
    _DRAIN_LOCK = threading.Lock()
    _FOLDED.clear()
    WATCHED.reset()  # the parent's slow-step watch is not this process's
    _IDLE.clear()
    _UNWRITTEN.clear()
    _SPANS_ON.clear()
    me = threading.current_thread()
    kept = [(thread, spans) for thread, spans in _SPAN_LISTS if thread is me]
    for _, spans in kept:
        spans.clear()
    _SPAN_LISTS[:] = kept
    _folding.clear()
    if BOUNDS:
        _folding.append(threading.Thread(target=_fold_forever, name="torchstep_prof metrics", daemon=True))
        _folding[0].start()


at_fork_in_child(_after_fork_in_child)


@attrs.frozen(kw_only=True)
class CellStats:
    """One (role, stage)'s durations over every thread: ``counts[i]`` in bucket ``i`` (not
    cumulative; the last is above every bound), their sum and the longest."""

    counts: tuple[int, ...]
    sum_s: float
    max_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


def snapshot() -> dict[tuple[Any, Any], CellStats]:
    """Every (role, stage)'s stats so far, over every thread (``(None, None)``: step blocks)."""
    drain()
    with _DRAIN_LOCK:
        return {k: CellStats(counts=tuple(v[2:]), sum_s=v[0], max_s=v[1]) for k, v in _FOLDED.items()}


def quantile(q: float, stats: CellStats, bounds: Optional[list[float]] = None) -> float:
    """The ``q`` quantile (0..1) estimated from the buckets as PromQL's ``histogram_quantile``
    does (linear inside a bucket), but never above the longest duration seen.

    >>> round(quantile(0.5, CellStats(counts=(0, 4, 0), sum_s=0.6, max_s=0.2), [0.1, 0.2]), 6)
    0.15
    """
    bounds = BOUNDS if bounds is None else bounds
    total = stats.count
    if total == 0:
        return 0.0
    rank = q * total
    seen = 0
    for i, n in enumerate(stats.counts):
        if n and seen + n >= rank:
            lower = bounds[i - 1] if i > 0 else 0.0
            upper = bounds[i] if i < len(bounds) else stats.max_s
            return min(lower + (upper - lower) * (rank - seen) / n, stats.max_s)
        seen += n
    return stats.max_s


SUMMARY_PAIRS = 20
"""The exit summary shows the (role, stage) pairs that took the most time, at most this many."""


def summary_lines() -> Iterator[str]:
    """The exit summary's lines: one per (role, stage), the :data:`SUMMARY_PAIRS` that took the
    most time, then the steps, with count, p50, p90, max."""
    stats = snapshot()

    def line(label: str, s: CellStats) -> str:
        ms = [f"{v * 1000:.3g}" for v in (quantile(0.5, s), quantile(0.9, s), s.max_s)]
        return f"metrics {label}: {s.count} times, p50 {ms[0]} ms, p90 {ms[1]} ms, max {ms[2]} ms"

    pairs = [(k, v) for k, v in stats.items() if k[0] is not None]
    shown = sorted(pairs, key=lambda kv: -kv[1].sum_s)[:SUMMARY_PAIRS]
    for (role, stage), s in sorted(shown, key=lambda kv: kv[0]):
        yield line(f"{role}/{stage}", s)
    if len(pairs) > len(shown):
        yield f"metrics: {len(pairs) - len(shown)} more (role, stage) pairs, each shorter in total (see /metrics)"
    steps = stats.get((STEP_KEY, STEP_KEY))
    if steps is not None:
        yield line("step", steps)
