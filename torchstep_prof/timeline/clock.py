"""One clock for every process: each one's offset from a reference process, with an error bound.

Processes on different hosts disagree on wall time. What is known for sure is causality: a
barrier (``tsp.clock_anchor``) is left by no process before every process has entered it. So
for anchor ``k`` entered at ``e_p`` and left at ``x_q`` (each on its own clock, ``clock =
true time + offset``), every pair gives ``offset_q - offset_p <= x_q - e_p``. Processes on one
host share its clock: ``|offset_q - offset_p| <= SAME_HOST_S``. A Ray task that ran on ``q``
from ``a`` to ``b``, submitted by ``p`` at ``s`` and got back by ``p`` at ``r``
(``torchstep_prof.integrations.ray``), started after its submission and ended before ``get``
returned: ``offset_q - offset_p <= a - s`` and ``offset_p - offset_q <= r - b``. These are difference
constraints; their shortest paths (Floyd–Warshall, over the processes) give, for each process,
the interval its offset from the reference must lie in. The estimate is the interval's middle,
the bound its half-width: the true offset is within the bound, not merely likely to be.

A process no anchor or host links to the reference gets offset 0 and an infinite bound: its
order against the others is never stated (the ledger says "within clock error"). Anchors that
contradict each other (a clock stepped, or one name reused by two barriers) leave the processes
they involve aligned by their host alone: those on the reference's host stay within
``SAME_HOST_S`` of it, the others are not aligned.

>>> from torchstep_prof.timeline.reading import Anchor
>>> clocks = estimate_offsets(
...     {"a": "n1", "b": "n2"},
...     {"a": [Anchor("barrier", 1, 10.0, 10.5)], "b": [Anchor("barrier", 1, 12.2, 12.4)]},
... )
>>> round(clocks.offset("b"), 2), round(clocks.bound("b"), 2)
(2.05, 0.35)
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, NamedTuple, Optional, Sequence

import attrs

from .reading import Anchor, RayCall

__all__ = ["SAME_HOST_S", "ClockEstimate", "Contradiction", "estimate_offsets"]

SAME_HOST_S = 0.001
"""How far two processes of one host may disagree: each turns its monotonic clock into wall
time with its own reading of both, taken when its span log starts (microseconds apart)."""
CONVERSION_S = 0.0001
"""Added to every anchor's constraint: the same conversion, on each side of it."""
MAX_ANCHORS_PER_NAME = 512
"""Anchors of one name used at most (spread over the run): the bound gains little past a few dozen."""


class Contradiction(NamedTuple):
    """Anchor ``name`` #``seq`` puts ``b``'s offset from ``a`` outside what the anchor ``against``
    (name, seq) and those before it allow, by ``seconds``; ``against`` is None (and ``name``
    empty) when no pair of processes shows it directly (it runs through a third process), or
    when it contradicts the two's host (``same_host``)."""

    name: str
    seq: int
    against: Optional[tuple[str, int]]
    a: Hashable
    b: Hashable
    seconds: float
    same_host: bool = False  # against their host: one clock, within SAME_HOST_S


@attrs.frozen(kw_only=True)
class ClockEstimate:
    """Each process's offset from ``reference`` (its clock minus the reference's) and its bound.

    ``contradictions`` names the anchors that contradict each other (a clock stepped or
    drifting, or anchors of one name that are not one barrier): no offset fits the processes
    they involve, so theirs comes from their host alone (unknown off the reference's host, as
    for a process no anchor links).
    """

    reference: Hashable
    offsets: Mapping[Hashable, float]
    bounds: Mapping[Hashable, float]
    contradictions: tuple[Contradiction, ...] = ()

    def offset(self, process: Hashable) -> float:
        return self.offsets.get(process, 0.0)

    def bound(self, process: Hashable) -> float:
        return self.bounds.get(process, math.inf)

    def pair_bound(self, a: Hashable, b: Hashable) -> float:
        """How wrong the order of an instant on ``a`` and one on ``b`` may be, in seconds."""
        return 0.0 if a == b else self.bound(a) + self.bound(b)


def estimate_offsets(
    hosts: Mapping[Hashable, str],
    anchors: Mapping[Hashable, Sequence[Anchor]],
    ray: Optional[Mapping[Hashable, Sequence[RayCall]]] = None,
) -> ClockEstimate:
    """Offsets of every process of ``hosts`` (process -> host name) from the anchors each saw
    and the sides of Ray calls each logged (``ray``)."""
    names = list(hosts)
    if not names:
        return ClockEstimate(reference=None, offsets={}, bounds={})
    index = {p: i for i, p in enumerate(names)}
    n = len(names)
    inf = math.inf
    # c[i][j]: the least upper bound found for offset_j - offset_i.
    c = [[0.0 if i == j else inf for j in range(n)] for i in range(n)]
    same_host = {(index[p], index[q]) for p in hosts for q in hosts if p != q and hosts[p] == hosts[q]}
    for i, j in same_host:
        c[i][j] = SAME_HOST_S
    seen: dict[tuple[str, int], list[tuple[int, Anchor]]] = {}
    for p, found in anchors.items():
        if p not in index:
            continue
        for anchor in found:
            seen.setdefault((anchor.name, anchor.seq), []).append((index[p], anchor))
    host_only = [row[:] for row in c]
    chosen = _spread(seen)
    for key in chosen:
        group = seen[key]
        for i, entered in group:
            for j, left in group:
                if i != j:
                    c[i][j] = min(c[i][j], left.end - entered.start + CONVERSION_S)
    if ray:
        _add_ray_calls(c, index, ray)
    d = _shortest_paths(c)
    broken = {i for i in range(n) if d[i][i] < 0}
    reference = _reference(d, n, broken)
    contradictions: tuple[Contradiction, ...] = ()
    if broken:
        # What the anchors say cannot all be true: the processes they involve keep only what
        # their hosts say (one host, one clock), never an offset no anchor set supports.
        contradictions = _contradictions(seen, chosen, broken, names, same_host)
        d = _shortest_paths(
            [[host_only[i][j] if i in broken or j in broken else c[i][j] for j in range(n)] for i in range(n)]
        )
        if any(d[i][i] < 0 for i in range(n)):  # the hosts contradict the rest: hosts alone
            d = _shortest_paths(host_only)
    offsets: dict[Hashable, float] = {}
    bounds: dict[Hashable, float] = {}
    for p, i in index.items():
        hi, lo = d[reference][i], -d[i][reference]
        if math.isinf(hi) or math.isinf(lo):  # unknown
            offsets[p], bounds[p] = 0.0, inf
            continue
        offsets[p] = (hi + lo) / 2
        bounds[p] = abs(hi - lo) / 2
    return ClockEstimate(
        reference=names[reference],
        offsets=offsets,
        bounds=bounds,
        contradictions=contradictions,
    )


