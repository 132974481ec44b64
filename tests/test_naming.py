"""Trace file names: the builder, its inverse and the label rules (docs/trace-files.md)."""

from __future__ import annotations

import datetime as dt
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchstep_prof import TraceName, build_trace_name, parse_trace_name
from torchstep_prof.naming import TRACE_NAME_PATTERN

MOMENT = dt.datetime(2026, 8, 14, 12, 27, 31, 89000, tzinfo=dt.timezone.utc)


def name(**fields) -> TraceName:
    values = dict(role="actor", stage="update", step=3, rank=1, world_size=4, pid=41, timestamp=MOMENT)
    values.update(fields)
    return TraceName(**values)


def test_the_grammar_of_the_spec():
    assert build_trace_name(name()) == "actor_update_step3_rank1-of-4_pid41_20260814122731089.json"
    assert build_trace_name(name(gzip=True)).endswith("_20260814122731089.json.gz")
    assert build_trace_name(name(part=2)).endswith("_20260814122731089_part2.json")
    assert build_trace_name(name(part=1, gzip=True)).endswith("_part1.json.gz")


def test_the_timestamp_is_utc_with_milliseconds_in_17_digits():
    plus_two = dt.timezone(dt.timedelta(hours=2))
    local = dt.datetime(2026, 8, 14, 14, 27, 31, 89999, tzinfo=plus_two)
    built = build_trace_name(name(timestamp=local))
    assert re.search(r"_pid41_(\d{17})\.json$", built).group(1) == "20260814122731089"


@pytest.mark.parametrize(
    ("label", "in_name"),
    [
        ("compute_log_prob", "compute-log-prob"),
        ("actor/rollout", "actor-rollout"),
        ("update actor", "update-actor"),
        ("../../etc", "etc"),
        ("..hidden", "hidden"),
        ("-dash-", "dash"),
        ("lr=1e-4+warm.up", "lr=1e-4+warm.up"),
        ("a__b  c", "a-b-c"),
        ("rôle", "r-le"),
    ],
)
def test_labels_are_sanitized(label, in_name):
    built = build_trace_name(name(role=label, stage=label))
    assert built.startswith(f"{in_name}_{in_name}_step3_")
    assert parse_trace_name(built).role == in_name


@pytest.mark.parametrize(
    ("label", "encoded"),
    [("", "U+"), ("___", "U+5F+5F+5F"), ("../..", "U+2E+2E+2F+2E+2E"), ("  ", "U+20+20"), ("é", "U+E9"),
     ("演员", "U+6F14+5458")],
)  # fmt: skip
def test_a_label_with_nothing_left_is_named_by_its_code_points(label, encoded):
    built = build_trace_name(name(stage=label))
    assert built.startswith(f"actor_{encoded}_step3_")
    assert parse_trace_name(built).stage == encoded
    assert build_trace_name(name(stage=label)) == built  # stable: the same label, the same name


def test_parse_names_the_file_it_cannot_read():
    with pytest.raises(ValueError, match="notes.json"):
        parse_trace_name("/some/where/notes.json")
    with pytest.raises(ValueError):
        parse_trace_name("actor_update_step3_rank1-of-4_pid41_2026081412273108.json")  # 16 digits


def test_parse_reads_a_path_and_returns_every_field():
    parsed = parse_trace_name(os.path.join("out", "dir", "ref_compute-log-prob_step12_rank3-of-8_pid7_20260814122731089_part1.json.gz"))
    assert parsed == TraceName(
        role="ref",
        stage="compute-log-prob",
        step=12,
        rank=3,
        world_size=8,
        pid=7,
        timestamp=MOMENT,
        part=1,
        gzip=True,
    )
    assert parsed.world_size == 8


_LABEL_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.=+-"
clean_labels = st.text(alphabet=_LABEL_CHARS, min_size=1, max_size=20).filter(
    lambda s: s.strip("-.") == s
)
moments = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(dt.timezone.utc)
).map(lambda m: m.replace(microsecond=m.microsecond // 1000 * 1000))


@given(
    role=clean_labels,
    stage=clean_labels,
    step=st.integers(1, 10**6),
    rank=st.integers(0, 4096),
    world=st.integers(1, 4096),
    pid=st.integers(1, 2**22),
    moment=moments,
    part=st.integers(0, 50),
    gzip=st.booleans(),
)
def test_parse_is_the_exact_inverse_of_build(role, stage, step, rank, world, pid, moment, part, gzip):
    original = TraceName(
        role=role, stage=stage, step=step, rank=rank, world_size=world, pid=pid, timestamp=moment, part=part, gzip=gzip
    )
    built = build_trace_name(original)
    assert re.fullmatch(TRACE_NAME_PATTERN, built)
    assert parse_trace_name(built) == original
    assert build_trace_name(parse_trace_name(built)) == built


@given(role=st.text(min_size=1, max_size=30), stage=st.text(min_size=1, max_size=30))
def test_no_label_can_leave_the_folder_or_hide_the_file(role, stage):
    built = build_trace_name(name(role=role, stage=stage))  # nothing left: encoded, never refused
    assert re.fullmatch(TRACE_NAME_PATTERN, built)
    assert os.path.basename(built) == built and os.sep not in built
    assert not built.startswith((".", "-"))
    assert ".." not in built.split("_")[0:2]
