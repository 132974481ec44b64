"""CUDA memory snapshots on disk: pickled next to their trace, named like it, size-capped.

A trace ``<name>.json`` (or ``.json.gz``) recorded with ``contents("memory_snapshot")`` gets
``<name>.memory_snapshot.pickle`` beside it: the allocator snapshot PyTorch's memory viz opens
(https://pytorch.org/memory_viz), as ``torch.cuda.memory._dump_snapshot`` would write it. It is
pickled on the writer thread into a hidden temporary, then linked to its name (never replacing a
file); one over :data:`MAX_SNAPSHOT_BYTES` is not kept.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Optional

from .temp_files import remove

__all__ = ["MAX_SNAPSHOT_BYTES", "SNAPSHOT_SUFFIX", "snapshot_path", "write_snapshot"]

SNAPSHOT_SUFFIX = ".memory_snapshot.pickle"
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
"""A snapshot bigger than this is dropped (with the reason in the summary's warnings)."""


def snapshot_path(trace_path: str) -> str:
    """Where the snapshot of the trace at ``trace_path`` goes.

    >>> snapshot_path("out/actor_update_step3_rank0-of-1_pid7_20260101000000000.json.gz")
    'out/actor_update_step3_rank0-of-1_pid7_20260101000000000.memory_snapshot.pickle'
    """
    for suffix in (".json.gz", ".json"):
        if trace_path.endswith(suffix):
            return trace_path[: -len(suffix)] + SNAPSHOT_SUFFIX
    return trace_path + SNAPSHOT_SUFFIX


def write_snapshot(snapshot: dict[str, Any], temporary: str, trace_path: str) -> tuple[Optional[str], Optional[str]]:
    """Pickle ``snapshot`` to ``temporary``, then link it next to ``trace_path``.

    Returns ``(path, None)`` once written, ``(None, why)`` when it is not (too big, the name is
    taken, the disk is full); the temporary never stays.
    """
    target = snapshot_path(trace_path)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
            size = f.tell()
        if size > MAX_SNAPSHOT_BYTES:
            return None, (
                f"the memory snapshot of {trace_path} is {size / 2**20:.0f} MiB, over the "
                f"{MAX_SNAPSHOT_BYTES / 2**20:.0f} MiB limit: not kept"
            )
        try:
            os.link(temporary, target)
        except FileExistsError:
            return None, f"{target} exists already: the memory snapshot of {trace_path} is not kept"
        return target, None
    except OSError as exc:
        return None, f"cannot write the memory snapshot of {trace_path}: {exc.strerror or exc}"
    finally:
        remove(temporary)
