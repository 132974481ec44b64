"""Grouping traces by region and step, finding stragglers, and rendering the summary."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from trace_factory import assert_summary_shape, write_ranks, write_trace

from torchstep_prof.traces.analysis.summarize import (
    find_straggler,
    render_summary,
    summarize,
    summary_to_dict,
)
from torchstep_prof.traces.reading.files import OpTime, TraceInfo, Unreadable, scan_traces

SLOW_RANK = 2


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A 4-rank step where rank 2 sleeps inside its region, and a one-rank critic step."""
    root = tmp_path_factory.mktemp("summarize")
    write_ranks(root, world_size=4, steps=(1,), sleep_s=0.005, slow={SLOW_RANK: 0.12})
    write_trace(root, role="critic", stage="values", step=1)
    (root / "broken.json").write_text("{")
    return scan_traces(root, top=3)


def _info(rank: int, wall_ms: float, step: int = 1, top: tuple = ()) -> TraceInfo:
    return TraceInfo(
        path=f"t/actor_update_step{step}_rank{rank}.json",
        role="actor",
        stage="update",
        step=step,
        rank=rank,
        world_size=4,
        wall_ms=wall_ms,
        base_time_ns=0,
        size_bytes=1,
        top_ops=top,
    )


@pytest.mark.parametrize(
    ("walls", "expected"),
    [
        ({0: 100.0, 1: 101.0, 2: 180.0, 3: 99.0}, 2),
        ({0: 100.0, 1: 101.0, 2: 124.0, 3: 99.0}, None),  # under 1.25x the median
        ({0: 2.0, 1: 2.1, 2: 4.0, 3: 2.0}, None),  # 2x the median but under 5 ms over it
        ({0: 10.0, 1: 10.0, 2: 15.1, 3: 10.0}, 2),  # 1.51x and 5.1 ms over
        ({0: 50.0}, None),  # a rank alone is its own median
        ({}, None),
    ],
)
def test_find_straggler(walls: dict, expected: int | None) -> None:
    assert find_straggler(walls) == expected


def test_find_straggler_ratio_is_configurable() -> None:
    walls = {0: 100.0, 1: 100.0, 2: 120.0}
    assert find_straggler(walls) is None
    assert find_straggler(walls, ratio=1.1) == 2
    assert find_straggler(walls, ratio=1.1, min_over_ms=30) is None


def test_the_slow_rank_of_four_is_the_straggler(scanned: tuple) -> None:
    summary = summarize(*scanned)
    actor = next(g for g in summary.groups if g.role == "actor")
    assert [r.rank for r in actor.ranks] == [0, 1, 2, 3]
    assert actor.straggler == SLOW_RANK and actor.slowest == SLOW_RANK
    assert actor.max_ms == max(r.wall_ms for r in actor.ranks) >= 120
    assert actor.min_ms <= actor.median_ms <= actor.max_ms
    critic = next(g for g in summary.groups if g.role == "critic")
    assert critic.straggler is None and len(critic.ranks) == 1


def test_groups_are_sorted_and_keep_duplicate_ranks() -> None:
    infos = [_info(1, 10.0, step=2), _info(0, 10.0, step=2), _info(0, 11.0, step=1)]
    infos.append(_info(0, 30.0, step=2))  # a second trace of rank 0 at step 2 (two runs)
    summary = summarize(infos)
    assert [(g.step, [r.rank for r in g.ranks]) for g in summary.groups] == [
        (1, [0]),
        (2, [0, 0, 1]),
    ]
    assert summary.groups[1].straggler == 0  # the slower of rank 0's two traces counts


def test_group_top_ops_average_over_ranks() -> None:
    infos = [
        _info(0, 10.0, top=(OpTime(name="aten::mm", self_ms=4.0), OpTime(name="add", self_ms=1.0))),
        _info(1, 10.0, top=(OpTime(name="aten::mm", self_ms=2.0),)),
    ]
    group = summarize(infos, top=5).groups[0]
    assert group.top_ops == (
        OpTime(name="aten::mm", self_ms=3.0),
        OpTime(name="add", self_ms=0.5),
    )
    assert summarize(infos, top=1).groups[0].ranks[0].top_ops == (
        OpTime(name="aten::mm", self_ms=4.0),
    )


def test_json_has_the_documented_shape(scanned: tuple) -> None:
    doc = json.loads(json.dumps(summary_to_dict(summarize(*scanned))))
    assert_summary_shape(doc)
    actor = next(g for g in doc["groups"] if g["role"] == "actor")
    assert actor["straggler"] == SLOW_RANK
    assert [r["rank"] for r in actor["ranks"]] == [0, 1, 2, 3]
    assert all(r["top_ops"] and r["file"].endswith(".json") for r in actor["ranks"])
    assert [p.rsplit("/", 1)[-1] for p in doc["unreadable"]] == ["broken.json"]


def _render(summary, width: int = 100) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    render_summary(summary, console, title="traces")
    return console.file.getvalue()


