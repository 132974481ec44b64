"""The profiler slot's moves (recording/slot_states.py), as tables, without torch.

Each row is (state, event, the state after it); the slot itself only looks moves up there.
"""

from __future__ import annotations

import pytest

from torchstep_prof.recording.slot_states import ON_START, TRANSITIONS, SlotEvent, SlotState, next_state

IDLE, STARTING, RECORDING, STOPPING, FORKED = SlotState
TAKE, PUBLISH, RELEASE, STOP, FORGET, FORK = SlotEvent

# Every (state, event) pair and what follows: the slot's whole behaviour, written out.
MOVES = [
    # a start or a warm-up claims only a free slot (a start finding it busy waits or joins)
    (IDLE, TAKE, STARTING),
    (STARTING, TAKE, STARTING),
    (RECORDING, TAKE, RECORDING),
    (STOPPING, TAKE, STOPPING),
    # torch runs: the trace is published (only a start publishes)
    (STARTING, PUBLISH, RECORDING),
    (IDLE, PUBLISH, IDLE),
    (RECORDING, PUBLISH, RECORDING),
    (STOPPING, PUBLISH, STOPPING),
    # done with the slot: a failed or refused start, a warm-up, a trace handed over
    (STARTING, RELEASE, IDLE),
    (STOPPING, RELEASE, IDLE),
    (IDLE, RELEASE, IDLE),
    (RECORDING, RELEASE, IDLE),
    # a stop, from any live state (its trace may be one the slot forgot)
    (RECORDING, STOP, STOPPING),
    (IDLE, STOP, STOPPING),
    (STARTING, STOP, STOPPING),
    (STOPPING, STOP, STOPPING),
    # only a recording trace is forgotten
    (RECORDING, FORGET, IDLE),
    (IDLE, FORGET, IDLE),
    (STARTING, FORGET, STARTING),
    (STOPPING, FORGET, STOPPING),
    # a fork makes the child inert, from anywhere, for good
    *[(state, FORK, FORKED) for state in SlotState],
    *[(FORKED, event, FORKED) for event in SlotEvent],
]


def test_the_table_lists_every_pair_once():
    pairs = [(state, event) for state, event, _ in MOVES]
    assert len(pairs) - len(set(pairs)) == 1  # (FORKED, FORK) is in both fork rows
    assert set(pairs) == {(state, event) for state in SlotState for event in SlotEvent}


@pytest.mark.parametrize(("state", "event", "after"), MOVES, ids=lambda v: getattr(v, "name", None))
def test_each_move(state, event, after):
    assert next_state(state, event) is after


@pytest.mark.parametrize(
    ("events", "path"),
    [
        ([TAKE, PUBLISH, STOP, RELEASE], [STARTING, RECORDING, STOPPING, IDLE]),  # a trace
        ([TAKE, RELEASE], [STARTING, IDLE]),  # a warm-up, a failed start, someone else's profiler
        ([TAKE, PUBLISH, FORGET], [STARTING, RECORDING, IDLE]),  # a leaked trace dropped by a test
        ([TAKE, PUBLISH, FORK, STOP, RELEASE, TAKE], [STARTING, RECORDING, FORKED, FORKED, FORKED, FORKED]),
    ],
)
def test_lifecycles(events, path):
    state, seen = IDLE, []
    for event in events:
        state = next_state(state, event)
        seen.append(state)
    assert seen == path


def test_a_start_takes_a_free_slot_waits_for_a_start_or_stop_and_joins_a_trace():
    assert ON_START == {IDLE: "take", STARTING: "wait", STOPPING: "wait", RECORDING: "join", FORKED: "join"}


def test_only_the_free_slot_can_be_taken():
    assert [state for state in SlotState if TAKE in TRANSITIONS[state]] == [IDLE]
