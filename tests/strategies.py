"""Hypothesis strategies for valid configs: every value the classes accept, nothing they reject."""

from __future__ import annotations

import string
import unicodedata

from hypothesis import strategies as st

from torchstep_prof.config.model import CONTENT_NAMES, FinishHookConfig, ProfilerConfig, ScheduleConfig

# Any text but lone surrogates (no file encoding can hold them).
ANY_TEXT = st.characters(blacklist_categories=("Cs",))
# What a person types on a command line: printable ASCII.
TYPED_TEXT = st.sampled_from(string.ascii_letters + string.digits + string.punctuation + " ")

_ints = st.integers(min_value=0, max_value=2**40)
_seconds = st.one_of(
    st.integers(min_value=0, max_value=10**6),
    st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
)


def _non_empty(alphabet: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=1, max_size=12)


def _save_path(alphabet: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # No '"', '\\' or control character: a save_path refuses them (no trace viewer handles them).
    return _non_empty(alphabet).filter(lambda s: not any(c in '"\\' or unicodedata.category(c) == "Cc" for c in s))


def _role(alphabet: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # A role must keep a label character after sanitizing: put a letter or digit in it.
    label_char = st.sampled_from(string.ascii_letters + string.digits)
    return st.builds(lambda a, c, b: a + c + b, st.text(alphabet, max_size=5), label_char,
                     st.text(alphabet, max_size=5))


def schedules() -> st.SearchStrategy[ScheduleConfig]:
    """An explicit steps list, or torch.profiler's cycle."""
    explicit = st.builds(
        ScheduleConfig,
        steps=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=5, unique=True),
    )
    cycle = st.builds(
        ScheduleConfig,
        skip_first=st.integers(0, 100),
        wait=st.integers(0, 100),
        warmup=st.integers(0, 100),
        active=st.integers(1, 100),
        repeat=st.integers(0, 100),
    )
    return st.one_of(explicit, cycle)


def finish_hooks(alphabet: st.SearchStrategy[str] = ANY_TEXT) -> st.SearchStrategy[FinishHookConfig]:
    """A hook with a shell string or an argv list, and every option."""
    text = _non_empty(alphabet)
    shell_cmd = text.filter(lambda s: s.strip())
    argv = st.lists(text, min_size=1, max_size=4)
    return st.builds(
        FinishHookConfig,
        cmd=st.one_of(shell_cmd, argv),
        ranks=st.none() | st.lists(_ints, max_size=4, unique=True),
        all_ranks=st.booleans(),
        per_node=st.booleans(),
        node_wait_s=_seconds,
        timeout_s=_seconds.filter(lambda s: s > 0),
        relocate=st.lists(text, max_size=3),
    )


def configs(alphabet: st.SearchStrategy[str] = ANY_TEXT) -> st.SearchStrategy[ProfilerConfig]:
    """A valid ``ProfilerConfig``; ``alphabet`` draws the characters of its strings."""
    return st.builds(
        ProfilerConfig,
        enable=st.booleans(),
        save_path=_save_path(alphabet),
        discrete=st.booleans(),
        gzip=st.booleans(),
        summary=st.booleans(),
        process_role=st.none() | _role(alphabet),
        ranks=st.lists(_ints, max_size=5, unique=True),
        all_ranks=st.booleans(),
        contents=st.lists(st.sampled_from(CONTENT_NAMES), max_size=4),
        schedule=st.none() | schedules(),
        finish_hook=st.none() | finish_hooks(alphabet),
    )
