"""Reading the traces torchstep_prof wrote, as a user (or Perfetto, or HTA) would.

``tests/trace_factory.py`` *writes* synthetic traces for the CLI tests; this module only reads
real ones: load a ``.json`` / ``.json.gz`` file, list its range names, find events, and check
every promise docs/trace-files.md makes about a trace file in one place (``check_trace_file``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from torchstep_prof import build_trace_name, parse_trace_name
from torchstep_prof.naming import TRACE_NAME_PATTERN

Trace = dict[str, Any]
Event = dict[str, Any]

# Range markers: torch's record_function writes ``user_annotation``, the fast private marker
# ``cpu_op`` (the same category as aten ops, which is why ranges are found by name).
RANGE_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
_PROFILER_STEP = re.compile(r"ProfilerStep#(\d+)$")


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """The parsed JSON of a trace file (gzip-compressed when its name ends in ``.gz``)."""
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def trace_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Every trace file directly in ``folder`` (sorted by name); ``[]`` if it does not exist."""
    folder = Path(folder)
    if not folder.exists():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))


def everything_under(folder: str | os.PathLike[str]) -> list[Path]:
    """Every file and folder below ``folder``, hidden ones included (partial-file checks)."""
    folder = Path(folder)
    return sorted(folder.rglob("*")) if folder.exists() else []


def events(trace: Trace, predicate: Optional[Callable[[Event], bool]] = None) -> list[Event]:
    found = trace.get("traceEvents", [])
    return [e for e in found if predicate is None or predicate(e)]


def find_events(trace: Trace, *, name: Optional[str] = None, cat: Optional[str] = None) -> list[Event]:
    """Events with this exact ``name`` and/or ``cat``."""
    return events(
        trace,
        lambda e: (name is None or e.get("name") == name) and (cat is None or e.get("cat") == cat),
    )


def ranges(trace: Trace) -> list[Event]:
    """Complete (``ph == "X"``) CPU-side events: ops and range markers."""
    return events(trace, lambda e: e.get("ph") == "X" and e.get("cat") in RANGE_CATEGORIES)


def range_names(trace: Trace) -> list[str]:
    """Names of the range markers (``role/stage``, ``ProfilerStep#n``), aten ops left out."""
    return [e["name"] for e in ranges(trace) if not e["name"].startswith("aten::")]


def find_range(trace: Trace, name: str) -> Event:
    """The one range called ``name``; fails when there is none or more than one."""
    found = [e for e in ranges(trace) if e["name"] == name]
    assert len(found) == 1, f"expected one range {name!r}, found {len(found)}; ranges: {range_names(trace)}"
    return found[0]


def profiler_steps(trace: Trace) -> list[Event]:
    """Every ``ProfilerStep#<n>`` row, whatever its category."""
    return events(trace, lambda e: _PROFILER_STEP.match(str(e.get("name", ""))) is not None)


def span_us(trace: Trace, event: Event) -> tuple[float, float]:
    """``(start, end)`` of an event in epoch microseconds (``ts`` is relative to
    ``baseTimeNanoseconds``), so spans from different files can be compared."""
    start = float(event["ts"]) + trace.get("baseTimeNanoseconds", 0) / 1000.0
    return start, start + float(event.get("dur", 0))


def contains(outer: tuple[float, float], inner: tuple[float, float], slack_us: float = 1.0) -> bool:
    """Whether span ``inner`` lies within ``outer`` (a microsecond of rounding allowed)."""
    return outer[0] - slack_us <= inner[0] and inner[1] <= outer[1] + slack_us


def by_step(paths: Iterable[Path]) -> dict[int, list[Path]]:
    """Trace files grouped by the step their name carries."""
    grouped: dict[int, list[Path]] = {}
    for path in paths:
        grouped.setdefault(parse_trace_name(path).step, []).append(path)
    return grouped


