"""Region and step wall times, kept in plain per-thread lists: what the metrics export reads.

With metrics on (``tsp.metrics``, the ``metrics`` config section), every region and step block
is timed, profiled or not. Each thread appends its durations to its own list per (role, stage),
and only it ever appends there: the training thread takes no lock per region, and pays one
``list.append`` (a bucket search and three sums cost twice as much, so they are left to
readers). Readers (the Prometheus collector at scrape time, the exit summary, and a folding
thread once a second so the lists stay short when nobody scrapes) fold the lists into
process-wide histograms: they take the first ``n`` items and delete exactly those, two atomic
list operations, so a duration appended meanwhile is folded next time, never lost.

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
    "fold",
    "quantile",
    "record_step",
    "snapshot",
]

_perf = time.perf_counter
_LOCAL = threading.local()  # .cells: role -> stage -> list of seconds, this thread's
_STORES: list[tuple[threading.Thread, dict[Any, dict[Any, list[float]]]]] = []  # every thread's cells
_STORES_LOCK = threading.Lock()  # taken once per thread (its first cell), and by readers
_FOLDED: dict[tuple[Any, Any], list[Any]] = {}  # (role, stage) -> [sum_s, max_s, n_0, ..., n_k]
FOLD_EVERY_S = 1.0

STEP_KEY = None  # the (role, stage) key of step blocks' cell: (None, None), never a label

MAX_PAIRS = 256
"""Distinct (role, stage) pairs a process times each in a series of its own (about 20 series each)."""
OTHER_KEY = ("other", "other")
"""Where the times of every pair past :data:`MAX_PAIRS` go (one series, role and stage ``other``)."""
_MAX_CACHED_OTHERS = 1024  # per thread: later pairs past the cap take the slow path each time
# The series each cell's key folds into: an admitted pair's own (labels as text), or OTHER_KEY
# for a pair past the cap (absent here). Written under _STORES_LOCK, at most MAX_PAIRS + 1 keys
# plus the non-text spellings of admitted pairs.
_SERIES: dict[tuple[Any, Any], tuple[Any, Any]] = {(STEP_KEY, STEP_KEY): (STEP_KEY, STEP_KEY)}
_ADMITTED: set[tuple[str, str]] = set()  # the pairs with a series of their own

BOUNDS: list[float] = []
"""The buckets' upper bounds in seconds, set once per process (:func:`set_bounds`)."""


_folding: list[threading.Thread] = []  # the folding thread, once started


def set_bounds(bounds: tuple[float, ...]) -> bool:
    """Use ``bounds`` from now on and start the folding thread; False (kept as they are) once
    set to other ones."""
    with _STORES_LOCK:
        if BOUNDS:
            return list(bounds) == BOUNDS
        BOUNDS[:] = [float(b) for b in bounds]
        _choose_exit()  # spans on already: regions now also time the metrics
        if not _folding:
            _folding.append(threading.Thread(target=_fold_forever, name="torchstep_prof metrics", daemon=True))
            _folding[0].start()
    return True


def forget() -> None:
    """Drop every time recorded and the buckets (tests that start metrics afresh in-process)."""
    with _STORES_LOCK:
        BOUNDS.clear()
        _choose_exit()
        _FOLDED.clear()
        _IDLE.clear()
        _ADMITTED.clear()
        _SERIES.clear()
        _SERIES[STEP_KEY, STEP_KEY] = (STEP_KEY, STEP_KEY)
        _capped.clear()
        for _, cells in _STORES:
            # Each thread makes its lists again on next use, so its pairs are admitted afresh.
            cells.clear()


def _cell(role: Any, stage: Any) -> list[float]:
    """This thread's list of (role, stage), made on first use (once per thread and label; a
    pair past the cap, or a label that is no dict key, finds the thread's ``other`` list)."""
    try:
        cells = _LOCAL.cells
    except AttributeError:
        cells = _LOCAL.cells = {}
        _LOCAL.others_cached = 0
        with _STORES_LOCK:
            _STORES.append((threading.current_thread(), cells))
    try:
        return cells[role][stage]  # made already (the other list, asked for by a pair past the cap)
    except KeyError:
        pass
    except TypeError:  # an unhashable label: timed under its text
        return _cell(*_series_of(role, stage))
    try:
        series = _SERIES.get((role, stage)) or _series_of(role, stage)
    except TypeError:
        return _cell(*_series_of(role, stage))
    if series == OTHER_KEY and (role, stage) != OTHER_KEY:
        cell = _cell(*OTHER_KEY)
        if _LOCAL.others_cached >= _MAX_CACHED_OTHERS:
            return cell  # not kept under this pair: the thread's dict stays bounded
        _LOCAL.others_cached += 1
    else:
        cell = []
    return cells.setdefault(role, {}).setdefault(stage, cell)