def _contradictions(
    seen: Mapping[tuple[str, int], list[tuple[int, Anchor]]],
    chosen: Sequence[tuple[str, int]],
    broken: set[int],
    names: Sequence[Hashable],
    same_host: set[tuple[int, int]],
) -> tuple[Contradiction, ...]:
    """For each pair of processes, the first anchor whose bounds on their offset leave no
    room next to the earlier anchors' (of any name): the pair's clock stepped there, or the
    two are not one barrier. One per pair; a contradiction only through a third process is
    named without ``against``."""
    window: dict[tuple[int, int], tuple[float, float, Optional[tuple[str, int]]]] = {}  # lo, hi, latest anchor
    found: dict[tuple[int, int], Contradiction] = {}
    for key in sorted(chosen, key=lambda k: min(a.start for _, a in seen[k])):
        group = seen[key]
        for i, ei in group:
            for j, ej in group:
                if i >= j or (i, j) in found or not {i, j} & broken:
                    continue
                # offset_j - offset_i lies in [ej.start - ei.end, ej.end - ei.start] (plus the conversion)
                lo, hi = ej.start - ei.end - CONVERSION_S, ej.end - ei.start + CONVERSION_S
                known = window.get((i, j))
                if known is None and (i, j) in same_host:
                    known = (-SAME_HOST_S, SAME_HOST_S, None)
                if known is not None and (lo > known[1] or hi < known[0]):
                    by = lo - known[1] if lo > known[1] else known[0] - hi
                    against = known[2]
                    found[(i, j)] = Contradiction(key[0], key[1], against, names[i], names[j], by, against is None)
                    continue
                window[(i, j)] = (lo, hi, key) if known is None else (max(lo, known[0]), min(hi, known[1]), key)
    if not found:  # only through a third process (or a Ray call): name the processes, not an anchor
        members = sorted(broken)
        return (Contradiction("", 0, None, names[members[0]], names[members[-1]], math.nan),)
    return tuple(found.values())


def _add_ray_calls(
    c: list[list[float]], index: Mapping[Hashable, int], ray: Mapping[Hashable, Sequence[RayCall]]
) -> None:
    """Each Ray task's run against its submission and its return (a process's own calls give
    nothing: one clock)."""
    ran: dict[str, list[tuple[int, float, float]]] = {}
    sides: dict[str, list[tuple[int, RayCall]]] = {}
    for p, found in ray.items():
        i = index.get(p)
        if i is None:
            continue
        for call in found:
            if call.what == "ran":
                ran.setdefault(call.task, []).append((i, call.start, call.end))
            else:
                sides.setdefault(call.task, []).append((i, call))
    for task, runs in ran.items():
        for q, start, end in runs:
            for p, call in sides.get(task, ()):
                if p == q:
                    continue
                if call.what == "submitted":  # offset_q - offset_p <= start - submitted
                    c[p][q] = min(c[p][q], start - call.start + CONVERSION_S)
                else:  # returned: offset_p - offset_q <= returned - end
                    c[q][p] = min(c[q][p], call.end - end + CONVERSION_S)


def _spread(seen: Mapping[tuple[str, int], list]) -> list[tuple[str, int]]:
    """The anchor keys to use: every one, or at most MAX_ANCHORS_PER_NAME of a name, evenly spread."""
    by_name: dict[str, list[tuple[str, int]]] = {}
    for key in sorted(seen):
        by_name.setdefault(key[0], []).append(key)
    chosen = []
    for keys in by_name.values():
        if len(keys) > MAX_ANCHORS_PER_NAME:
            step = len(keys) / MAX_ANCHORS_PER_NAME
            keys = [keys[int(k * step)] for k in range(MAX_ANCHORS_PER_NAME)]
        chosen += keys
    return chosen


def _shortest_paths(c: list[list[float]]) -> list[list[float]]:
    n = len(c)
    d = [row[:] for row in c]
    for k in range(n):
        dk = d[k]
        for i in range(n):
            dik = d[i][k]
            if dik == math.inf:
                continue
            di = d[i]
            for j in range(n):
                via = dik + dk[j]
                if via < di[j]:
                    di[j] = via
    return d


def _reference(d: list[list[float]], n: int, broken: set[int]) -> int:
    """The process linked to the most others (the first such, anchors consistent if any is):
    its clock is the timeline's."""
    return max(
        range(n),
        key=lambda i: (i not in broken, sum(1 for j in range(n) if d[i][j] < math.inf and d[j][i] < math.inf), -i),
    )
