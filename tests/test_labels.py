"""Region labels (recording/labels.py): checked the same way with metrics alone and under a
schedule, so turning profiling on never breaks a loop that ran; labels that name the same files
warn once, naming the raw labels."""

from __future__ import annotations

import warnings

import torchstep_prof as tsp
from torchstep_prof import parse_trace_name

from script_helpers import run_script
from trace_helpers import trace_files


def test_a_loop_that_ran_with_metrics_alone_runs_unchanged_once_profiling_is_on(tmp_path) -> None:
    """CJK labels and an int role: timed under metrics, then profiled, never an exception."""
    done = run_script(
        """
        import torchstep_prof as tsp

        def loop():
            for n in range(1, 4):
                with tsp.step(n):
                    with tsp.profile_region("演员", "更新"):
                        pass
                    with tsp.profile_region(7, "update"):
                        pass

        with tsp.metrics(port=0, addr="127.0.0.1"):
            loop()
            print("metrics alone: ran", flush=True)
            with tsp.schedule(steps=[2]):
                loop()
            print("profiled: ran", flush=True)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "metrics alone: ran" in done.stdout and "profiled: ran" in done.stdout
    names = sorted(p.name.split("_rank")[0] for p in (tmp_path / "outputs" / "profile").iterdir())
    assert names == ["7_update_step2", "U+6F14+5458_U+66F4+65B0_step2"]
    assert done.stderr.count("LabelWarning") == 1, done.stderr  # the int role, once, whatever the mode
    assert "metrics 演员/更新: 6 times" in done.stdout and "metrics 7/update: 6 times" in done.stdout


def test_labels_that_name_the_same_files_warn_once_naming_the_raw_labels(save_dir) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tsp.schedule(steps=[1]), tsp.step(1):
            for role in ("learner_1", "learner-1", "learner 1", "learner/1"):
                with tsp.profile_region(role, "update"):
                    pass
    said = [str(w.message) for w in caught if issubclass(w.category, tsp.LabelWarning)]
    assert len(said) == 1, said
    assert "'learner_1/update' and 'learner-1/update'" in said[0]
    assert "learner-1_update" in said[0]
    assert {parse_trace_name(p).role for p in trace_files(save_dir)} == {"learner-1"}


def test_distinct_labels_never_warn(save_dir) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with tsp.schedule(steps=[1]), tsp.step(1):
            for role in ("critic", "critic2", "Critic"):
                with tsp.profile_region(role, "value"):
                    pass
    assert not [w for w in caught if issubclass(w.category, tsp.LabelWarning)]
    assert len(trace_files(save_dir)) == 3
