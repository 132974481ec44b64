"""GPU time per region (kernel time inside the region's span) in summarize, the report and the
exit summary, on real traces given kernel events as Kineto writes them (no GPU needed)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from trace_factory import add_kernels, write_trace

from torchstep_prof.cli import main
from torchstep_prof.summary.exit_table import print_summary
from torchstep_prof.summary.records import ProfilingRecords, TraceRecord
from torchstep_prof.traces.reading.files import scan_traces
from torchstep_prof.traces.report.content import build_report
from torchstep_prof.traces.report.page import render_page


def _summarize_json(capsys: pytest.CaptureFixture, folder: Path) -> dict:
    assert main(["summarize", str(folder), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def gpu_folder(tmp_path: Path) -> Path:
    """Rank 0: kernels on two streams, overlapping, one starting before the span and one
    running past its end; rank 1: no kernels at all (a CPU-only trace)."""
    folder = tmp_path / "traces"
    written = write_trace(folder, rank=0, world_size=2, sleep_s=0.02)
    span_us = add_kernels(
        written.path,
        (
            (-50.0, 150.0, 7),  # 100 µs inside the span
            (1000.0, 2000.0, 7),  # 1000..3000
            (2500.0, 1000.0, 8),  # 2500..3500 on another stream: 500 µs more, not 1000
            (5000.0, 400.0, 7),
        ),
    )
    add_kernels(written.path, ((span_us - 100.0, 10_000.0, 7),))  # 100 µs before the end count
    write_trace(folder, rank=1, world_size=2, sleep_s=0.02)
    return folder


EXPECTED_MS = (100 + 2500 + 400 + 100) / 1000.0


def test_summarize_json_gives_kernel_time_inside_the_span(gpu_folder, capsys) -> None:
    doc = _summarize_json(capsys, gpu_folder)
    [group] = doc["groups"]
    ranks = {r["rank"]: r for r in group["ranks"]}
    assert ranks[0]["gpu_ms"] == pytest.approx(EXPECTED_MS, abs=0.002)
    assert ranks[0]["gpu_ms"] < ranks[0]["wall_ms"]
    assert ranks[1]["gpu_ms"] is None  # no kernels: no GPU time, not zero


def test_summarize_table_shows_a_gpu_column_only_with_kernels(gpu_folder, tmp_path, capsys) -> None:
    assert main(["summarize", str(gpu_folder)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "wall ms" in line)
    assert "gpu ms" in header.split("wall ms")[1]  # beside the wall time
    row = next(line for line in out.splitlines() if line.split()[:1] == ["actor/update"])
    assert f"{EXPECTED_MS:.1f}" in row.split()
    plain = tmp_path / "plain"
    write_trace(plain)
    assert main(["summarize", str(plain)]) == 0
    assert "gpu ms" not in capsys.readouterr().out


def test_report_puts_the_gpu_time_beside_the_wall_time(gpu_folder) -> None:
    report = build_report(str(gpu_folder), *scan_traces(gpu_folder, top=10))
    page = render_page(report, plotlyjs="")
    assert f"GPU (kernels inside the region) median {EXPECTED_MS:.1f} ms" in page


def test_exit_summary_has_a_gpu_column_for_traces_with_kernels() -> None:
    def trace(step: int, gpu_ms: float | None) -> TraceRecord:
        return TraceRecord(
            role="actor", stage="update", step=step, rank=0, world_size=1, discrete=True,
            path=f"out/actor_update_step{step}.json", wall_s=0.0123, size_bytes=2048, gpu_ms=gpu_ms,
        )  # fmt: skip

    buffer = io.StringIO()
    print_summary(ProfilingRecords(traces=(trace(1, 7.25), trace(2, None))), Console(file=buffer, width=200))
    lines = buffer.getvalue().splitlines()
    header = next(line for line in lines if "wall ms" in line)
    assert header.split().index("gpu") == header.split().index("ms") + 1  # "wall ms  gpu ms"
    assert "7.2" in next(line for line in lines if " 1 " in line and "12.3" in line).split()
    buffer = io.StringIO()
    print_summary(ProfilingRecords(traces=(trace(1, None),)), Console(file=buffer, width=200))
    assert "gpu ms" not in buffer.getvalue()


def test_a_written_cpu_trace_records_no_gpu_time(tmp_path) -> None:
    import torch

    import torchstep_prof as tsp

    with tsp.configure(save_path=str(tmp_path), summary=False), tsp.contents("cpu"), tsp.schedule(steps=[1]):
        with tsp.step(1), tsp.profile_region("actor", "update"):
            torch.ones(8) * 2
    tsp.flush()
    [record] = tsp.records().traces
    assert record.ok and record.gpu_ms is None
