"""The Lightning callback, against the real lightning.pytorch on CPU (a Linear layer, data in memory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch", reason="lightning is not installed (pip install torchstep_prof[lightning])")

from tests.trace_helpers import check_trace_file, contains, find_range, profiler_steps, range_names, span_us, trace_files
from torchstep_prof import parse_trace_name

# One subprocess runs two fits one after the other (lightning is slow to import here): a plain
# one with validation every 3 batches, and one whose training_step raises at step 3.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    import lightning.pytorch as pl
    from torchstep_prof.integrations.lightning import TorchstepProfCallback

    class Boom(Exception):
        pass

    class Tiny(pl.LightningModule):
        def __init__(self, fail_at=None):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.fail_at = fail_at
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step + 1 == self.fail_at:
                raise Boom("step 3 failed")
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def validation_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))

    def run(out, mode):
        os.environ["HOOK_LOG"] = os.path.join(out, "hook.log")  # the hook command appends there
        callback = TorchstepProfCallback(
            steps=[3, 5], save_path=os.path.join(out, "traces"),
            on_finish={"cmd": [sys.executable, "-c",
                       "import os; open(os.environ['HOOK_LOG'], 'a').write(os.environ.get('TORCHSTEP_PROF_TRACES', '') + '\\\\n')"],
                       "wait": True},
        )
        trainer = pl.Trainer(
            max_steps=6, val_check_interval=3, limit_val_batches=2, num_sanity_val_steps=1,
            accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
        )
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        model = Tiny(fail_at=3 if mode == "raise" else None)
        if mode == "raise":
            try:
                trainer.fit(model, loader, loader)
            except Boom:
                from torchstep_prof.scopes import effective_config
                # nothing left open: no profiler, no schedule in force, training_step unwrapped
                print("AFTER-RAISE", torch.autograd._profiler_enabled(), effective_config().schedule,
                      "training_step" in model.__dict__)
            else:
                raise SystemExit("expected Boom")
        else:
            trainer.fit(model, loader, loader)
            print("HOOK-AFTER-FIT", mode, open(os.environ["HOOK_LOG"]).read().count("\\n"))

    for mode in ("plain", "raise"):
        out = os.path.join(sys.argv[1], mode)
        os.makedirs(out)
        run(out, mode)
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("lightning")
    script = root / "fit.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, root


def _hook_runs(folder: Path) -> list[str]:
    return (folder / "hook.log").read_text().splitlines()


def test_fit_profiles_chosen_steps_with_regions_and_hook(runs: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, root = runs
    files = trace_files(root / "plain" / "traces")
    names = [parse_trace_name(p) for p in files]
    assert sorted(n.step for n in names) == [3, 5], [p.name for p in files]
    assert {(n.role, n.stage, n.rank, n.world_size) for n in names} == {("trainer", "train", 0, 1)}
    by_step = {}
    for path in files:
        trace = by_step[parse_trace_name(path).step] = check_trace_file(path)  # exactly one ProfilerStep#<n>
        assert trace["torchstep_prof"]["discrete"] is False
        step_span = span_us(trace, profiler_steps(trace)[0])
        spans = {}
        for stage in ("training_step", "backward", "optimizer_step"):
            assert range_names(trace).count(f"trainer/{stage}") == 1, (stage, range_names(trace))
            spans[stage] = span_us(trace, find_range(trace, f"trainer/{stage}"))
            assert contains(step_span, spans[stage]), stage
        # in order, none overlapping: training_step, then backward, then the update
        assert spans["training_step"][1] <= spans["backward"][0]
        assert spans["backward"][1] <= spans["optimizer_step"][0]
    # val_check_interval=3: the validation after step 3 is in step 3's trace (and no sanity check)
    assert range_names(by_step[3]).count("trainer/validation") == 1
    assert contains(span_us(by_step[3], profiler_steps(by_step[3])[0]), span_us(by_step[3], find_range(by_step[3], "trainer/validation")))
    assert "trainer/validation" not in range_names(by_step[5])
    hook_runs = _hook_runs(root / "plain")
    assert len(hook_runs) == 1, hook_runs
    assert sorted(hook_runs[0].split(os.pathsep)) == sorted(str(p.resolve()) for p in files)
    assert "HOOK-AFTER-FIT plain 1" in proc.stdout


def test_exception_in_fit_leaves_nothing_open(runs: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, root = runs
    assert "AFTER-RAISE False None False" in proc.stdout, proc.stdout + proc.stderr
    files = trace_files(root / "raise" / "traces")
    assert [parse_trace_name(p).step for p in files] == [3]
    check_trace_file(files[0])
    assert _hook_runs(root / "raise") == [str(files[0].resolve())]


def test_bad_arguments_fail_when_the_callback_is_made() -> None:
    from torchstep_prof import ConfigError
    from torchstep_prof.integrations.lightning import TorchstepProfCallback

    with pytest.raises(ConfigError) as raised:
        TorchstepProfCallback(steps=[3], sav_path="/tmp/x", contents=["gpu"])
    message = str(raised.value)
    assert "sav_path" in message and "save_path" in message  # the typo, and the likely fix
    with pytest.raises(ConfigError, match="gpu"):
        TorchstepProfCallback(steps=[3], contents=["gpu"])
    with pytest.raises(ConfigError, match="finish_hook"):
        TorchstepProfCallback(steps=[3], on_finish={"per_node": True})  # no cmd


RANKS_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    import lightning.pytorch as pl
    from torchstep_prof.integrations.lightning import TorchstepProfCallback
    from torchstep_prof.scopes import effective_config

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Probe(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                config = effective_config()
                print("IN-FORCE", list(config.ranks), config.all_ranks)

    data = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    callback = TorchstepProfCallback(steps=[2], ranks=[0, 1], all_ranks=True, save_path=sys.argv[1])
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback, Probe()],
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
    """
)


def test_ranks_and_all_ranks_both_reach_the_config(tmp_path: Path) -> None:
    script = tmp_path / "fit_ranks.py"
    script.write_text(RANKS_SCRIPT)
    # Rank 2 of 3 (from the environment, no process group): outside ranks=[0, 1], so only
    # all_ranks=True makes it profile.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHSTEP_PROF_", "LOCAL_"))}
    env.update(RANK="2", WORLD_SIZE="3")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "traces")], capture_output=True, text=True,
                          timeout=400, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IN-FORCE [0, 1] True" in proc.stdout, proc.stdout
    files = trace_files(tmp_path / "traces")
    assert [(n.step, n.rank, n.world_size) for n in map(parse_trace_name, files)] == [(2, 2, 3)]
