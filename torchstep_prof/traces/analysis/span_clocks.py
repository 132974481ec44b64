"""The job's span files beside its traces: where they are, and each trace's process clock from them.

``report`` and ``merge`` read the span log of the job whose traces they show (docs/timeline.md):
the folder is ``--spans SPANDIR`` when given, else ``DIR`` itself when it holds span files, else
``DIR/spans`` when that does (:func:`find_span_folder`). A trace's process is the span file's of
the same pid and rank (a span file without a rank counts as rank 0, as an untraced world of one
does): trace files name no host, and pid and rank together tell the processes of a job apart
unless two hosts reuse both, which is then said ("ambiguous") and not aligned.

>>> clocks = JobClocks(folder="spans", reference=None, processes=())
>>> clocks.clock_of(pid=7, rank=0).aligned, clocks.clock_of(pid=7, rank=0).reason
(False, 'no span file of pid 7 rank 0')
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Optional, Sequence

import attrs

from ...timeline.ledger import ProcessInfo
from ...timeline.span_log import FILE_PREFIX, FILE_SUFFIX

__all__ = [
    "SPAN_SUBFOLDER",
    "JobClocks",
    "TraceClock",
    "describe_clocks",
    "find_span_folder",
    "foreign_span_files",
    "holds_span_files",
]

SPAN_SUBFOLDER = "spans"
"""The subfolder of a trace folder looked in for span files when the folder holds none."""


def find_span_folder(directory: str, explicit: Optional[str] = None) -> Optional[str]:
    """The span folder for the traces of ``directory``: ``explicit`` when given, else the first
    of ``directory`` and ``directory/spans`` that holds a ``spans-*.jsonl`` file; None if neither."""
    if explicit is not None:
        return explicit
    for folder in (directory, os.path.join(directory, SPAN_SUBFOLDER)):
        if holds_span_files(folder):
            return folder
    return None


def holds_span_files(folder: str) -> bool:
    """Whether ``folder`` holds a ``spans-*.jsonl`` file (by name: none is opened)."""
    try:
        with os.scandir(folder) as entries:
            return any(e.name.startswith(FILE_PREFIX) and e.name.endswith(FILE_SUFFIX) for e in entries)
    except OSError:
        return False


@attrs.frozen(kw_only=True)
class TraceClock:
    """How far one trace's process clock is off the job's reference clock.

    ``aligned``: the offset is known within ``bound_s`` (its clock minus the reference's);
    otherwise the trace keeps its own clock and ``reason`` says why.
    """

    aligned: bool
    offset_s: float = 0.0
    bound_s: Optional[float] = None
    process: Optional[str] = None  # the span process's name, as the timeline names it
    host: Optional[str] = None
    reason: str = ""

    def to_dict(self) -> dict[str, object]:
        """As trace metadata: ``offset_s``, ``bound_s`` and the process when aligned, else why not."""
        if self.aligned:
            return {
                "aligned": True,
                "offset_s": round(self.offset_s, 9),
                "bound_s": round(self.bound_s or 0.0, 9),
                "process": self.process,
                "host": self.host,
            }
        return {"aligned": False, "reason": f"not aligned: {self.reason}", "process": self.process, "host": self.host}


@attrs.frozen(kw_only=True)
class JobClocks:
    """Every span process's clock (the ledger's estimate), looked up by a trace's pid and rank."""

    folder: str
    reference: Optional[str]
    processes: tuple[ProcessInfo, ...]

    def clock_of(self, *, pid: Optional[int], rank: int) -> TraceClock:
        """The clock of the process that wrote a trace of ``pid`` and ``rank``."""
        if pid is None:
            return TraceClock(aligned=False, reason="the trace names no pid")
        found = [p for p in self.processes if _same_process(p, pid, rank)]
        if not found:
            return TraceClock(aligned=False, reason=f"no span file of pid {pid} rank {rank}")
        if len(found) > 1:
            hosts = ", ".join(sorted(p.host for p in found))
            return TraceClock(
                aligned=False, reason=f"ambiguous: {len(found)} span files of pid {pid} rank {rank} (hosts {hosts})"
            )
        (p,) = found
        if not math.isfinite(p.bound_s):
            return TraceClock(
                aligned=False,
                process=p.name,
                host=p.host,
                reason=f"no clock anchor links {p.name} to {self.reference}",
            )
        return TraceClock(aligned=True, offset_s=p.offset_s, bound_s=p.bound_s, process=p.name, host=p.host)

    def to_dict(self) -> dict[str, object]:
        return {"spans": self.folder, "reference": self.reference}


def describe_clocks(clocks: Sequence[TraceClock], folder: str) -> str:
    """One line: how many traces were moved onto the job's clock, within what, and why not the rest.

    >>> describe_clocks([TraceClock(aligned=True, bound_s=0.0002), TraceClock(aligned=False, reason="why")], "spans")
    'clocks from spans: 1 of 2 trace(s) aligned (offsets right within 0.200 ms); not aligned: why'
    """
    aligned = [c for c in clocks if c.aligned]
    text = f"clocks from {folder}: {len(aligned)} of {len(clocks)} trace(s) aligned"
    if aligned:
        worst = max(c.bound_s or 0.0 for c in aligned)
        text += f" (offsets right within {worst * 1000:.3f} ms)"
    reasons = sorted({c.reason for c in clocks if not c.aligned})
    if reasons:
        text += (
            "; not aligned: " + "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
        )
    return text


def _same_process(process: ProcessInfo, pid: Optional[int], rank: int) -> bool:
    """Whether a span file's process wrote a trace of ``pid`` and ``rank`` (the one rule)."""
    return process.pid == pid and (process.rank if process.rank is not None else 0) == rank


def foreign_span_files(
    folder: str, processes: Sequence[ProcessInfo], traces: Iterable[tuple[Optional[int], int]]
) -> Optional[str]:
    """What to warn when no trace's process (``traces``: each trace's pid and rank) is among the
    span files' ``processes``: they are another job's, and their clocks and Gantt are not these
    traces'. None when one is, or when there is no span process or no trace to compare.

    >>> from types import SimpleNamespace
    >>> p = SimpleNamespace(pid=7, rank=0)  # a ProcessInfo's pid and rank
    >>> foreign_span_files("spans", [p], [(8, 0)])
    "the span files in spans are of another job: no trace's process is in them (the traces' pids: 8; the span files': 7)"
    >>> foreign_span_files("spans", [p], [(7, 0), (8, 0)]) is None
    True
    """
    wanted = sorted(set(traces), key=lambda t: (t[0] is None, t[0] or 0, t[1]))
    if not processes or not wanted:
        return None
    if any(_same_process(p, pid, rank) for p in processes for pid, rank in wanted):
        return None
    return (
        f"the span files in {folder} are of another job: no trace's process is in them "
        f"(the traces' pids: {_pids(pid for pid, _ in wanted)}; the span files': {_pids(p.pid for p in processes)})"
    )


def _pids(pids: Iterable[Optional[int]], most: int = 6) -> str:
    known = sorted({pid for pid in pids if pid is not None})
    text = ", ".join(map(str, known[:most])) or "none named"
    return text + (f" and {len(known) - most} more" if len(known) > most else "")
