"""What a trace holds: ``contents()`` maps to torch.profiler's options (docs/scopes-and-regions.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from trace_helpers import events, load_trace, range_names, trace_files

import torchstep_prof as tsp
from torchstep_prof.recording import session as _session


def record(*contents, save_dir):
    """One profiled region doing a little real work under ``contents(*contents)``; its trace."""
    model = torch.nn.Linear(8, 8)
    with tsp.schedule(steps=[1]), tsp.contents(*contents):
        with tsp.profile_region("actor", "update", step=1):
            x = torch.ones(4, 8)
            model(x).relu().sum()
            scratch = torch.empty(256, 256)  # an allocation and a free: memory events
            del scratch
    [path] = trace_files(save_dir)
    return load_trace(path)


def has_input_dims(trace):
    return any("Input Dims" in e.get("args", {}) for e in events(trace) if str(e.get("name", "")).startswith("aten::"))


def has_python_stack(trace):
    return any(e.get("cat") == "python_function" for e in events(trace))


def has_memory(trace):
    return any(e.get("name") == "[memory]" for e in events(trace))


def has_aten_ops(trace):
    return any(str(e.get("name", "")).startswith("aten::") for e in events(trace))


def test_cpu_alone_has_ops_and_ranges_and_nothing_else(save_dir):
    trace = record("cpu", save_dir=save_dir)
    assert has_aten_ops(trace) and "actor/update" in range_names(trace)
    assert not has_input_dims(trace)
    assert not has_python_stack(trace)
    assert not has_memory(trace)


def test_nothing_listed_records_cpu_on_a_machine_without_cuda(save_dir, recwarn):
    trace = record(save_dir=save_dir)
    assert has_aten_ops(trace) and "actor/update" in range_names(trace)
    assert not (has_input_dims(trace) or has_python_stack(trace) or has_memory(trace))
    assert not [w for w in recwarn if "cuda" in str(w.message).lower()]


def test_shapes_puts_input_dims_on_aten_events(save_dir):
    trace = record("cpu", "shapes", save_dir=save_dir)
    assert has_input_dims(trace)
    assert not has_python_stack(trace) and not has_memory(trace)


def test_stack_adds_python_stack_events(save_dir):
    trace = record("stack", save_dir=save_dir)
    assert has_python_stack(trace)
    assert not has_input_dims(trace) and not has_memory(trace)


def test_memory_adds_memory_events(save_dir):
    trace = record("memory", save_dir=save_dir)
    assert has_memory(trace)
    assert not has_input_dims(trace) and not has_python_stack(trace)


def test_everything_at_once(save_dir):
    trace = record("cpu", "shapes", "stack", "memory", "flops", "modules", save_dir=save_dir)
    assert has_input_dims(trace) and has_python_stack(trace) and has_memory(trace)
    assert "actor/update" in range_names(trace)


@pytest.mark.parametrize("item", ["flops", "modules"])
def test_flops_and_modules_still_write_a_whole_trace(save_dir, item):
    # Their effect is not visible in a CPU-only Chrome trace of torch 2.13 (flops are not
    # exported for CPU ops; module rows need ``stack`` too): check they do not break anything.
    trace = record(item, save_dir=save_dir)
    assert has_aten_ops(trace) and "actor/update" in range_names(trace)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_asking_for_cuda_without_cuda_records_cpu_and_warns_once(save_dir, monkeypatch):
    # The warning is once per process: forget any earlier one so this test stands alone.
    monkeypatch.setattr(_session, "_warned_no_cuda", False)
    _session.profiler_kwargs.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tsp.schedule(steps=[1, 2]), tsp.contents("cpu", "cuda"):
                for n in (1, 2):
                    with tsp.profile_region("actor", "update", step=n):
                        torch.ones(4).add_(1)
            with tsp.schedule(steps=[3]), tsp.contents("cuda", "shapes"):
                with tsp.profile_region("actor", "update", step=3):
                    torch.ones(4).add_(1)
    finally:
        _session.profiler_kwargs.cache_clear()
    about_cuda = [w for w in caught if "cuda" in str(w.message).lower()]
    assert len(about_cuda) == 1, [str(w.message) for w in caught]
    assert issubclass(about_cuda[0].category, tsp.TorchstepProfWarning)  # one class filters them all
    files = trace_files(save_dir)
    assert len(files) == 3
    for path in files:
        trace = load_trace(path)
        assert has_aten_ops(trace) and "actor/update" in range_names(trace)
