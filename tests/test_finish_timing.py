"""When the finish hook runs in one process: which schedule ends it, and exit-time guarantees."""

from __future__ import annotations

from pathlib import Path

import torchstep_prof as tsp
from script_helpers import run_script

REPO = Path(__file__).resolve().parents[1]


def hook_appending_to(path: Path) -> str:
    # Which step the hook ran after: the test writes it to "progress" before each step.
    return f'cat "{path.parent / "progress"}" >> "{path}"'


def run_steps(folder: Path, steps) -> None:
    for n in steps:
        (folder / "progress").write_text(f"after step {n - 1}\n")
        with tsp.step(n), tsp.profile_region("actor", "update"):
            pass


def test_a_hook_entered_outside_the_schedule_runs_after_its_last_selected_step(save_dir, tmp_path):
    # Scopes compose in any order: on_finish outside schedule ends with that schedule too.
    marker = tmp_path / "hook-ran"
    with tsp.on_finish(hook_appending_to(marker), wait=True), tsp.schedule(steps=[1, 2]):
        run_steps(tmp_path, [1])
        assert not marker.exists()
        run_steps(tmp_path, [2, 3])
        assert marker.read_text() == "after step 1\n"  # right after step 2, not at block exit
    assert marker.read_text() == "after step 1\n"  # once


def test_an_environment_hook_runs_once_with_the_codes_on_finish_scope(tmp_path):
    marker = tmp_path / "env-hook-ran"
    code = """
        import torchstep_prof as tsp
        with tsp.schedule(steps=[1, 2]), tsp.on_finish("echo code hook"):
            for n in (1, 2, 3):
                with tsp.step(n), tsp.profile_region("actor", "update"):
                    pass
    """
    done = run_script(code, tmp_path, TORCHSTEP_PROF_OVERRIDES=f"'finish_hook.cmd=echo ran >> {marker}'")
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran\n"  # the environment's command, on the code's scope, once


def test_nested_hooks_each_end_with_their_own_schedule(save_dir, tmp_path):
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    with tsp.schedule(steps=[1, 2]), tsp.on_finish(hook_appending_to(outer), wait=True):
        with tsp.on_finish(hook_appending_to(inner), wait=True):
            run_steps(tmp_path, [1, 2])
            assert outer.read_text() == "after step 1\n"  # both ended at step 2's exit
            assert inner.read_text() == "after step 1\n"
        run_steps(tmp_path, [3])
    assert outer.read_text() == "after step 1\n"  # once
    assert [h.outcome for h in tsp.records().hooks] == ["ok", "ok"]


def test_an_environment_hook_runs_at_exit_on_a_rank_that_profiled_nothing(tmp_path):
    marker = tmp_path / "env-hook-ran"
    code = """
        import torch
        import torchstep_prof as tsp
        for n in range(1, 3):
            with tsp.profile_region("actor", "update"):   # no step blocks; this rank is not profiled
                torch.ones(2).sum()
        print("training done", flush=True)
    """
    overrides = f"schedule.steps=[1] ranks=[0] finish_hook.all_ranks=true 'finish_hook.cmd=touch {marker}'"
    done = run_script(code, tmp_path, RANK="1", WORLD_SIZE="2", TORCHSTEP_PROF_OVERRIDES=overrides)
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    assert "hook on rank 1: ok" in done.stdout  # and the summary says so


def test_a_process_that_only_ran_a_hook_prints_its_summary(tmp_path):
    code = """
        import torchstep_prof as tsp
        with tsp.on_finish("true"):
            pass
    """
    done = run_script(code, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hook on rank 0: ok, exit code 0" in done.stdout


def test_every_gzip_trace_is_final_before_the_hook_runs(tmp_path):
    folder, listing = tmp_path / "profile", tmp_path / "listing"
    with tsp.configure(save_path=str(folder), gzip=True, summary=False), tsp.schedule(steps=[1, 2]), \
            tsp.on_finish(f'ls -A "$TORCHSTEP_PROF_SAVE_PATH" > "{listing}"', wait=True):
        for n in (1, 2, 3):
            with tsp.step(n), tsp.profile_region("actor", "update"):
                pass
    names = listing.read_text().split()
    assert len(names) == 2 and all(name.endswith(".json.gz") for name in names)  # no .partial left
    assert sorted(names) == sorted(p.name for p in folder.iterdir())
