"""The profiler slot's states and the moves between them, written as tables.

As torch's ``profile.action_map`` is keyed by the previous and the current action,
:data:`TRANSITIONS` says, for each state and event, the state that follows, and
:data:`ON_START` what a start finds in each state; :class:`~.slot.ProfilerSlot` only looks them
up (under its lock). Plain data, without torch, so the rules are testable on their own.
"""

from __future__ import annotations

import enum
from typing import Literal

__all__ = ["ON_START", "TRANSITIONS", "SlotEvent", "SlotState", "StartMove", "next_state"]


class SlotState(enum.Enum):
    IDLE = "idle"  # free
    STARTING = "starting"  # a thread starts a trace, or warms the profiler up
    RECORDING = "recording"  # a trace records (the slot's session)
    STOPPING = "stopping"  # a thread stops one and hands it to the writer
    FORKED = "forked"  # a forked child: inert for good


class SlotEvent(enum.Enum):
    TAKE = "take"  # a start or a warm-up claims the free slot
    PUBLISH = "publish"  # torch's profiler runs: the trace is published
    RELEASE = "release"  # done with the slot: started nothing (failed, someone else's), warmed up, or handed over
    STOP = "stop"  # a trace is unpublished and stopped
    FORGET = "forget"  # the trace recording is forgotten without a stop (tests dropping a leaked one)
    FORK = "fork"  # this is now a forked child


_IDLE, _STARTING, _RECORDING, _STOPPING, _FORKED = SlotState  # docs/hot-path.md, "Enum members as module names"
_TAKE, _PUBLISH, _RELEASE, _STOP, _FORGET, _FORK = SlotEvent

TRANSITIONS: dict[SlotState, dict[SlotEvent, SlotState]] = {
    _IDLE: {_TAKE: _STARTING, _RELEASE: _IDLE, _STOP: _STOPPING, _FORK: _FORKED},
    _STARTING: {_PUBLISH: _RECORDING, _RELEASE: _IDLE, _STOP: _STOPPING, _FORK: _FORKED},
    _RECORDING: {_STOP: _STOPPING, _FORGET: _IDLE, _RELEASE: _IDLE, _FORK: _FORKED},
    _STOPPING: {_RELEASE: _IDLE, _STOP: _STOPPING, _FORK: _FORKED},
    _FORKED: {},
}
"""``state -> event -> next state``; an event missing from its state's row leaves the state
as it is (a forked child stays forked whatever happens; a publish only ends a start; only a
recording trace is forgotten). A stop is taken from any live state: the trace it stops may be
one the slot forgot meanwhile."""

StartMove = Literal["take", "wait", "join"]

ON_START: dict[SlotState, StartMove] = {
    _IDLE: "take",  # the slot is free: this start claims it
    _STARTING: "wait",  # another thread starts or warms up: Kineto crashes on two at once
    _STOPPING: "wait",  # another thread stops one: the same
    _RECORDING: "join",  # another thread's trace records: the region is a range in it
    _FORKED: "join",  # a forked child: there is nothing to join, so nothing starts
}
"""What a start does in each state."""


def next_state(state: SlotState, event: SlotEvent) -> SlotState:
    """The state after ``event`` in ``state`` (:data:`TRANSITIONS`).

    >>> next_state(SlotState.IDLE, SlotEvent.TAKE)
    <SlotState.STARTING: 'starting'>
    >>> next_state(SlotState.FORKED, SlotEvent.RELEASE)
    <SlotState.FORKED: 'forked'>
    """
    return TRANSITIONS[state].get(event, state)
