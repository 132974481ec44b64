"""Real torch.profiler traces shaped like the ones torchstep_prof writes, for tests.

``write_trace`` records a few torch ops, and a ``time.sleep`` that sets the wall time, inside a
``ProfilerStep#<n>`` range and a ``<role>/<stage>`` range (made with torch's fast range marker,
as the engine makes it), adds the ``torchstep_prof`` and ``distributedInfo`` metadata, and exports
a Chrome trace under a name built by ``naming.build_trace_name``. The ``write_*`` helpers at the
end make the bad files a folder may also hold.
"""

from __future__ import annotations

import datetime as dt
import gzip as _gzip
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # before the first profiler use in the process

import attrs  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from torchstep_prof.naming import TraceName, build_trace_name, sanitize_label, with_part  # noqa: E402

try:  # the engine marks regions with torch's fast range (cat cpu_op in the trace): do the same
    from torch._C._profiler import _RecordFunctionFast as _region_range
except ImportError:  # pragma: no cover
    _region_range = record_function


@attrs.frozen(kw_only=True)
class WrittenTrace:
    """A trace the factory wrote, and when its ``ProfilerStep`` range started (epoch ns)."""

    path: Path
    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    sleep_s: float
    started_ns: int


def write_trace(
    directory: str | os.PathLike[str],
    *,
    role: str = "actor",
    stage: str = "update",
    step: int = 1,
    rank: int = 0,
    world_size: int = 1,
    sleep_s: float = 0.005,
    gzip: bool = False,
    metadata: bool = True,
    distributed_info: bool = True,
    file_name: str | None = None,
    discrete: bool = True,
    occurrence: int | None = None,
    pid: int | None = None,
    regions: tuple[str, ...] = (),
    mm_s: float = 0.0,
) -> WrittenTrace:
    """Record and export one trace into ``directory``; returns where and when.

    ``metadata=False`` leaves out the ``torchstep_prof`` key (an older file: only its name
    describes it), ``distributed_info=False`` leaves out ``distributedInfo``; ``file_name``
    replaces the built name. ``occurrence`` goes into the metadata (left out when None, as in
    files written before occurrences existed); ``pid`` stands for the writing process in the
    name and metadata (another run). ``regions`` (``"role/stage"``) are nested ranges, as a
    fused trace (``discrete=False``, stage ``train``) holds them. ``mm_s`` adds that many seconds
    of ``aten::mm`` calls (a rank slow in an operator, where ``sleep_s`` is time outside operators).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    x = torch.randn(64, 64)
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    try:
        started = time.time()
        started_ns = time.time_ns()
        with record_function(f"ProfilerStep#{step}"):
            outer = _region_range(f"{role}/{stage}") if discrete else record_function("step")
            with outer:
                for region in regions:
                    with _region_range(region):
                        torch.relu(x).sum()
                y = torch.relu(x @ x).sum()
                time.sleep(sleep_s)
                if mm_s > 0:
                    _busy_mm(mm_s)
                (x + y).mul_(0.5)
        labels = {"role": sanitize_label(role), "stage": sanitize_label(stage)}
        pid = os.getpid() if pid is None else pid
        if metadata:
            meta = dict(labels, step=step, rank=rank, world_size=world_size, discrete=discrete)
            meta["pid"] = pid
            if occurrence is not None:
                meta["occurrence"] = occurrence
            prof.add_metadata_json("torchstep_prof", json.dumps(meta))
        if distributed_info:
            prof.add_metadata_json(
                "distributedInfo", json.dumps({"rank": rank, "world_size": world_size})
            )
    finally:
        prof.stop()
    if file_name is None:
        name = TraceName(
            role=role,
            stage=stage,
            step=step,
            rank=rank,
            world_size=world_size,
            pid=pid,
            timestamp=dt.datetime.fromtimestamp(started, dt.timezone.utc),
            gzip=gzip,
        )
        file_name = build_trace_name(name)
        part = 0
        while (directory / with_part(file_name, part)).exists():
            part += 1
        file_name = with_part(file_name, part)
    path = directory / file_name
    prof.export_chrome_trace(str(path))  # torch gzips itself when the name ends with .gz
    return WrittenTrace(
        path=path,
        role=labels["role"],
        stage=labels["stage"],
        step=step,
        rank=rank,
        world_size=world_size,
        sleep_s=sleep_s,
        started_ns=started_ns,
    )


def add_kernels(path: str | os.PathLike[str], kernels: tuple[tuple[float, float, int], ...]) -> float:
    """Add CUDA kernel events to the plain ``.json`` trace at ``path``, shaped as Kineto writes
    them with CUDA activity (``ph: X``, ``cat: kernel``, a device pid, a stream tid, and the
    step range's ``gpu_user_annotation`` copy spanning them); each of
    ``kernels`` is (start µs after the ``ProfilerStep`` range's start, duration µs, stream).
    Returns the range's duration in µs (the region's span)."""
    path = Path(path)
    trace = json.loads(path.read_text())
    step = next(
        e
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
    )
    for number, (offset, dur, stream) in enumerate(kernels):
        trace["traceEvents"].append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"void gemm_kernel_{number}<float>(float const*, float*)",
                "pid": 0,
                "tid": stream,
                "ts": step["ts"] + offset,
                "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": 1000 + number},
            }
        )
    if kernels:
        # Kineto's copy of the step's range on the GPU timeline, spanning its kernels; it may
        # come first in the file (readers must take the CPU range for the wall time).
        first = min(step["ts"] + offset for offset, _, _ in kernels)
        last = max(step["ts"] + offset + dur for offset, dur, _ in kernels)
        copy = dict(step, cat="gpu_user_annotation", pid=0, tid=kernels[0][2], ts=first, dur=last - first)
        trace["traceEvents"].insert(0, copy)
    path.write_text(json.dumps(trace))
    return float(step["dur"])


def _busy_mm(seconds: float) -> None:
    big = torch.randn(256, 256)
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        torch.mm(big, big)


def write_ranks(
    directory: str | os.PathLike[str],
    *,
    world_size: int = 4,
    steps: tuple[int, ...] = (1,),
    sleep_s: float = 0.005,
    slow: dict[int, float] | None = None,
    **kwargs: Any,
) -> list[WrittenTrace]:
    """One trace per rank and step, as a ``world_size``-rank run would leave them; ``slow`` maps a
    rank to the sleep it takes instead of ``sleep_s``."""
    slow = slow or {}
    return [
        write_trace(
            directory,
            step=step,
            rank=rank,
            world_size=world_size,
            sleep_s=slow.get(rank, sleep_s),
            **kwargs,
        )
        for step in steps
        for rank in range(world_size)
    ]


def write_truncated(directory: str | os.PathLike[str], source: Path, name: str) -> Path:
    """A copy of the real trace ``source`` cut in half (a crash mid-write)."""
    data = _read(source)
    path = Path(directory) / name
    path.write_bytes(data[: len(data) // 2])
    return path


def write_not_json(directory: str | os.PathLike[str], name: str) -> Path:
    path = Path(directory) / name
    path.write_text("this is a log line, not JSON\n")
    return path


def write_foreign(directory: str | os.PathLike[str], name: str) -> Path:
    """Valid JSON that is not a Chrome trace (a config file, say)."""
    path = Path(directory) / name
    path.write_text(json.dumps({"model": "llama", "layers": 32}))
    return path


def write_foreign_trace(directory: str | os.PathLike[str], source: Path, name: str) -> Path:
    """A Chrome trace that is not torchstep_prof's: no metadata, and a name that is not ours."""
    trace = json.loads(_read(source))
    trace.pop("torchstep_prof", None)
    path = Path(directory) / name
    path.write_text(json.dumps(trace))
    return path


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return _gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def assert_summary_shape(doc: Any) -> None:
    """Fail unless ``doc`` has the shape docs/cli.md documents for ``summarize --json``."""
    assert isinstance(doc, dict), doc
    assert {"groups", "findings", "unreadable", "other_runs"} <= doc.keys(), doc
    assert isinstance(doc["findings"], list) and isinstance(doc["other_runs"], list)
    assert isinstance(doc["unreadable"], list)
    assert all(isinstance(path, str) for path in doc["unreadable"])
    assert isinstance(doc["groups"], list)
    for group in doc["groups"]:
        assert isinstance(group["role"], str) and isinstance(group["stage"], str)
        assert _is_int(group["step"]) and _is_int(group["occurrence"]) and group["occurrence"] >= 1
        assert _is_number(group["median_ms"])
        assert group["straggler"] is None or _is_int(group["straggler"])
        assert isinstance(group["ranks"], list) and group["ranks"]
        for rank in group["ranks"]:
            assert _is_int(rank["rank"]) and _is_number(rank["wall_ms"])
            assert rank["pid"] is None or _is_int(rank["pid"])
            assert isinstance(rank["file"], str)
            assert isinstance(rank["top_ops"], list)
            for op in rank["top_ops"]:
                assert isinstance(op["name"], str) and _is_number(op["self_ms"])
    # summarize --json adds findings to summary_to_dict's shape.
    assert isinstance(doc.get("findings", []), list)
    for finding in doc.get("findings", []):
        assert isinstance(finding["role"], str) and isinstance(finding["stage"], str)
        assert all(_is_int(finding[key]) for key in ("step", "occurrence", "rank"))
        assert _is_number(finding["wall_ms"]) and _is_number(finding["median_ms"])
        assert finding["ratio"] is None or _is_number(finding["ratio"])
        for op in finding["ops"]:
            assert isinstance(op["name"], str)
            assert all(_is_number(op[key]) for key in ("self_ms", "median_self_ms", "delta_ms"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def write_bad_files(directory: str | os.PathLike[str], source: Path) -> dict[str, Path]:
    """One real file of each kind a parser may choke on, named by kind; ``source`` is a real
    trace some of them are made from."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    trace = json.loads(_read(source))
    files = {
        "deep": directory / "deep.json",
        "list": directory / "list.json",
        "not_utf8": directory / "latin1.json",
        "bad_gzip": directory / "bad.json.gz",
        "truncated_gzip": directory / "cut.json.gz",
        "empty": directory / "empty.json",
        "events_not_list": directory / "events.json",
    }
    depth = 100_000  # far past Python's recursion limit: json raises RecursionError
    files["deep"].write_text('{"traceEvents": ' + "[" * depth + "]" * depth + "}")
    files["list"].write_text(json.dumps([trace]))
    files["not_utf8"].write_bytes(b'{"traceEvents": [], "name": "caf\xe9"}')
    files["bad_gzip"].write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    files["truncated_gzip"].write_bytes(_gzip.compress(json.dumps(trace).encode())[:200])
    files["empty"].write_bytes(b"")
    files["events_not_list"].write_text(json.dumps(dict(trace, traceEvents={"a": 1})))
    return files


def write_absurd(directory: str | os.PathLike[str], source: Path, **changes: Any) -> Path:
    """A copy of the real trace ``source`` (a trace name, so it is read) whose ``ProfilerStep``
    range and region range get the given ``ts`` / ``dur`` values (1e300, -5, NaN...)."""
    trace = json.loads(_read(source))
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and (
            str(event.get("name", "")).startswith("ProfilerStep#") or "/" in str(event.get("name"))
        ):
            event.update(changes)
    meta = trace["torchstep_prof"]
    name = build_trace_name(
        TraceName(
            role=meta["role"],
            stage="absurd-" + "-".join(sorted(changes)),
            step=meta["step"],
            rank=meta["rank"],
            world_size=meta["world_size"],
            pid=meta.get("pid", 1),
            timestamp=dt.datetime.now(dt.timezone.utc),
        )
    )
    trace["torchstep_prof"] = dict(meta, stage="absurd-" + "-".join(sorted(changes)))
    path = Path(directory) / name
    path.write_text(json.dumps(trace))  # json writes NaN and Infinity as such
    return path
