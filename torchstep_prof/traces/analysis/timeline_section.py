"""The timeline section of ``summarize``: each step's verdict across processes, from the folder's spans.

When the traces of a folder carry spans (every trace torchstep_prof writes does), or the folder
holds span files, ``summarize`` adds the ledger of ``torchstep-prof timeline``
(docs/timeline.md): one verdict line per step, the slowest few when there are many, and the
whole ledger under ``timeline`` in ``--json``. Without spans it adds nothing. Its regions are
named as the table names them (:func:`with_table_labels`), as are the report's Gantt's.

>>> find_timeline("/nonexistent") is None
True
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Collection, Optional

import attrs

if TYPE_CHECKING:
    from rich.console import Console

    from ...timeline.ledger import Ledger
    from ...timeline.reading import SpanFolder

__all__ = [
    "MAX_SUMMARY_VERDICTS",
    "TimelineSection",
    "find_timeline",
    "render_timeline",
    "timeline_to_dict",
    "with_table_labels",
]

MAX_SUMMARY_VERDICTS = 5
"""Verdict lines ``summarize`` prints at most (the slowest steps, in step order)."""
DETAIL_COMMAND = "torchstep-prof timeline DIR"


@attrs.frozen(kw_only=True)
class TimelineSection:
    """The ledger of a folder's spans, where they were read from, and any note about it."""

    folder: str
    ledger: Ledger
    source: str  # "traces" or "span files"
    note: Optional[str] = None


def find_timeline(folder: str, pids: Optional[Collection[int]] = None) -> Optional[TimelineSection]:
    """The timeline of ``folder`` (its span files, else the spans its traces carry), or None
    when nothing there has spans. Reads only each trace's head. ``pids``: the processes whose
    traces are read (``summarize`` reads the newest run of each rank: an older run's steps
    would stretch the same step numbers' windows over both runs)."""
    from ...timeline.ledger import build_ledger
    from ...timeline.sources import read_timeline_folder

    spans = read_timeline_folder(folder)
    if pids is not None and spans.source == "traces":
        spans = attrs.evolve(spans, processes=tuple(p for p in spans.processes if p.pid in pids))
    if not spans.processes:
        return None
    return TimelineSection(
        folder=folder, ledger=build_ledger(with_table_labels(spans)), source=spans.source, note=spans.note
    )


def with_table_labels(spans: SpanFolder) -> SpanFolder:
    """``spans`` with each region's role and stage as trace names and the tables write them
    (``naming.file_label``: ``compute_log_prob`` is ``compute-log-prob``), so that a page that
    shows both names a region one way. ``torchstep-prof timeline`` keeps the span log's labels.

    >>> from torchstep_prof.timeline.reading import SpanFolder
    >>> folder = SpanFolder(processes=(), problems=())
    >>> with_table_labels(folder) == folder
    True
    """
    from ...naming import file_label

    label = functools.lru_cache(maxsize=None)(file_label)
    processes = tuple(
        attrs.evolve(p, spans=tuple(s._replace(role=label(s.role), stage=label(s.stage)) for s in p.spans))
        for p in spans.processes
    )
    return attrs.evolve(spans, processes=processes)


def timeline_to_dict(section: TimelineSection) -> dict[str, Any]:
    """The ``timeline`` key of ``summarize --json``: the ledger as ``timeline --json`` gives it."""
    from ...timeline.output import ledger_to_dict

    return {"source": section.source, "note": section.note, **ledger_to_dict(section.ledger, section.folder)}


def render_timeline(section: TimelineSection, console: Console) -> None:
    """The section's lines: a heading, then the verdict of each step (the slowest few)."""
    import textwrap

    from rich.text import Text

    from ...rendering import print_stripped, safe_text

    steps = section.ledger.steps
    if not steps:
        return
    shown = steps
    heading = f"Timeline, each step across {len(section.ledger.processes)} processes (from the {section.source}"
    if len(steps) > MAX_SUMMARY_VERDICTS:
        slowest = {s.number for s in sorted(steps, key=lambda s: -s.seconds)[:MAX_SUMMARY_VERDICTS]}
        shown = tuple(s for s in steps if s.number in slowest)
        heading += f"; the {MAX_SUMMARY_VERDICTS} slowest of {len(steps)} steps"
    # Wrapped at the console's width, never inside the command: it is meant to be copied.
    glued = DETAIL_COMMAND.replace(" ", "\x00")
    lines = textwrap.wrap(
        f"{safe_text(heading)}; {glued} for detail):",
        width=max(console.width, 20),
        break_long_words=False,
        break_on_hyphens=False,
    )
    for line in lines:
        print_stripped(console, Text(line.replace("\x00", " ")), soft_wrap=True)
    if section.note is not None:
        print_stripped(console, Text("  " + safe_text(f"note: {section.note}")))
    for step in shown:
        print_stripped(console, Text("  " + safe_text(step.verdict)), soft_wrap=True)
