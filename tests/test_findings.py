"""Findings: each straggler compared with its group's median rank, operator by operator.

Groups are built by ``summarize`` from scanned-trace records, as the command line builds them;
``summarize --json``'s ``findings`` over real traces is in ``test_report.py``.
"""

from __future__ import annotations

import json


from torchstep_prof.traces.analysis.findings import FINDING_OPS, describe_finding, find_findings, findings_to_dicts
from torchstep_prof.traces.analysis.summarize import summarize
from torchstep_prof.traces.reading.files import OpTime, TraceInfo


def trace(rank: int, wall_ms: float, ops: dict[str, float], *, step: int = 3, role: str = "actor") -> TraceInfo:
    return TraceInfo(
        path=f"/t/{role}_update_step{step}_rank{rank}-of-4_pid1_20260101000000000.json",
        role=role,
        stage="update",
        step=step,
        rank=rank,
        world_size=4,
        wall_ms=wall_ms,
        base_time_ns=None,
        size_bytes=1,
        top_ops=tuple(OpTime(name=n, self_ms=ms) for n, ms in sorted(ops.items(), key=lambda i: -i[1])),
    )


def group_of_four(slow_ops: dict[str, float], slow_ms: float = 52.0) -> list[TraceInfo]:
    base = {"aten::mm": 8.0, "aten::add": 2.0, "aten::copy_": 1.0}
    return [
        trace(0, 36.0, base),
        trace(1, 37.0, dict(base, **{"aten::add": 2.5})),
        trace(2, slow_ms, slow_ops),
        trace(3, 38.0, base),
    ]


def test_a_straggler_slow_in_one_operator_is_named_with_it():
    infos = group_of_four({"aten::mm": 20.0, "aten::add": 2.0, "aten::copy_": 1.2})
    (finding,) = find_findings(summarize(infos, top=50))
    assert (finding.role, finding.stage, finding.step, finding.occurrence, finding.rank) == ("actor", "update", 3, 1, 2)
    assert finding.median_ms == 37.5 and finding.wall_ms == 52.0
    assert finding.median_rank in (1, 3)  # 37 and 38 are equally near 37.5: the lower rank wins
    assert finding.median_rank == 1
    names = [op.name for op in finding.ops]
    assert names[0] == "aten::mm" and finding.ops[0].delta_ms == 12.0
    assert describe_finding(finding) == (
        "rank 2's actor/update step 3 is 1.4x slower than the median (52 ms vs 38 ms), "
        "mostly in aten::mm (+12 ms)"
    )


def test_an_operator_only_one_rank_ran_counts_zero_on_the_other():
    infos = group_of_four({"aten::mm": 8.0, "aten::add": 2.0, "nccl:all_reduce": 15.0})
    (finding,) = find_findings(summarize(infos, top=50))
    first = finding.ops[0]
    assert (first.name, first.self_ms, first.median_self_ms, first.delta_ms) == ("nccl:all_reduce", 15.0, 0.0, 15.0)
    missing = next(op for op in finding.ops if op.name == "aten::copy_")
    assert missing.self_ms == 0.0 and missing.delta_ms == -1.0


def test_time_outside_operators_is_said_so():
    infos = group_of_four({"aten::mm": 8.1, "aten::add": 2.0, "aten::copy_": 1.0})
    (finding,) = find_findings(summarize(infos, top=50))
    text = describe_finding(finding)
    assert "mostly in" not in text
    assert text.endswith("; no operator accounts for it: the extra time is outside operators (Python, waiting, I/O)")


def test_no_straggler_no_finding():
    infos = [trace(r, 40.0 + r, {"aten::mm": 8.0}) for r in range(4)]
    assert find_findings(summarize(infos, top=50)) == ()
    # Twice the median but under 5 ms over it: noise on a short region, not a finding.
    short = [trace(0, 2.0, {}), trace(1, 2.1, {}), trace(2, 4.5, {})]
    assert find_findings(summarize(short, top=50)) == ()


def test_the_straggler_ratio_of_summarize_decides():
    infos = group_of_four({"aten::mm": 20.0}, slow_ms=45.0)  # 1.2x the median
    assert find_findings(summarize(infos, top=50)) == ()
    assert len(find_findings(summarize(infos, top=50, straggler_ratio=1.1))) == 1


def test_json_shape_and_order_most_slowed_first():
    infos = group_of_four({"aten::mm": 20.0}) + [
        trace(0, 10.0, {}, step=4),
        trace(1, 10.0, {}, step=4),
        trace(2, 100.0, {"aten::mm": 90.0}, step=4),
    ]
    doc = findings_to_dicts(find_findings(summarize(infos, top=50)))
    json.dumps(doc, allow_nan=False)
    assert [(f["step"], f["rank"]) for f in doc] == [(4, 2), (3, 2)]
    assert doc[0] == {
        "role": "actor", "stage": "update", "step": 4, "occurrence": 1, "rank": 2,
        "wall_ms": 100.0, "median_ms": 10.0, "ratio": 10.0,
        "ops": [{"name": "aten::mm", "self_ms": 90.0, "median_self_ms": 0.0, "delta_ms": 90.0}],
    }  # fmt: skip


def test_a_zero_median_gives_no_ratio():
    infos = [trace(0, 0.0, {}), trace(1, 0.0, {}), trace(2, 12.0, {"aten::mm": 11.0})]
    (finding,) = find_findings(summarize(infos, top=50))
    (doc,) = findings_to_dicts([finding])
    assert doc["ratio"] is None
    assert describe_finding(finding).startswith("rank 2's actor/update step 3 takes 12 ms where the median is 0 ms")


def test_ops_are_capped():
    many = {f"aten::op{i}": float(i) for i in range(10)}
    (finding,) = find_findings(summarize(group_of_four(many), top=50))
    assert len(finding.ops) == FINDING_OPS