def steps_written(folder: str | os.PathLike[str]) -> list[int]:
    """The step numbers of the traces in ``folder``, sorted, repeats kept."""
    return sorted(parse_trace_name(p).step for p in trace_files(folder))


def check_trace_file(path: str | os.PathLike[str]) -> Trace:
    """Fail unless ``path`` is a trace file as docs/trace-files.md describes it; return its JSON.

    - the name matches the grammar and round-trips through ``parse_trace_name``;
    - it loads as (gzip) JSON, a Chrome trace with ``traceEvents``;
    - ``distributedInfo`` holds the rank and world size of the name;
    - the top-level ``torchstep_prof`` object repeats role, stage, step, rank and world size, and
      holds ``discrete`` and the ``occurrence`` (from 1);
    - exactly one ``ProfilerStep#<n>`` row, ``n`` the step of the name;
    - ``traceName`` is the file's own absolute path.
    """
    path = Path(path)
    assert re.fullmatch(TRACE_NAME_PATTERN, path.name), f"{path.name!r} does not match the name grammar"
    name = parse_trace_name(path)
    assert build_trace_name(name) == path.name, "parse_trace_name/build_trace_name do not round-trip"
    assert name.gzip == path.name.endswith(".gz")
    trace = load_trace(path)
    assert isinstance(trace.get("traceEvents"), list), f"{path.name}: no traceEvents"
    info = trace.get("distributedInfo")
    assert isinstance(info, dict), f"{path.name}: no distributedInfo"
    assert (info.get("rank"), info.get("world_size")) == (name.rank, name.world_size), info
    meta = trace.get("torchstep_prof")
    assert isinstance(meta, dict), f"{path.name}: no top-level torchstep_prof object"
    assert {k: meta.get(k) for k in ("role", "stage", "step", "rank", "world_size")} == {
        "role": name.role,
        "stage": name.stage,
        "step": name.step,
        "rank": name.rank,
        "world_size": name.world_size,
    }, meta
    assert isinstance(meta.get("discrete"), bool), meta
    assert meta.get("pid") == name.pid, f"{path.name}: metadata pid {meta.get('pid')!r}"
    occurrence = meta.get("occurrence")
    assert isinstance(occurrence, int) and occurrence >= 1, f"{path.name}: occurrence {occurrence!r}"
    step_rows = [e["name"] for e in profiler_steps(trace)]
    assert step_rows == [f"ProfilerStep#{name.step}"], f"{path.name}: ProfilerStep rows {step_rows}"
    trace_name = trace.get("traceName")
    assert isinstance(trace_name, str) and os.path.isabs(trace_name), f"{path.name}: traceName {trace_name!r}"
    assert os.path.realpath(trace_name) == os.path.realpath(path), f"{path.name}: traceName {trace_name!r}"
    return trace


def owner_range_name(path: str | os.PathLike[str], trace: Trace) -> Optional[str]:
    """The raw ``role/stage`` range of a discrete trace's owner (None for a fused trace)."""
    meta = trace["torchstep_prof"]
    if not meta["discrete"]:
        return None
    # File names hold sanitized labels; the owner's range holds the raw ones. Find the range
    # whose sanitized form matches the name.
    name = parse_trace_name(path)
    for candidate in range_names(trace):
        splits = [i for i, ch in enumerate(candidate) if ch == "/"]  # a label may hold "/" too
        for i in splits:
            if _sanitized(candidate[:i]) == name.role and _sanitized(candidate[i + 1 :]) == name.stage:
                return candidate
    return None


def _sanitized(label: str) -> str:
    # As file names write labels: sanitized, and long ones fitted (start kept, hash added).
    from torchstep_prof.naming import fit_label

    cleaned = re.sub(r"[^0-9A-Za-z.=+\-]+", "-", label).strip("-.")
    # Nothing left: the label's code points (docs/trace-files.md), e.g. "___" -> "U+5F+5F+5F".
    return fit_label(cleaned or "U+" + "+".join(f"{ord(ch):X}" for ch in label))
