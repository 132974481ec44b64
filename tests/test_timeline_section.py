"""``summarize``'s timeline section: its regions named as its table names them, its heading.

Real traces (trace_factory) beside hand-written span files of the same job's shape: two ranks,
each running ``ref/compute_log_prob`` (rank 1's 0.3 s slower) then ``actor/update``, per step.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from trace_factory import write_trace

from torchstep_prof.cli import main
from torchstep_prof.traces.analysis.timeline_section import find_timeline, render_timeline


def _span_files(folder: Path, steps: int) -> None:
    """Span files as ``tsp.spans`` writes them: rank 1's ref 0.3 s slower, both on one host."""
    for rank in (0, 1):
        spans, blocks = [], []
        for n in range(steps):
            t = 1000.0 + 2 * n
            ref_end = t + 0.1 + (0.3 if rank == 1 else 0.0)
            spans += [["ref", "compute_log_prob", t, ref_end], ["actor", "update", t + 0.45, t + 0.5]]
            blocks.append([n, t, t + 0.5])
        lines = [
            {"kind": "process", "format": 1, "host": "node", "pid": 100 + rank, "rank": rank, "world_size": 2,
             "local_rank": rank, "process_role": None, "start": 999.0},
            {"kind": "batch", "thread": "MainThread", "rank": rank, "spans": spans, "steps": blocks},
            {"kind": "end", "at": 1100.0},
        ]  # fmt: skip
        (folder / f"spans-node-{100 + rank}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def _cli(capsys, *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_summarize_names_regions_in_its_timeline_section_as_its_table_does(tmp_path, capsys):
    for rank in (0, 1):
        write_trace(tmp_path, role="ref", stage="compute_log_prob", rank=rank, world_size=2)
    _span_files(tmp_path, steps=3)
    code, out, _ = _cli(capsys, "summarize", tmp_path)
    assert code == 0
    table, section = out.split("Timeline, each step across 2 processes", 1)
    assert "ref/compute-log-prob" in table  # the trace name's label
    verdicts = [line for line in section.splitlines() if line.strip().startswith("step ")]
    assert len(verdicts) == 3
    assert all("ref/compute-log-prob" in v for v in verdicts[1:]), verdicts
    assert "compute_log_prob" not in out
    code, out, _ = _cli(capsys, "summarize", tmp_path, "--json")
    busy = [r for s in json.loads(out)["timeline"]["steps"] for p in s["processes"] for r, _ in p["busy_by_region"]]
    assert set(busy) == {"ref/compute-log-prob", "actor/update"}
    # `timeline` prints the span log as it is, its labels included (docs/timeline.md).
    code, out, _ = _cli(capsys, "timeline", tmp_path)
    assert code == 0 and "ref/compute_log_prob" in out and "compute-log-prob" not in out


@pytest.mark.parametrize("width", [30, 45, 60, 80, 84, 100, 140])
def test_the_heading_wraps_at_the_width_but_never_inside_the_command(tmp_path, width):
    _span_files(tmp_path, steps=7)
    section = find_timeline(str(tmp_path))
    assert section is not None
    buffer = io.StringIO()
    render_timeline(section, Console(file=buffer, width=width, color_system=None))
    lines = buffer.getvalue().splitlines()
    heading = lines[: next(i for i, line in enumerate(lines) if line.startswith("  step "))]
    whole = (
        "Timeline, each step across 2 processes (from the span files; the 5 slowest of 7 steps; "
        "torchstep-prof timeline DIR for detail):"
    )
    assert " ".join(heading) == whole
    assert (len(heading) == 1) == (width >= len(whole))
    assert all(len(line) <= width for line in heading), heading
    assert any("torchstep-prof timeline DIR" in line for line in heading), heading
