"""The Hugging Face Trainer callback, against the real transformers on CPU (tiny GPT-2, no download)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install torchstep_prof[transformers])")

from tests.trace_helpers import check_trace_file, find_range, profiler_steps, range_names, span_us, contains, trace_files
from torchstep_prof import parse_trace_name

# One subprocess runs three trainings one after the other (transformers takes ~20 s to import
# here): plain, with gradient accumulation, one whose training_step raises at step 3, and one
# whose callback is added after the Trainer was made. Each
# leaves its traces and hook log in a folder of its own.
SCRIPT = textwrap.dedent(
    """
    import os, sys, json
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
    from torchstep_prof.integrations.transformers import TorchstepProfCallback

    torch.manual_seed(0)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 16
        def __getitem__(self, i):
            ids = torch.arange(8) + i
            return {"input_ids": ids % 50, "labels": ids % 50}

    def run(out, mode):
        os.environ["HOOK_LOG"] = os.path.join(out, "hook.log")  # the hook command appends there
        model = GPT2LMHeadModel(GPT2Config(vocab_size=50, bos_token_id=0, eos_token_id=0, n_positions=16, n_embd=16, n_layer=1, n_head=2))
        args = TrainingArguments(
            output_dir=os.path.join(out, "hf"), per_device_train_batch_size=2, max_steps=6,
            gradient_accumulation_steps=2 if mode == "accumulate" else 1,
            eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=4,
            logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
            dataloader_num_workers=0, disable_tqdm=True,
        )

        class Boom(Exception):
            pass

        callback = TorchstepProfCallback(
            steps=[3, 5], save_path=os.path.join(out, "traces"),
            on_finish={"cmd": [sys.executable, "-c",
                       "import os; open(os.environ['HOOK_LOG'], 'a').write(os.environ.get('TORCHSTEP_PROF_TRACES', '') + '\\\\n')"],
                       "wait": True},
        )
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(),
                          callbacks=[] if mode == "late" else [callback])
        if mode == "late":
            trainer.add_callback(callback)
        if mode == "raise":
            original = trainer.training_step
            def training_step(model, inputs, *rest, **kw):
                if trainer.state.global_step + 1 == 3:
                    raise Boom("step 3 failed")
                return original(model, inputs, *rest, **kw)
            trainer.training_step = training_step
            try:
                trainer.train()
            except Boom:
                import torch.autograd
                from torchstep_prof.scopes import effective_config
                # nothing left open: no profiler, no schedule in force
                print("AFTER-RAISE", torch.autograd._profiler_enabled(), effective_config().schedule)
            else:
                raise SystemExit("expected Boom")
        else:
            trainer.train()
            print("HOOK-AFTER-TRAIN", mode, open(os.environ["HOOK_LOG"]).read().count("\\n"))

    for mode in ("plain", "accumulate", "raise", "late"):
        out = os.path.join(sys.argv[1], mode)
        os.makedirs(out)
        run(out, mode)
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path_factory.mktemp("hf")
    script = root / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(script), str(root)], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, root


def _hook_runs(folder: Path) -> list[str]:
    return (folder / "hook.log").read_text().splitlines()


def test_trainer_profiles_chosen_steps_with_regions_and_hook(runs: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, root = runs
    files = trace_files(root / "plain" / "traces")
    names = [parse_trace_name(p) for p in files]
    assert sorted(n.step for n in names) == [3, 5], [p.name for p in files]
    assert {(n.role, n.stage, n.rank, n.world_size) for n in names} == {("trainer", "train", 0, 1)}
    for path in files:
        trace = check_trace_file(path)  # name grammar, metadata, exactly one ProfilerStep#<n>
        assert trace["torchstep_prof"]["discrete"] is False
        step_span = span_us(trace, profiler_steps(trace)[0])
        for region in ("trainer/training_step", "trainer/optimizer_step"):
            assert contains(step_span, span_us(trace, find_range(trace, region))), region
        train_end = span_us(trace, find_range(trace, "trainer/training_step"))[1]
        assert train_end <= span_us(trace, find_range(trace, "trainer/optimizer_step"))[0]
    # eval_steps=3: the evaluation step 3 triggers is inside step 3's trace, not step 5's
    by_step = {parse_trace_name(p).step: check_trace_file(p) for p in files}
    assert "trainer/evaluate" in range_names(by_step[3])
    assert contains(span_us(by_step[3], profiler_steps(by_step[3])[0]), span_us(by_step[3], find_range(by_step[3], "trainer/evaluate")))
    assert "trainer/evaluate" not in range_names(by_step[5])
    # the hook ran once, after step 5, listing both traces, before train() returned (wait=True)
    hook_runs = _hook_runs(root / "plain")
    assert len(hook_runs) == 1, hook_runs
    assert sorted(hook_runs[0].split(os.pathsep)) == sorted(str(p.resolve()) for p in files)
    assert "HOOK-AFTER-TRAIN plain 1" in proc.stdout


def test_gradient_accumulation_gives_one_training_step_range_per_micro_batch(
    runs: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    files = trace_files(runs[1] / "accumulate" / "traces")
    assert sorted(parse_trace_name(p).step for p in files) == [3, 5]
    for path in files:
        trace = check_trace_file(path)
        assert range_names(trace).count("trainer/training_step") == 2
        assert range_names(trace).count("trainer/optimizer_step") == 1
    assert len(_hook_runs(runs[1] / "accumulate")) == 1


def test_exception_in_train_leaves_nothing_open(runs: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, root = runs
    # step 3 was open when training_step raised: its trace is written, the profiler is stopped,
    # the scopes are gone, and the hook (its scope closed by the exception) ran once
    assert "AFTER-RAISE False None" in proc.stdout, proc.stdout + proc.stderr
    files = trace_files(root / "raise" / "traces")
    assert [parse_trace_name(p).step for p in files] == [3]
    check_trace_file(files[0])
    assert _hook_runs(root / "raise") == [str(files[0].resolve())]


def test_callback_added_late_still_profiles_and_says_what_it_cannot_guard(
    runs: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, root = runs
    assert proc.stderr.count("was added after the Trainer was made") == 1, proc.stderr[-3000:]
    files = trace_files(root / "late" / "traces")
    assert sorted(parse_trace_name(p).step for p in files) == [3, 5]
    assert len(_hook_runs(root / "late")) == 1
