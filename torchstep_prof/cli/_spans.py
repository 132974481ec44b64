"""What ``report`` and ``merge`` share about the job's span files: ``--spans``, and the ledger read from them.

The folder is found by one rule (:func:`~torchstep_prof.traces.analysis.span_clocks.find_span_folder`);
none found means the command works as without span files."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Optional, Sequence, Union

from . import _tracedir
from ..rendering import safe_text

if TYPE_CHECKING:
    from ..timeline.ledger import Ledger
    from ..traces.reading.files import TraceInfo


def add_spans_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spans",
        metavar="SPANDIR",
        help="the job's span files (tsp.spans) for one clock across processes "
        "(default: DIR when it holds spans-*.jsonl files, else DIR/spans)",
    )


def load_ledger(args: argparse.Namespace) -> Union[tuple[str, "Ledger"], None, int]:
    """The span folder and its ledger; None when there is no span folder; an exit code when
    ``--spans`` names no folder."""
    from ..timeline.ledger import build_ledger
    from ..timeline.reading import read_span_folder
    from ..traces.analysis.span_clocks import find_span_folder
    from ..traces.analysis.timeline_section import with_table_labels

    explicit: Optional[str] = args.spans
    if explicit is not None and not os.path.isdir(explicit):
        _tracedir.error(f"--spans {explicit}: not a folder")
        return _tracedir.EXIT_USAGE
    folder = find_span_folder(args.directory, explicit)
    if folder is None:
        return None
    spans = read_span_folder(folder)
    if spans.note is not None:
        print(safe_text(f"note: {spans.note}"), file=sys.stderr)
    ledger = build_ledger(with_table_labels(spans))  # the page's names for regions
    if not ledger.processes:
        print(f"note: no usable span file in {safe_text(folder)}: clocks not aligned", file=sys.stderr)
    return folder, ledger


def warn_if_foreign(spans: tuple[str, "Ledger"], infos: Sequence["TraceInfo"]) -> Optional[str]:
    """Say on stderr when no trace of ``infos`` was written by a process of the span files (they
    are another job's); the warning, for the page, or None."""
    from ..traces.analysis.span_clocks import foreign_span_files

    folder, ledger = spans
    warning = foreign_span_files(folder, ledger.processes, ((info.pid, info.rank) for info in infos))
    if warning is not None:
        print(f"warning: {safe_text(warning)}", file=sys.stderr)
    return warning
