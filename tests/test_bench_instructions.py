"""The instruction counter behind bench_run's target (bench/_instructions.py) counts what runs
between begin() and end(), nothing before or after, the same number run after run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import _instructions  # noqa: E402

pytestmark = pytest.mark.skipif(_instructions.missing() is not None, reason=str(_instructions.missing()))

SPAN = """
import sys
sys.path.insert(0, {bench!r})
import _instructions
sum(range(300_000))  # before the span: not counted
_instructions.begin()
sum(range({n}))
_instructions.end()
sum(range(300_000))  # after it: not counted
print("done")
"""


def counted(n: int) -> int:
    result = _instructions.count([sys.executable, "-c", SPAN.format(bench=str(BENCH), n=n)], os.environ)
    assert result.stdout.strip() == "done"
    return result.instructions


def test_the_span_alone_is_counted_and_twice_the_work_counts_twice():
    small, big = counted(100_000), counted(200_000)
    assert small > 1_000_000  # 100,000 iterations of the interpreter's loop, at least 10 instructions each
    assert 1.95 < big / small < 2.05  # the work before and after the span would pull this toward 1


def test_the_same_span_counts_the_same_run_after_run():
    first, second = counted(100_000), counted(100_000)
    assert abs(first - second) / first < 1e-3


def test_a_command_that_never_ends_a_span_is_named():
    with pytest.raises(RuntimeError, match="no span was counted"):
        _instructions.count([sys.executable, "-c", "print('no span')"], os.environ)


def test_outside_the_counter_begin_and_end_do_nothing():
    env = {k: v for k, v in os.environ.items() if k != _instructions.LIBRARY_ENV}
    import subprocess

    done = subprocess.run([sys.executable, "-c", SPAN.format(bench=str(BENCH), n=10)], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "done"