def test_table_shows_each_rank_and_flags_the_straggler(scanned: tuple) -> None:
    text = _render(summarize(*scanned))
    lines = text.splitlines()
    flagged = [
        line.split() for line in lines if re.match(r"\s*\d+\s+[\d.]+\s+[\d.]+ straggler", line)
    ]
    assert [cells[0] for cells in flagged] == [str(SLOW_RANK)]  # the rank column leads the row
    assert any(line.startswith("straggler: over 1.25x") for line in lines)  # the caption
    assert any(line.startswith("actor/update") for line in lines)
    assert any(line.startswith("critic/values") for line in lines)
    assert "aten::" in text
    assert "broken.json: not valid JSON" in text
    assert "\x1b[" not in text  # no color codes when not a terminal


def test_table_fits_a_narrow_console(scanned: tuple) -> None:
    text = _render(summarize(*scanned), width=80)
    table = text.split("Skipped")[0]
    assert max(len(line) for line in table.splitlines()) <= 80


def test_nothing_to_render_but_skipped_files() -> None:
    summary = summarize([], [Unreadable(path="x.json", reason="not valid JSON")])
    assert _render(summary).splitlines() == [
        "Skipped 1 file(s) that are not usable traces:",
        "  x.json: not valid JSON",
    ]


# --- occurrences, fused groups, runs, absurd values ---------------------------------------------


def _trace(rank: int, wall_ms: float, **fields) -> TraceInfo:
    values = dict(
        path=f"t/{fields.get('role', 'actor')}_{rank}_{fields.get('pid', 1)}_"
        f"{fields.get('occurrence', 1)}_{wall_ms}.json",
        role="actor",
        stage="update",
        step=1,
        rank=rank,
        world_size=2,
        wall_ms=wall_ms,
        base_time_ns=0,
        size_bytes=1,
        start_ns=int(wall_ms * 1e6),
    )
    values.update(fields)
    return TraceInfo(**values)


def test_occurrences_are_separate_groups() -> None:
    infos = [_trace(r, 10.0 + r, occurrence=k) for r in (0, 1) for k in (1, 2)]
    groups = summarize(infos).groups
    assert [(g.occurrence, [r.rank for r in g.ranks]) for g in groups] == [(1, [0, 1]), (2, [0, 1])]
    assert [g.label for g in groups] == ["actor/update", "actor/update #2"]
    text = _render(summarize(infos), width=80)
    header = next(line for line in text.splitlines() if line.startswith("region"))
    assert header.split()[:4] == ["region", "step", "occ", "rank"]
    assert "occ" not in _render(summarize(infos[:1]), width=80)


def test_fused_traces_of_a_step_are_one_group_labelled_by_their_roles() -> None:
    infos = [
        _trace(0, 20.0, role="eval-trainer", stage="train", fused=True, roles=("eval", "trainer")),
        _trace(1, 12.0, role="trainer", stage="train", fused=True, roles=("trainer",)),
        _trace(0, 3.0, role="trainer", stage="train", step=2, fused=True, roles=("trainer",)),
    ]
    groups = summarize(infos).groups
    assert [(g.role, g.step, [r.rank for r in g.ranks]) for g in groups] == [
        ("eval-trainer", 1, [0, 1]),
        ("trainer", 2, [0]),
    ]
    doc = summary_to_dict(summarize(infos))
    assert [r["role"] for r in doc["groups"][0]["ranks"]] == ["eval-trainer", "trainer"]
    text = _render(summarize(infos), width=80)
    assert "ran eval-trainer" in text and "ran trainer" in text


def test_choose_runs_keeps_the_newest_pid_per_rank_and_role() -> None:
    from torchstep_prof.traces.analysis.runs import choose_runs, describe_other_runs

    old = [_trace(r, 10.0, pid=100) for r in (0, 1)]
    new = [_trace(r, 50.0, pid=200) for r in (0, 1)]
    other_role = [_trace(0, 5.0, pid=300, role="rollout")]  # a Ray worker sharing rank 0
    kept, other_runs = choose_runs(old + new + other_role)
    assert sorted((t.rank, t.role, t.pid) for t in kept) == [
        (0, "actor", 200), (0, "rollout", 300), (1, "actor", 200)
    ]
    assert [(o.rank, o.pid, o.other_pids, o.left_out) for o in other_runs] == [
        (0, 200, (100,), 1), (1, 200, (100,), 1)
    ]
    (line,) = describe_other_runs(other_runs)
    assert "ranks 0, 1 use" in line and "pid 200" in line and "left out pid 100" in line


@pytest.mark.parametrize(
    ("value", "text"),
    [(170.44, "170.4"), (0.0, "0.0"), (3.2e14, "3.2e+14"), (float("nan"), "?"), (float("inf"), "?")],
)
def test_format_ms(value: float, text: str) -> None:
    from torchstep_prof.traces.analysis.summarize import format_ms

    assert format_ms(value) == text


def test_table_lines_have_no_trailing_spaces_and_names_stay_whole() -> None:
    infos = [
        _trace(r, 10.0 + 30 * (r == 2), role=role, stage=stage,
               top_ops=(OpTime(name="aten::native_layer_norm_backward", self_ms=3.0),))
        for role, stage in (("trainer", "optimizer-step"), ("learner", "compute-advantages"))
        for r in range(3)
    ]
    for width in (60, 80, 120):
        lines = _render(summarize(infos), width=width).splitlines()
        assert max(map(len, lines)) <= width
        assert not [line for line in lines if line != line.rstrip()]
        for name in ("trainer/optimizer-step", "learner/compute-advantages"):
            assert any(name in line for line in lines), (width, name)
        assert not [line for line in lines if line.strip().startswith("aten::")]