def _series_of(role: Any, stage: Any) -> tuple[Any, Any]:
    """The series the pair is timed under, admitting it while there is room (first sight of a
    pair in the process: its labels are checked here, as a schedule's regions check theirs)."""
    from ..recording.labels import check_labels

    text = check_labels(role, stage)
    first_over = False
    with _STORES_LOCK:
        if text in _ADMITTED or len(_ADMITTED) < MAX_PAIRS:
            _ADMITTED.add(text)
            series: tuple[Any, Any] = text
            try:
                _SERIES[role, stage] = series
            except TypeError:  # an unhashable label: its cells are kept under its text
                pass
        else:  # past the cap: not remembered, so this dict stays bounded (OTHER_KEY by default)
            series = OTHER_KEY
            first_over = not _capped and text != OTHER_KEY
            _capped.add(True)
    if first_over:
        from ..errors import MetricsWarning, warn

        warn(
            f"torchstep_prof: more than {MAX_PAIRS} distinct (role, stage) pairs are timed; "
            f"{text[0]!r}/{text[1]!r} and every later new pair are counted as role 'other', stage 'other' "
            "(labels should name code, not data such as step numbers or sample ids)",
            MetricsWarning,
        )
    return series


_capped: set[bool] = set()  # not empty once a pair went past the cap (warned once)


class TimedRegion(tuple):  # type: ignore[type-arg]
    """A region timed for the metrics and not profiled: ``TimedRegion((role, stage, t0))``,
    timed from ``t0`` (``perf_counter`` as it is made, in ``with profile_region(...)`` as it is
    entered) to its exit.

    A tuple made by ``tuple``'s own C constructor: no Python frame on creation, as no
    ``__init__`` runs (the spans-on region's cost is mostly frames; docs/hot-path.md).
    """

    __slots__ = ()
    # A C callable, as _IdleRegion's __exit__ (regions.py): no Python frame on entry. ``as``
    # gets "" (a not-profiled region has nothing to offer there); ``str()`` is a little cheaper
    # than ``"".format()``.
    __enter__ = staticmethod(str)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        seconds = _perf() - self[2]
        try:
            _LOCAL.cells[self[0]][self[1]].append(seconds)
        except (AttributeError, KeyError, TypeError):  # first use here; TypeError: unhashable label
            _cell(self[0], self[1]).append(seconds)


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
        # TimedRegion's exit (whichever is in force: metrics, spans or both), one copy of the rule.
        TimedRegion((self.role, self.stage, self.t0)).__exit__(exc_type, exc, tb)
        return self.inner.__exit__(exc_type, exc, tb)


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
    """A step block lasted ``seconds`` (its end calls this, in whichever thread ends it); with
    spans on, its ``number`` and ``start`` (``perf_counter``) go to the span log too."""
    if _SPANS_ON:
        if start is None:
            start = _perf() - seconds
        _spans_here().extend((None, number, start, start + seconds))
        if not BOUNDS:  # spans alone: nobody folds the metrics' lists
            return
    try:
        _LOCAL.cells[STEP_KEY][STEP_KEY].append(seconds)
    except (AttributeError, KeyError):
        _cell(STEP_KEY, STEP_KEY).append(seconds)
    watched = WATCHED.steps
    if watched is not None and number is not None:
        watched.append((number, seconds))  # a deque's append: atomic, no lock


# --- the span log's hand-off (timeline/span_log.py) ----------------------------------------
# With spans on, a timed region's exit appends (role, stage, start, end) to its thread's span
# list instead of (or, metrics on too, as well as) its duration: one append, as metrics cost.
# Step blocks append (None, number, start, end); clock anchors (ANCHOR, "name\\0seq", start, end);
# Ray calls and tasks (RAY, "what\\0task id", start, end).
# The span log's thread takes them as the folding thread takes durations: the first n, then
# exactly those deleted. The exit is swapped on the class once (decide once): a process without
# spans runs the exit above, untouched.

ANCHOR = "\x00anchor"  # the first item of an anchor's tuple: never a label (labels are checked text)
_SPANS_ON: list[bool] = []  # not empty while spans are on in this process
_SPAN_LISTS: list[tuple[threading.Thread, list[Any]]] = []  # each thread's (role, stage, start, end, ...)
_TIMED_EXIT = TimedRegion.__exit__


def _spans_here() -> list[Any]:
    try:
        return _LOCAL.spans  # type: ignore[no-any-return]
    except AttributeError:
        spans: list[Any] = []
        with _STORES_LOCK:
            _SPAN_LISTS.append((threading.current_thread(), spans))
        _LOCAL.spans = spans
        return spans


