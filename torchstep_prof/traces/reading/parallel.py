"""Reading a large folder fast: several processes, and the per-file summary cache.

:func:`scan_paths` is :func:`~torchstep_prof.traces.reading.files.scan_traces` for the command line: the
files the cache (:mod:`~torchstep_prof.traces.reading.cache`) still describes are not opened, the others
are read by ``jobs`` processes (each holds one file at a time, so memory stays bounded by the
largest file times ``jobs``; only descriptions come back), and the cache is updated.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Optional, Sequence, Union

from .cache import SummaryCache
from .files import TraceFilter, TraceInfo, Unreadable, read_or_skip, trace_sort_key, wanted_by_name

__all__ = ["PARALLEL_MIN_FILES", "default_jobs", "scan_paths"]

PARALLEL_MIN_FILES = 32
"""Fewer files than this to read are read in this process: starting workers costs more."""


def default_jobs() -> int:
    """The CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _read_batch(args: tuple[Sequence[str], int]) -> list[Union[TraceInfo, Unreadable]]:
    paths, top = args
    return [read_or_skip(path, top) for path in paths]


def scan_paths(
    paths: Sequence[str],
    filters: Optional[TraceFilter] = None,
    *,
    top: int = 0,
    jobs: int = 1,
    cache: Optional[SummaryCache] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> tuple[list[TraceInfo], list[Unreadable]]:
    """The traces among ``paths`` that pass ``filters`` and the files skipped, as
    :func:`~torchstep_prof.traces.reading.files.scan_traces` returns them; ``cache`` (saved at the end)
    answers for unchanged files, ``jobs`` processes read the rest.

    >>> cache = SummaryCache.for_folder("outputs/profile")                  # doctest: +SKIP
    >>> infos, skipped = scan_paths(find_trace_files("outputs/profile"), jobs=4, cache=cache)  # doctest: +SKIP
    """
    filters = filters or TraceFilter()
    # No filter: no name to parse (a date parse per file costs a second over 20,000 files).
    wanted = list(paths) if filters == TraceFilter() else [p for p in paths if wanted_by_name(p, filters)]
    results: dict[str, Union[TraceInfo, Unreadable]] = {}
    to_read = []
    for path in wanted:
        found = cache.get(path, top) if cache is not None else None
        if found is None:
            to_read.append(path)
        else:
            results[path] = found
    done = len(paths) - len(to_read)
    if progress is not None and done:
        progress(done, len(paths))
    for path, result in _read_all(to_read, top, jobs):
        results[path] = result
        if cache is not None:
            cache.put(path, result, top)
        done += 1
        if progress is not None:
            progress(done, len(paths))
    if cache is not None:
        cache.save()
    infos = [r for r in results.values() if isinstance(r, TraceInfo) and filters.matches(r)]
    unreadable = [r for p in wanted if isinstance(r := results[p], Unreadable)]
    infos.sort(key=trace_sort_key)
    return infos, unreadable


def _read_all(paths: Sequence[str], top: int, jobs: int):
    if jobs <= 1 or len(paths) < PARALLEL_MIN_FILES:
        for path in paths:
            yield path, read_or_skip(path, top)
        return
    # Batches of a few files: one message per batch, results in order for the progress bar.
    size = max(1, min(64, len(paths) // (jobs * 8)))
    batches = [paths[i : i + size] for i in range(0, len(paths), size)]
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    context = multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        for batch, found in zip(batches, pool.map(_read_batch, [(b, top) for b in batches])):
            yield from zip(batch, found)
