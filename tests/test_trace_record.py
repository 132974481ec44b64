"""A trace as data, without torch: its identity (naming.name_trace), the file name it builds and
parses back, the outcome its frozen record carries (recording/stopped.py), and how a finished file
takes its name without replacing another (writing/temp_files.link_exclusively)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchstep_prof.naming import FUSED_STAGE, build_trace_name, name_trace, parse_trace_name
from torchstep_prof.recording.spans import SpanLog
from torchstep_prof.recording.stopped import Outcome, StoppedTrace, decide_outcome

MOMENT = dt.datetime(2026, 8, 14, 12, 27, 31, 89000, tzinfo=dt.timezone.utc)


def identify(owner_role, stage, roles=(), process_role=None):
    """(name, roles) of a region's trace (``owner_role`` given) or a fused one (None)."""
    owner = None if owner_role is None else (owner_role, stage)
    where = dict(step=3, rank=1, world_size=4, pid=41, timestamp=MOMENT)
    return name_trace(owner=owner, roles=roles, process_role=process_role, **where)


def identity(owner_role, stage, roles=(), process_role=None):
    return identify(owner_role, stage, roles, process_role)[0]


def test_a_regions_trace_is_named_by_its_owner_and_parses_back():
    name, roles = identify("actor", "compute_log_prob", roles=["actor"], process_role="ignored-for-a-region")
    assert roles == ("actor",)
    built = build_trace_name(name)
    assert built == "actor_compute-log-prob_step3_rank1-of-4_pid41_20260814122731089.json"
    assert parse_trace_name(built) == name


def test_a_fused_trace_joins_the_roles_that_entered_it_once_each_in_order():
    name, roles = identify(None, None, roles=["critic_1", "actor", "critic_1"])
    assert roles == ("critic-1", "actor")
    assert (name.role, name.stage) == ("critic-1-actor", FUSED_STAGE)
    assert build_trace_name(name).startswith("critic-1-actor_train_step3_")


def test_a_fused_trace_without_roles_is_main_and_process_role_names_it_whole():
    assert identify(None, None) == (identity(None, None), ("main",))
    assert identity(None, None).role == "main"
    name, roles = identify(None, None, roles=["actor", "critic"], process_role="rollout_worker")
    assert (name.role, roles) == ("rollout-worker", ("rollout-worker",))


def test_many_roles_keep_the_first_and_count_the_rest_within_a_file_names_limit():
    roles = [f"role{i:02d}" for i in range(30)]
    name, held = identify(None, None, roles=roles)
    assert len(held) == 30
    assert name.role.startswith("role00-role01-") and name.role.endswith("-more")
    kept = name.role.split("+")[0].split("-")
    assert name.role.endswith(f"+{30 - len(kept)}-more") and len(name.role) <= 100
    built = build_trace_name(attrs.evolve(name, part=12, gzip=True))
    assert len(built.encode()) < 255
    assert parse_trace_name(built) == attrs.evolve(name, part=12, gzip=True)


labels = st.one_of(st.text(max_size=120), st.sampled_from(["演员", "___", "../../etc", "a/b", "x" * 200]))


@given(owner=st.one_of(st.none(), labels), stage=labels, roles=st.lists(labels, max_size=6), part=st.integers(0, 50))
def test_any_labels_name_a_file_that_parses_back_to_the_same_identity(owner, stage, roles, part):
    name = attrs.evolve(identity(owner, None if owner is None else stage, roles=roles), part=part)
    built = build_trace_name(name)
    assert "/" not in built and len(built.encode()) < 255
    assert parse_trace_name(built) == name


@pytest.mark.parametrize(
    ("kept", "lost", "failed", "outcome", "reason"),
    [
        (True, None, None, Outcome.WRITE, None),
        (False, None, None, Outcome.DISCARD, None),
        (False, None, "torch's stop failed", Outcome.DISCARD, None),
        (True, None, "torch's stop failed", Outcome.FAILED, "torch's stop failed"),
        (True, "taken over", None, Outcome.LOST, "taken over"),
        (False, "taken over", None, Outcome.LOST, "taken over"),
    ],
)
def test_the_outcome_table(kept, lost, failed, outcome, reason):
    assert decide_outcome(kept=kept, lost=lost, failed=failed) == (outcome, reason)


def stopped(**fields) -> StoppedTrace:
    values = dict(
        name=identity("actor", "update"),
        roles=("actor",),
        discrete=True,
        occurrence=2,
        save_path="out",
        outcome=Outcome.WRITE,
        wall_s=0.5,
        start_s=0.01,
        stop_s=0.02,
        spans=SpanLog(0, ["actor"]),
    )
    values.update(fields)
    return StoppedTrace(**values)


def test_the_record_is_frozen_and_its_summary_row_is_labelled_as_its_file():
    trace = stopped()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        trace.outcome = Outcome.DISCARD  # type: ignore[misc]
    row = trace.row(path="out/a.json")
    assert (row.role, row.stage, row.step, row.rank, row.world_size) == ("actor", "update", 3, 1, 4)
    assert (row.occurrence, row.discrete, row.path, row.wall_s, row.ok) == (2, True, "out/a.json", 0.5, True)


def test_an_unwritten_row_says_why_and_claims_no_time():
    row = stopped(outcome=Outcome.LOST, reason="taken over").unwritten_row()
    assert (row.path, row.error, row.ok) == (None, "taken over", False)
    assert (row.wall_s, row.start_s, row.stop_s) == (0.0, 0.0, 0.0)


def test_naming_and_the_record_import_without_torch():
    code = (
        "import sys, torchstep_prof.naming, torchstep_prof.recording.stopped; "
        "sys.exit('torch' in sys.modules or 'torchstep_prof.summary.records' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_file_takes_a_name_only_while_no_file_holds_it(tmp_path, monkeypatch, hard_links):
    import errno
    import os

    from torchstep_prof.writing.temp_files import link_exclusively

    if not hard_links:  # FAT, some FUSE mounts

        def no_hard_links(src, dst, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_hard_links)
    (tmp_path / "taken.json").write_text("theirs")
    for name in ("one", "two"):
        (tmp_path / f"{name}.tmp").write_text(name)
    assert not link_exclusively(str(tmp_path / "one.tmp"), str(tmp_path / "taken.json"))
    assert link_exclusively(str(tmp_path / "one.tmp"), str(tmp_path / "free.json"))
    assert not link_exclusively(str(tmp_path / "two.tmp"), str(tmp_path / "free.json"))
    assert (tmp_path / "taken.json").read_text() == "theirs"
    assert (tmp_path / "free.json").read_text() == "one"
    assert (tmp_path / "one.tmp").exists() is hard_links  # a link keeps the old name, a rename moves it
