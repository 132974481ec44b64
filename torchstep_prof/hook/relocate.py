"""Gather other tools' trace files into ``save_path`` before the finish hook runs.

An inference engine's own profiler (vLLM, SGLang, ...) writes ``*.pt.trace.json[.gz]`` files into
its own folder. ``on_finish(..., relocate=(dir, ...))`` moves them next to torchstep_prof's traces,
renamed ``relocated_rank<r>-of-<w>_<own name>``, so one flat folder holds everything to ship.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
from typing import Iterable, Union

from ..naming import TRACE_SUFFIXES, with_part
from ..writing.temp_files import link_exclusively, remove
from .process import warn_hook as _warn

__all__ = ["relocate_traces", "relocated_name"]

_STAGING_PREFIX = ".torchstep_prof-relocating-"

_log = logging.getLogger(__name__)

PathText = Union[str, "os.PathLike[str]"]


def relocated_name(name: str, rank: int, world_size: int) -> str:
    """The name a file called ``name`` gets in ``save_path`` (before any ``_part<i>``) when it is
    relocated from ``rank`` of ``world_size``.

    >>> relocated_name("worker.pt.trace.json.gz", 1, 4)
    'relocated_rank1-of-4_worker.pt.trace.json.gz'
    """
    return f"relocated_rank{rank}-of-{world_size}_{name}"


def relocate_traces(dirs: Iterable[PathText], save_path: PathText, rank: int, world_size: int) -> tuple[str, ...]:
    """Move the ``*.json`` / ``*.json.gz`` files at the top level of each of ``dirs`` into
    ``save_path`` and return their new paths.

    Each file is renamed ``relocated_rank<r>-of-<w>_<its own name>``; a name already taken gets
    ``_part<i>`` instead of overwriting anything. Other files and sub-folders stay where they are.
    A missing folder, or a file that cannot be moved, is a ``FinishHookWarning``, never an
    exception. Moves work across filesystems, and a file appears in ``save_path`` whole or not
    at all.

    >>> relocate_traces(["/tmp/vllm_traces"], "outputs/profile", 0, 2)  # doctest: +SKIP
    ('outputs/profile/relocated_rank0-of-2_host.123.pt.trace.json.gz',)
    """
    save_path = os.fspath(save_path)
    os.makedirs(save_path, exist_ok=True)
    moved: list[str] = []
    for folder in (os.fspath(d) for d in dirs):
        if not os.path.isdir(folder):
            _warn(f"relocate: {folder!r} is not a directory; nothing moved from it")
            continue
        if os.path.samefile(folder, save_path):
            # Relocating save_path into itself would rename this run's own traces.
            _warn(f"relocate: {folder!r} is save_path itself; skipped")
            continue
        for source in _trace_files(folder):
            name = relocated_name(os.path.basename(source), rank, world_size)
            try:
                moved.append(_move_without_overwrite(source, save_path, name))
            except OSError as exc:
                _warn(f"relocate: could not move {source!r} into {save_path!r}: {exc}")
    if moved:
        _log.info("relocated %d trace file(s) into %s", len(moved), save_path)
    return tuple(moved)


def _trace_files(folder: str) -> list[str]:
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        _warn(f"relocate: cannot list {folder!r}: {exc}")
        return []
    return sorted(
        entry.path for entry in entries if entry.name.endswith(TRACE_SUFFIXES) and entry.is_file(follow_symlinks=False)
    )


def _move_without_overwrite(source: str, save_path: str, name: str) -> str:
    try:
        return _claim_name(source, save_path, name)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    # Another filesystem: copy under a hidden name beside the target first, so the final name
    # only ever points at a complete file, then remove the source.
    staged = os.path.join(save_path, f"{_STAGING_PREFIX}{os.getpid()}-{name}")
    try:
        shutil.copy2(source, staged)
        target = _claim_name(staged, save_path, name)
    except BaseException:
        remove(staged)
        raise
    os.unlink(source)
    return target


def _claim_name(staged: str, save_path: str, name: str) -> str:
    """Give ``staged`` (on the same filesystem as ``save_path``) the first free name among
    ``name``, ``name`` + ``_part1``, ...; the check and the claim are one atomic step."""
    for part in itertools.count():
        target = os.path.join(save_path, with_part(name, part))
        if link_exclusively(staged, target):
            if os.path.lexists(staged):  # its other name, after a hard link (a rename moved it)
                os.unlink(staged)
            return target
    raise AssertionError("unreachable")  # pragma: no cover
