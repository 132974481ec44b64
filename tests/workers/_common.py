"""Shared by the worker scripts of tests/test_distributed.py (run as plain scripts, not tests)."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

PROBE = Path(__file__).resolve().parent / "hook_probe.py"

# Every torch.distributed entry point that talks to other ranks. The workers call the saved
# originals; the toolkit, if it ever called one, would go through a counting wrapper.
_COLLECTIVES = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "irecv", "isend", "monitored_barrier", "new_group", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
)  # fmt: skip

ORIGINAL: dict[str, Callable[..., Any]] = {}
calls_from_elsewhere: list[str] = []


def init_group(timeout_s: float = 60.0) -> tuple[int, int]:
    """A gloo group from the ``env://`` variables; returns (rank, world size)."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    _count_collectives()
    return dist.get_rank(), dist.get_world_size()


def _count_collectives() -> None:
    from torch.distributed import distributed_c10d

    for name in _COLLECTIVES:
        original = getattr(distributed_c10d, name, None)
        if original is None:
            continue
        ORIGINAL[name] = original

        def counting(*args: Any, __name: str = name, __original: Any = original, **kwargs: Any) -> Any:
            calls_from_elsewhere.append(__name)
            return __original(*args, **kwargs)

        for module in (dist, distributed_c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, counting)


def all_reduce(tensor: Any, group: Any = None) -> None:
    """The worker's own collective (not counted), on ``group`` (the default group if None)."""
    ORIGINAL["all_reduce"](tensor, group=group)


def new_group(timeout_s: float) -> Any:
    """The worker's own group of every rank, with a collective timeout of its own (not counted)."""
    return ORIGINAL["new_group"](timeout=datetime.timedelta(seconds=timeout_s), backend="gloo")


def hook_command(folder: Path, *, shell: bool = True) -> Any:
    """The finish hook used by the workers: ``hook_probe.py <folder>`` (see that script).

    Paths are the test's own, quoted; labels never appear in the command."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(PROBE), str(folder)]
    return shlex.join(argv) if shell else argv


def write_result(out: Path, rank: int, result: dict[str, Any]) -> None:
    import torchstep_prof as tsp

    result = dict(result, rank=rank, pid=os.getpid(), toolkit_collectives=list(calls_from_elsewhere))
    result["traces"] = [t.path for t in tsp.records().traces if t.path is not None]
    result["trace_errors"] = [t.error for t in tsp.records().traces if t.error is not None]
    temporary = out / f".result_rank{rank}.json.tmp"
    temporary.write_text(json.dumps(result, indent=1))
    os.replace(temporary, out / f"result_rank{rank}.json")