def _span_exit(self: TimedRegion, exc_type: Any, exc: Any, tb: Any) -> None:
    # One flat list, four items a span: a tuple kept per span would be a container the garbage
    # collector tracks (a million of them between two writes make every collection slow).
    try:
        _LOCAL.spans.extend(self + (_perf(),))
    except AttributeError:  # this thread's first span
        _spans_here().extend(self + (_perf(),))


def _span_and_metrics_exit(self: TimedRegion, exc_type: Any, exc: Any, tb: Any) -> None:
    # Both exits' work inline, one clock reading: two calls would cost a third more.
    end = _perf()
    try:
        _LOCAL.spans.extend(self + (end,))
    except AttributeError:
        _spans_here().extend(self + (end,))
    try:
        _LOCAL.cells[self[0]][self[1]].append(end - self[2])
    except (AttributeError, KeyError, TypeError):
        _cell(self[0], self[1]).append(end - self[2])


def _choose_exit() -> None:
    # ignore: the class's exit replaced on purpose, once per change (see above).
    TimedRegion.__exit__ = (  # type: ignore[method-assign]
        _TIMED_EXIT if not _SPANS_ON else _span_and_metrics_exit if BOUNDS else _span_exit
    )


def spans_on(on: bool = True) -> None:
    """Record spans from now on (``on``), or stop (the span log starts and stops them)."""
    with _STORES_LOCK:
        _SPANS_ON[:] = [True] if on else []
        _choose_exit()


def record_anchor(name: str, seq: int, start: float, end: float) -> None:
    """A clock anchor (``tsp.clock_anchor``) was entered at ``start`` and left at ``end``."""
    if _SPANS_ON:
        _spans_here().extend((ANCHOR, f"{name}\x00{seq}", start, end))


RAY = "\x00ray"  # the first item of a Ray call's or task's tuple (integrations/ray.py)


def record_ray(what: str, task: str, start: float, end: float) -> None:
    """A Ray task ``task`` was submitted or got (``what``: ``submitted``, ``returned``; an
    instant, ``start == end``) here, or ran here from ``start`` to ``end`` (``ran``)."""
    if _SPANS_ON:
        _spans_here().extend((RAY, f"{what}\x00{task}", start, end))


def take_spans() -> list[tuple[threading.Thread, list[Any]]]:
    """Every thread's spans recorded since the last call (the span log's thread only), each
    thread's as one flat list: role, stage, start, end, role, stage, ..."""
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
    return taken


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


def _fold() -> None:
    """Move every thread's durations into the histograms (readers only, under the lock)."""
    bounds = BOUNDS
    width = len(bounds) + 1
    watched_key = WATCHED.key
    with _STORES_LOCK:
        alive = []
        for thread, cells in _STORES:
            pending = False
            for role, stages in cells.copy().items():  # dict.copy is atomic: the owner may add keys
                for stage, cell in stages.copy().items():
                    n = len(cell)
                    if not n:
                        continue
                    taken = cell[:n]
                    del cell[:n]  # exactly those: one appended meanwhile stays for next time
                    key = _SERIES.get((role, stage), OTHER_KEY)  # the pair's series, or other
                    if key == watched_key:
                        WATCHED.region.extend(taken)
                    elif role is STEP_KEY:
                        WATCHED.last_step_at = time.time()
                    into = _FOLDED.get(key)
                    if into is None:
                        into = _FOLDED[key] = [0.0, 0.0] + [0] * width
                    into[0] += sum(taken)
                    into[1] = max(into[1], max(taken))
                    for seconds in taken:
                        into[bisect_left(bounds, seconds) + 2] += 1
                    pending = pending or bool(cell)
            if thread.is_alive() or pending:
                alive.append((thread, cells))
        _STORES[:] = alive  # a finished thread's lists, once folded, are dropped


def fold() -> None:
    """Fold every thread's durations now (the slow-step watch, for a watched region's times)."""
    _fold()


def _fold_forever() -> None:
    while True:
        time.sleep(FOLD_EVERY_S)
        try:
            _fold()
        except Exception:  # never let the folding thread die of one bad pass  # pragma: no cover
            pass


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) serves nothing and starts with none of the parent's
    # times; its own are still folded, so its lists stay short. The lock may have been held by
    # a thread that does not exist here.
    global _STORES_LOCK
    _STORES_LOCK = threading.Lock()
    _FOLDED.clear()
    WATCHED.reset()  # the parent's slow-step watch is not this process's
    _IDLE.clear()
    me = threading.current_thread()
    kept = [(thread, cells) for thread, cells in _STORES if thread is me]
    for _, cells in kept:
        for stages in cells.values():
            for cell in stages.values():
                cell.clear()
    _STORES[:] = kept
    _SPAN_LISTS.clear()  # a forked child (a DataLoader worker) records no spans
    _LOCAL.__dict__.pop("spans", None)
    _SPANS_ON.clear()
    _choose_exit()
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
    _fold()
    with _STORES_LOCK:
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
