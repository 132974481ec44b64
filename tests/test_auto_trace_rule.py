"""The slow-step rule and budget (torchstep_prof/slow_steps/rule.py: pure, fed samples here), and
the auto_trace config section, its scope and the warning when it is off."""

from __future__ import annotations

import random
import subprocess
import sys
import warnings

import pytest

import torchstep_prof as tsp
from torchstep_prof.config.converter import from_dict
from torchstep_prof.config.overrides import apply_overrides
from torchstep_prof.slow_steps.rule import Budget, Detector

from dist_helpers import worker_env


def detector(**kw) -> Detector:
    args = dict(metric="step", factor=2.0, min_ms=10.0, baseline_steps=50)
    args.update(kw)
    return Detector(**args)


def feed(d: Detector, times_s, relearn: bool = True) -> list:
    """Each sample in turn, relearning after a slowdown as the watch does; the slowdowns."""
    found = []
    for n, seconds in enumerate(times_s):
        slow = d.observe(n, seconds)
        if slow is not None:
            found.append(slow)
            if relearn:
                d.relearn()
    return found


@pytest.mark.parametrize("seed", range(5))
def test_thirty_percent_jitter_gives_nothing(seed):
    rng = random.Random(seed)
    assert feed(detector(), [0.040 * rng.uniform(0.7, 1.3) for _ in range(5000)]) == []


def test_a_step_three_times_slower_is_caught_at_once_with_its_numbers():
    rng = random.Random(1)
    times = [0.040 * rng.uniform(0.7, 1.3) for _ in range(120)] + [0.120] * 80
    found = feed(detector(), times)
    assert [s.step for s in found] == [120]  # and once only: the new level becomes the baseline
    slow = found[0]
    assert slow.metric == "step" and slow.factor == 2.0 and slow.value_ms == pytest.approx(120.0)
    assert 36 < slow.baseline_ms < 44 and 2.7 < slow.ratio < 3.3
    assert slow.why() == {
        "metric": "step", "step": 120, "value_ms": 120.0, "baseline_ms": round(slow.baseline_ms, 3), "factor": 2.0,
        "ratio": round(slow.ratio, 3),
    }  # fmt: skip


def test_nothing_before_the_baseline_is_in():
    d = detector(baseline_steps=10)
    assert feed(d, [0.040] * 9 + [0.400]) == []  # the 10th sample: 9 were in, not 10
    assert d.observe(10, 0.400) is not None


def test_a_ramp_is_caught_before_it_redefines_its_baseline():
    # 40 ms to 160 ms over 300 steps: each step only 0.5% slower than the one before, so a
    # plain rolling median of the last 50 follows it (never 2x behind); this baseline does not.
    times = [0.040] * 60 + [0.040 + 0.120 * i / 300 for i in range(300)]
    found = feed(detector(), times)
    assert found, "the ramp was never caught"
    first = found[0]
    assert first.baseline_ms == pytest.approx(40.0, rel=0.05) and first.value_ms <= 85.0


def test_min_ms_keeps_short_steps_quiet():
    d = detector(baseline_steps=5, min_ms=10.0)
    assert feed(d, [0.002] * 5 + [0.008] * 3) == []  # 4x, but 6 ms over: under min_ms
    assert feed(d, [0.020]) != []  # 10x and 18 ms over


def test_a_spike_stays_out_of_the_baseline():
    d = detector(baseline_steps=5)
    found = feed(d, [0.040] * 5 + [0.400] + [0.040] * 5, relearn=False)
    assert [s.step for s in found] == [5] and d.baseline() == pytest.approx(0.040)


def test_a_faster_job_lowers_its_baseline_at_once():
    d = detector(baseline_steps=10)
    feed(d, [0.100] * 40 + [0.030] * 10)
    assert d.baseline() == pytest.approx(0.030)


def test_the_budget_refuses_with_the_reason():
    budget = Budget(max_per_hour=2, max_bytes=1000, cooldown_steps=100)
    ok = dict(step=500, last_capture_step=None, captures_last_hour=0, bytes_written=0)
    assert budget.refuse(**ok) is None
    assert budget.refuse(**dict(ok, last_capture_step=450)) == "cooldown: 50 of 100 steps since the last capture"
    assert budget.refuse(**dict(ok, last_capture_step=400)) is None
    assert "max_traces_per_hour 2" in budget.refuse(**dict(ok, captures_last_hour=2))
    assert "max_bytes 1000" in budget.refuse(**dict(ok, bytes_written=1000))


def test_the_config_section_from_files_overrides_and_scope():
    config = from_dict({"auto_trace": {"on": "actor/forward", "factor": 3, "peers": 0}})
    assert (config.auto_trace.on, config.auto_trace.factor, config.auto_trace.peers) == ("actor/forward", 3, 0)
    overridden = apply_overrides(tsp.ProfilerConfig(), ["auto_trace.next=4"])
    assert overridden.auto_trace == tsp.AutoTraceConfig(next=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # off alone: the next test sees it said, in a process of its own
        with tsp.auto_trace(factor=2.5, baseline_steps=20):
            assert tsp.effective_config().auto_trace == tsp.AutoTraceConfig(factor=2.5, baseline_steps=20)


def test_alone_it_is_off_and_says_what_it_needs():
    # It reads the metrics' timings and reaches its peers through the on-demand folder. Once
    # per process: a fresh one.
    code = (
        "import torchstep_prof as tsp\n"
        "with tsp.auto_trace():\n    pass\n"
        "with tsp.metrics(port=0, addr='127.0.0.1'), tsp.auto_trace():\n    pass\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=worker_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert (
        "TorchstepProfWarning: torchstep_prof: auto_trace is off: it needs metrics and on_demand on too" in run.stderr
    )
    assert "auto_trace is off: it needs on_demand on too (on_demand: {dir: DIR})" in run.stderr


def test_every_bad_field_is_named_with_its_value_and_what_is_allowed():
    with pytest.raises(tsp.ConfigError) as caught:
        from_dict({"auto_trace": {
            "on": "forward", "factor": 1.0, "min_ms": -1, "baseline_steps": 2, "next": 101, "peers": -1,
            "cooldown_steps": 1.5, "max_traces_per_hour": 0, "max_bytes": True,
        }})  # fmt: skip
    text = str(caught.value)
    for line in (
        "auto_trace.on: must be 'step', or a region as '<role>/<stage>' (got 'forward')",
        "auto_trace.factor: must be > 1 (got 1.0)",
        "auto_trace.min_ms: must be a finite number of milliseconds >= 0 (got -1)",
        "auto_trace.baseline_steps: must be >= 3 (got 2)",
        "auto_trace.next: must be at most 100 (got 101)",
        "auto_trace.peers: must be >= 0 (got -1)",
        "auto_trace.cooldown_steps: must be an integer (got 1.5)",
        "auto_trace.max_traces_per_hour: must be >= 1 (got 0)",
        "auto_trace.max_bytes: must be an integer (got True)",
    ):
        assert line in text
    with pytest.raises(tsp.ConfigError, match=r"auto_trace.factor: must be > 1 \(got 0.5\)"):
        tsp.auto_trace(factor=0.5)
