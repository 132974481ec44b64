"""The collective-wait rules on plain records (the real 2-rank jobs are in test_diagnosis.py):
matching by kind, name and ordinal; the late rank weighed by the waiting it causes; ties;
collectives some rank lacks; the kinds' order; memory per device."""

from __future__ import annotations

from torchstep_prof.traces.reading.collective_calls import CollectiveCall, read_collectives
from torchstep_prof.traces.analysis.collectives import describe_waits, find_waits
from torchstep_prof.traces.reading.events import OpTime
from torchstep_prof.traces.reading.memory_events import read_memory
from torchstep_prof.traces.analysis.summarize import GroupSummary, Summary
from torchstep_prof.traces.reading.files import TraceInfo


def _group(calls: dict[int, list[tuple[str, str, float]]], ops: dict[int, dict[str, float]] | None = None) -> Summary:
    ranks = tuple(
        TraceInfo(
            path=f"r{rank}.json",
            role="trainer",
            stage="forward",
            step=1,
            rank=rank,
            world_size=len(calls),
            wall_ms=100.0,
            base_time_ns=None,
            size_bytes=0,
            collectives=tuple(CollectiveCall(kind=k, name=n, dur_ms=d) for k, n, d in rows),
            top_ops=tuple(OpTime(name=n, self_ms=ms) for n, ms in (ops or {}).get(rank, {}).items()),
        )
        for rank, rows in calls.items()
    )
    group = GroupSummary(role="trainer", stage="forward", step=1, ranks=ranks, median_ms=100.0,
                         min_ms=100.0, max_ms=100.0, slowest=0, straggler=None)  # fmt: skip
    return Summary(groups=(group,))


def test_three_ranks_the_late_one_named_with_its_extra_operators() -> None:
    ar = ("gloo", "gloo:all_reduce")
    calls = {0: [(*ar, 40.0), (*ar, 41.0)], 1: [(*ar, 30.0), (*ar, 31.0)], 2: [(*ar, 0.5), (*ar, 1.0)]}
    ops = {0: {"aten::mm": 5.0}, 1: {"aten::mm": 5.0}, 2: {"aten::mm": 45.0, "aten::add": 5.1}}
    (w,) = find_waits(_group(calls, ops))
    assert w.kind == "gloo" and w.matched == 2 and w.late_rank == 2
    waits = {r.rank: r.wait_ms for r in w.ranks}
    assert waits == {0: 79.5, 1: 59.5, 2: 0.0}
    assert [r.last for r in w.ranks] == [0, 0, 2]
    # aten::mm: 40 ms over the others' mean; aten::add (+5.1 ms) is under 10% of their mean wait
    # (69.5 ms): noise, left out.
    assert [(d.name, round(d.delta_ms, 3)) for d in w.ops] == [("aten::mm", 40.0)]


def test_the_words_name_the_late_rank_and_count_one_collective_in_the_singular() -> None:
    ar = ("gloo", "gloo:all_reduce")
    (w,) = find_waits(_group({0: [(*ar, 40.0)], 1: [(*ar, 0.5)]}, {0: {"aten::mm": 5.0}, 1: {"aten::mm": 45.0}}))
    text = describe_waits(w)
    assert "rank 1 arrived last at 1 of 1 gloo collective (100%)" in text
    assert "its " not in text and "rank 1's extra time: aten::mm (+40 ms)" in text
    (quiet,) = find_waits(_group({0: [(*ar, 40.0)], 1: [(*ar, 0.5)]}))
    assert describe_waits(quiet).endswith("no operator accounts for rank 1's lateness (Python, sleeping, I/O, data loading)")


def test_ties_name_nobody_and_a_barrier_does_not_outvote_a_late_all_reduce() -> None:
    even = {0: [("gloo", "gloo:all_reduce", 10.0)], 1: [("gloo", "gloo:all_reduce", 10.02)]}
    (w,) = find_waits(_group(even))
    assert w.late_rank is None and [r.last for r in w.ranks] == [0, 0]
    calls = {
        0: [("gloo", "gloo:barrier", 0.1), ("gloo", "gloo:all_reduce", 30.0)],
        1: [("gloo", "gloo:barrier", 0.3), ("gloo", "gloo:all_reduce", 0.1)],
    }
    (w,) = find_waits(_group(calls))
    # Each rank arrived last once, but rank 1 caused 29.9 ms of the 30.1 ms of waiting.
    assert [r.last for r in w.ranks] == [1, 1] and w.late_rank == 1


def test_unmatched_collectives_are_named_and_nccl_comes_first() -> None:
    calls = {
        0: [("gloo", "gloo:all_reduce", 5.0), ("nccl", "ncclKernel_AllGather", 9.0), ("gloo", "gloo:all_reduce", 5.0)],
        1: [("gloo", "gloo:all_reduce", 5.0), ("nccl", "ncclKernel_AllGather", 1.0)],
    }
    (w,) = find_waits(_group(calls))
    assert w.kind == "nccl" and w.matched == 1
    assert [(u.kind, u.name, u.ordinal, u.ranks) for u in w.unmatched] == [("gloo", "gloo:all_reduce", 2, (0,))]
    assert {r.rank: r.wait_ms for r in w.ranks} == {0: 8.0, 1: 0.0}


def test_reading_kinds_and_record_param_comms_names() -> None:
    events = [
        {"ph": "X", "name": "record_param_comms", "cat": "cpu_op", "ts": 3, "dur": 1000,
         "args": {"Collective name": "allreduce"}},
        {"ph": "X", "name": "c10d::allreduce_", "cat": "cpu_op", "ts": 1, "dur": 2000},
        {"ph": "X", "name": "gloo:all_reduce", "cat": "cpu_op", "ts": 2, "dur": 1},  # not an annotation
        {"ph": "X", "name": "ncclDevKernel_AllReduce", "cat": "kernel", "ts": 4, "dur": True},  # no time
    ]  # fmt: skip
    assert read_collectives(events) == (
        CollectiveCall(kind="c10d", name="c10d::allreduce_", dur_ms=2.0),
        CollectiveCall(kind="comms", name="record_param_comms:allreduce", dur_ms=1.0),
    )


def test_memory_per_device_charged_to_the_outermost_operator() -> None:
    def mem(ts: float, size: int, device: int = 0) -> dict:
        return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
                "args": {"Bytes": size, "Device Type": device, "Device Id": 0 if device else -1}}  # fmt: skip

    events = [
        {"ph": "X", "name": "aten::ones", "cat": "cpu_op", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "name": "aten::empty", "cat": "cpu_op", "ts": 1, "dur": 2, "pid": 1, "tid": 1},
        mem(2, 100), mem(5, 50), mem(20, -50), mem(21, 700, device=1), mem(22, -700, device=1),
    ]
    cpu, cuda = read_memory(events)
    assert (cpu.device, cpu.peak_bytes, cpu.net_bytes) == ("cpu", 150, 100)
    assert [(o.name, o.bytes, o.count) for o in cpu.top_ops] == [("aten::ones", 150, 2)]
    assert (cuda.device, cuda.peak_bytes, cuda.net_bytes) == ("cuda:0", 700, 0)
    assert [o.name for o in cuda.top_ops] == ["(outside operators)"]
    assert read_memory(events[:2]) == ()
