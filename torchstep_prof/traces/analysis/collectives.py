"""Collective waits across ranks: who arrives last at each collective, and how long the others wait.

In synchronous data parallelism every rank leaves a collective together, so wall times are equal
and a slow rank hides as the others' waiting inside collectives. Reading one trace keeps its
collectives in order (:mod:`~torchstep_prof.traces.reading.collective_calls`). :func:`find_waits` matches
them across the ranks of one group (summarize's groups) by kind, name and ordinal -- never by
timestamp, since hosts' clocks are not in sync -- and takes a rank's wait as its duration minus
the shortest across ranks: the rank that waited least arrived last.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

import attrs

from ..reading.collective_calls import WAIT_KINDS, CollectiveCall
from .findings import EXPLAINS_SHARE, ms_text, op_deltas, op_self_ms
from .summarize import STRAGGLER_MIN_MS, GroupSummary, Summary, group_fields

__all__ = [
    "LATE_SHARE",
    "CollectiveWaits",
    "RankWait",
    "Unmatched",
    "describe_waits",
    "find_waits",
    "waits_to_dicts",
]

LATE_SHARE = 0.5
"""A group names its late rank when the collectives it arrived last at hold more than this share
of all the group's waiting (and a rank waited
:data:`~torchstep_prof.traces.analysis.summarize.STRAGGLER_MIN_MS` or more). Weighing by wait, not by
count: a barrier every rank reaches together must not outvote the all-reduce a rank is 30 ms
late for."""

LATE_MIN_MS = 0.05
"""Durations closer than this across ranks have no last arrival: the collective is a tie."""

LATE_OPS = 5
"""Operators listed for a late rank, most extra self time first."""


@attrs.frozen(kw_only=True)
class RankWait:
    """One rank of a group: its total wait in collectives, how often it arrived last, and how
    long the others waited at those collectives (``caused_ms``)."""

    rank: int
    wait_ms: float
    last: int
    caused_ms: float = 0.0


@attrs.frozen(kw_only=True)
class Unmatched:
    """A collective (kind, name, ordinal: its n-th call of that name) that some ranks lack."""

    kind: str
    name: str
    ordinal: int
    ranks: Tuple[int, ...]


@attrs.frozen(kw_only=True)
class CollectiveWaits:
    """The collectives of one group (role, stage, step, occurrence; a fused step) across ranks.

    ``kind`` is the kind waits are taken from; ``matched`` its collectives found on every rank.
    ``late_rank`` is named when the collectives it arrived last at hold more than
    :data:`LATE_SHARE` of the group's waiting and the others waited for it; ``ops`` are then
    its operators with the most self time over the other
    ranks' mean. ``unmatched`` lists every collective (of any kind) some rank lacks.
    """

    role: str
    stage: str
    step: int
    occurrence: int
    fused: bool
    kind: str
    matched: int
    ranks: Tuple[RankWait, ...]
    late_rank: Optional[int] = None
    ops: Tuple[Any, ...] = ()
    unmatched: Tuple[Unmatched, ...] = ()

    def share(self, rank: int) -> float:
        """The share (0..1) of matched collectives ``rank`` arrived last at."""
        last = next((r.last for r in self.ranks if r.rank == rank), 0)
        return last / self.matched if self.matched else 0.0


def find_waits(summary: Summary) -> Tuple[CollectiveWaits, ...]:
    """The collective waits of every group of ``summary`` with collectives on two ranks or more.

    ``summary`` should be summarized with deep operator lists
    (:data:`~torchstep_prof.traces.analysis.findings.FINDINGS_DEPTH`) for the late rank's operators.

    >>> from torchstep_prof.traces.reading.files import scan_traces
    >>> from torchstep_prof.traces.analysis.summarize import summarize
    >>> waits = find_waits(summarize(*scan_traces("outputs/profile", top=50)))  # doctest: +SKIP
    """
    found = (_group_waits(group) for group in summary.groups)
    return tuple(w for w in found if w is not None)


def _group_waits(group: GroupSummary) -> Optional[CollectiveWaits]:
    rows: dict[int, Any] = {}
    for row in group.ranks:  # one row per rank: a second run's row is left to `runs`
        rows.setdefault(row.rank, row)
    if len(rows) < 2 or not any(row.collectives for row in rows.values()):
        return None
    keyed = {rank: _keyed(row.collectives) for rank, row in rows.items()}
    everywhere = set.intersection(*(set(calls) for calls in keyed.values()))
    unmatched = sorted(
        {key for calls in keyed.values() for key in calls} - everywhere,
        key=lambda key: (WAIT_KINDS.index(key[0]), key[1], key[2]),
    )
    kind = next((k for k in WAIT_KINDS if any(key[0] == k for key in everywhere)), WAIT_KINDS[0])
    waits = {rank: 0.0 for rank in rows}
    last = {rank: 0 for rank in rows}
    caused = {rank: 0.0 for rank in rows}  # the others' wait at the collectives a rank was last at
    matched = [key for key in everywhere if key[0] == kind]
    for key in matched:
        durations = {rank: keyed[rank][key] for rank in rows}
        shortest = min(durations.values())
        for rank, dur in durations.items():
            waits[rank] += dur - shortest
        if max(durations.values()) - shortest >= LATE_MIN_MS:
            first_out = min(sorted(durations), key=lambda r: durations[r])  # waited least
            last[first_out] += 1
            caused[first_out] += sum(durations.values()) - len(durations) * shortest
    ranks = tuple(RankWait(rank=r, wait_ms=waits[r], last=last[r], caused_ms=caused[r]) for r in sorted(rows))
    late, ops = _late_rank(ranks, rows)
    return CollectiveWaits(
        **group_fields(group),
        kind=kind,
        matched=len(matched),
        ranks=ranks,
        late_rank=late,
        ops=ops,
        unmatched=tuple(
            Unmatched(kind=k, name=n, ordinal=o, ranks=tuple(r for r in sorted(keyed) if (k, n, o) in keyed[r]))
            for k, n, o in unmatched
        ),
    )


def _keyed(calls: Sequence[CollectiveCall]) -> dict[tuple[str, str, int], float]:
    """Each call keyed by (kind, name, ordinal): the n-th call of that name on this rank."""
    seen: dict[tuple[str, str], int] = {}
    keyed = {}
    for call in calls:
        ordinal = seen[(call.kind, call.name)] = seen.get((call.kind, call.name), 0) + 1
        keyed[(call.kind, call.name, ordinal)] = call.dur_ms
    return keyed


def _late_rank(ranks: Sequence[RankWait], rows: Mapping[int, Any]) -> tuple[Optional[int], Tuple[Any, ...]]:
    # With no collective matched, nobody waited: the first test below names no one.
    late = max(ranks, key=lambda r: (r.caused_ms, r.last, -r.rank))
    others = [r for r in ranks if r.rank != late.rank]
    total = sum(r.wait_ms for r in ranks)
    if late.caused_ms <= LATE_SHARE * total or max(r.wait_ms for r in others) < STRAGGLER_MIN_MS:
        return None, ()
    theirs: dict[str, float] = {}
    for r in others:
        for op in rows[r.rank].top_ops:
            theirs[op.name] = theirs.get(op.name, 0.0) + op.self_ms / len(others)
    # As for a straggler: an operator explains the lateness when its extra self time is a real
    # share of what the others waited (the mean of their waits).
    lateness = sum(r.wait_ms for r in others) / len(others)
    # op_deltas orders them by difference, largest first: these are all over 0.
    over = [d for d in op_deltas(op_self_ms(rows[late.rank]), theirs) if d.delta_ms >= EXPLAINS_SHARE * lateness > 0]
    return late.rank, tuple(over[:LATE_OPS])


def waits_to_dicts(waits: Iterable[CollectiveWaits]) -> list[dict[str, Any]]:
    """The ``collectives`` list of ``summarize --json``::

    [{"role", "stage", "step", "occurrence", "fused", "kind", "matched",
      "ranks": [{"rank", "wait_ms", "last", "last_pct", "caused_ms"}],
      "late_rank": <rank or null>, "late_pct": <% or null>,
      "late_ops": [{"name", "self_ms", "others_self_ms", "delta_ms"}],
      "unmatched_count", "unmatched": [{"kind", "name", "ordinal", "ranks"}]}]
    """
    return [
        {
            **group_fields(w),
            "kind": w.kind,
            "matched": w.matched,
            "ranks": [
                {
                    "rank": r.rank,
                    "wait_ms": round(r.wait_ms, 3),
                    "last": r.last,
                    "last_pct": round(100 * w.share(r.rank), 1),
                    "caused_ms": round(r.caused_ms, 3),
                }
                for r in w.ranks
            ],  # fmt: skip
            "late_rank": w.late_rank,
            "late_pct": None if w.late_rank is None else round(100 * w.share(w.late_rank), 1),
            "late_ops": [
                {
                    "name": d.name,
                    "self_ms": round(d.self_ms, 3),
                    "others_self_ms": round(d.median_self_ms, 3),
                    "delta_ms": round(d.delta_ms, 3),
                }
                for d in w.ops
            ],  # fmt: skip
            "unmatched_count": len(w.unmatched),
            "unmatched": [
                {"kind": u.kind, "name": u.name, "ordinal": u.ordinal, "ranks": list(u.ranks)} for u in w.unmatched
            ],
        }
        for w in waits
    ]


def describe_waits(w: CollectiveWaits) -> str:
    """A group's waits in words, the late rank named wherever the text speaks of it.

    >>> print(describe_waits(CollectiveWaits(role="trainer", stage="forward", step=2,
    ...     occurrence=1, fused=False, kind="gloo", matched=3, late_rank=1,
    ...     ranks=(RankWait(rank=0, wait_ms=91.0, last=0), RankWait(rank=1, wait_ms=0.2, last=3)))))
    trainer/forward step 2: rank 1 arrived last at 3 of 3 gloo collectives (100%); rank 0 waited 91 ms; no operator accounts for rank 1's lateness (Python, sleeping, I/O, data loading)
    """
    where = f"{w.role}/{w.stage} step {w.step}" + (f" #{w.occurrence}" if w.occurrence > 1 else "")
    waited = ", ".join(f"rank {r.rank} waited {ms_text(r.wait_ms)}" for r in w.ranks if r.rank != w.late_rank)
    collectives = f"{w.kind} collective{'' if w.matched == 1 else 's'}"
    if w.late_rank is None:
        text = f"{where}: no rank makes the others wait ({w.matched} {collectives}; {waited})"
    else:
        late = next(r for r in w.ranks if r.rank == w.late_rank)
        text = (
            f"{where}: rank {w.late_rank} arrived last at {late.last} of {w.matched} {collectives} "
            f"({100 * w.share(w.late_rank):.0f}%); {waited}"
        )
        if w.ops:
            extra = ", ".join(f"{d.name} (+{ms_text(d.delta_ms)})" for d in w.ops[:3])
            text += f"; rank {w.late_rank}'s extra time: {extra}"
        else:
            text += f"; no operator accounts for rank {w.late_rank}'s lateness (Python, sleeping, I/O, data loading)"
    if w.unmatched:
        names = ", ".join(sorted({u.name for u in w.unmatched})[:3])
        text += f"; {len(w.unmatched)} unmatched ({names})"
    return text
