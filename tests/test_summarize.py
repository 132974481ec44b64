"""Grouping traces by region and step, finding stragglers, and rendering the summary."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from trace_factory import assert_summary_shape, write_ranks, write_trace

from torchstep_prof.summarize import (
    find_straggler,
    render_summary,
    summarize,
    summary_to_dict,
)
from torchstep_prof.tracefiles import OpTime, TraceInfo, Unreadable, scan_traces

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
