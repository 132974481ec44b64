"""Trace names: a trace's identity, its file name, the exact inverse, and the label rules.

:func:`name_trace` is where a trace is named (the runtime calls nothing else);
:func:`build_trace_name` writes that identity as a file name, :func:`parse_trace_name` reads it
back. A trace is named ``<role>_<stage>_step<n>_rank<r>-of-<w>_pid<p>_<ts>.json`` (``.json.gz`` when
gzipped, ``_part<i>`` before the extension when the name was taken). Labels are sanitized to
``[0-9A-Za-z.=+-]`` so ``_`` only ever separates fields and no name can leave ``save_path``.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from typing import Iterable, Optional

import attrs

__all__ = [
    "FUSED_STAGE",
    "METADATA_KEY",
    "TraceName",
    "build_trace_name",
    "file_label",
    "fit_label",
    "label_text",
    "name_trace",
    "parse_trace_name",
    "range_label",
    "sanitize_label",
    "with_part",
]

_LABEL_CHARS = r"0-9A-Za-z.=+\-"
_NOT_LABEL_RUN = re.compile(rf"[^{_LABEL_CHARS}]+")
_LABEL = rf"[{_LABEL_CHARS}]+"
_TIMESTAMP_DIGITS = 17
_TIMESTAMP_FORMAT = "%Y%m%d%H%M%S"
TRACE_SUFFIXES = (".json", ".json.gz")

_TRACE_NAME = re.compile(
    rf"^(?P<role>{_LABEL})_(?P<stage>{_LABEL})_step(?P<step>\d+)"
    rf"_rank(?P<rank>\d+)-of-(?P<world>\d+)_pid(?P<pid>\d+)_(?P<ts>\d{{{_TIMESTAMP_DIGITS}}})"
    r"(?:_part(?P<part>[1-9]\d*))?\.json(?P<gz>\.gz)?$"
)
TRACE_NAME_PATTERN = _TRACE_NAME.pattern
"""The regular expression every trace file name matches (``re.fullmatch`` it on a base name)."""

# torch writes range names into the trace JSON unescaped: anything but printable ASCII other than
# " and \ would break the file. (A negated class: the range up to U+10FFFF takes ~10 ms to compile.)
_UNSAFE_IN_RANGE = re.compile(r"[^\x20-\x21\x23-\x5b\x5d-\x7e]")


def sanitize_label(label: object) -> str:
    """A role or stage as it appears in file names.

    >>> sanitize_label("compute_log_prob")
    'compute-log-prob'
    >>> sanitize_label("../../etc")
    'etc'

    A label with nothing left (``"演员"``, ``"___"``) gets a stable encoded form instead, its
    characters' code points: ``U+6F14+5458``, ``U+5F+5F+5F`` (``U+`` for ``""``). A label that is
    not a string is used as ``str(label)``.

    >>> sanitize_label("演员")
    'U+6F14+5458'
    """
    text = label_text(label)
    cleaned = _NOT_LABEL_RUN.sub("-", text).strip("-.")
    if not cleaned:
        return "U+" + "+".join(f"{ord(ch):X}" for ch in text)
    return cleaned


def label_text(label: object) -> str:
    """A label as text: itself if a string, else ``str(label)`` (its type's name if that fails).

    >>> label_text(3)
    '3'
    """
    if isinstance(label, str):
        return label
    try:
        text = str(label)
    except Exception:  # a __str__ that fails must not fail a region
        text = type(label).__name__
    return text if isinstance(text, str) else type(label).__name__


MAX_LABEL = 80
"""The longest role or stage a file name holds (file names are limited to 255 bytes)."""


def fit_label(label: str) -> str:
    """A sanitized label short enough for a file name: a longer one keeps its start and gets a
    short hash of the whole, so that two long labels stay apart.

    >>> fit_label("a" * 100) == "a" * 71 + "+7f900025"
    True
    """
    if len(label) <= MAX_LABEL:
        return label
    import hashlib  # only for over-long labels: ~3 ms to import

    digest = hashlib.sha1(label.encode()).hexdigest()[:8]
    return f"{label[: MAX_LABEL - len(digest) - 1]}+{digest}"


def file_label(label: object) -> str:
    """A role or stage as a file name writes it: sanitized, then fitted."""
    return fit_label(sanitize_label(label))


def range_label(text: str) -> str:
    """A label made safe for a range name inside a trace (``"``, ``\\``, control and
    non-ASCII characters become ``_``; everything else is kept as given)."""
    return _UNSAFE_IN_RANGE.sub("_", text)


@attrs.frozen(kw_only=True)
class TraceName:
    """The fields of a trace file name; ``role`` and ``stage`` are sanitized labels."""

    role: str
    stage: str
    step: int
    rank: int
    world_size: int
    pid: int
    timestamp: _dt.datetime
    part: int = 0
    gzip: bool = False


FUSED_STAGE = "train"
"""The stage of every fused trace (one trace per step, holding all of its regions)."""
FUSED_DEFAULT_ROLE = "main"
METADATA_KEY = "torchstep_prof"
"""The top-level key of a trace holding torchstep_prof's own description of it."""
_MAX_FUSED_ROLE = 100  # with a stage of at most MAX_LABEL: the name stays under 255 bytes


def name_trace(
    *,
    owner: Optional[tuple[str, str]],
    roles: Iterable[str],
    process_role: Optional[str],
    step: int,
    rank: int,
    world_size: int,
    pid: int,
    timestamp: _dt.datetime,
    gzip: bool = False,
) -> tuple[TraceName, tuple[str, ...]]:
    """A trace's identity, and the roles it holds as file names write them (the hook's list).

    A region's trace is named by its ``owner`` (role, stage); a fused one (``owner`` None, stage
    ``train``) by ``process_role`` if set, else by the ``roles`` that entered it, once each, in
    order, joined with ``-`` (``main`` if none did; past 100 characters the first ones are kept
    and the rest counted: a file name holds 255 bytes).

    >>> import datetime as dt
    >>> name, roles = name_trace(owner=None, roles=["actor", "critic_1", "actor"], process_role=None,
    ...     step=3, rank=0, world_size=1, pid=7, timestamp=dt.datetime.now(dt.timezone.utc))
    >>> name.role, name.stage, roles
    ('actor-critic-1', 'train', ('actor', 'critic-1'))
    """
    if owner is not None:
        labels = [file_label(owner[0])]
    elif process_role is not None:
        labels = [file_label(process_role)]
    else:
        labels = list(dict.fromkeys(file_label(role) for role in roles)) or [FUSED_DEFAULT_ROLE]
    held = tuple(labels)
    role = "-".join(labels)
    if len(role) > _MAX_FUSED_ROLE:
        kept: list[str] = []
        while labels and len("-".join(kept + labels[:1])) <= _MAX_FUSED_ROLE - 6:
            kept.append(labels.pop(0))
        role = "-".join(kept) + f"+{len(labels)}-more"
    stage = FUSED_STAGE if owner is None else file_label(owner[1])
    name = TraceName(
        role=role, stage=stage, step=step, rank=rank, world_size=world_size, pid=pid, timestamp=timestamp, gzip=gzip
    )
    return name, held


def format_timestamp(moment: _dt.datetime) -> str:
    """UTC ``%Y%m%d%H%M%S`` plus milliseconds: 17 digits."""
    moment = moment.astimezone(_dt.timezone.utc)
    return moment.strftime(_TIMESTAMP_FORMAT) + f"{moment.microsecond // 1000:03d}"


def build_trace_name(name: TraceName) -> str:
    """The file name (no folder) for ``name``.

    >>> import datetime as dt
    >>> build_trace_name(TraceName(role="actor", stage="compute_log_prob", step=3, rank=0,
    ...     world_size=2, pid=41, timestamp=dt.datetime(2026, 8, 14, 12, 27, 31, 89000,
    ...     tzinfo=dt.timezone.utc)))
    'actor_compute-log-prob_step3_rank0-of-2_pid41_20260814122731089.json'
    """
    role = sanitize_label(name.role)
    stage = sanitize_label(name.stage)
    base = (
        f"{role}_{stage}_step{name.step}_rank{name.rank}-of-{name.world_size}"
        f"_pid{name.pid}_{format_timestamp(name.timestamp)}"
    )
    part = f"_part{name.part}" if name.part else ""
    return f"{base}{part}{'.json.gz' if name.gzip else '.json'}"


def parse_trace_name(path: str | os.PathLike[str]) -> TraceName:
    """The fields of a trace file name, the exact inverse of :func:`build_trace_name`.

    >>> parse_trace_name("out/actor_update_step2_rank1-of-4_pid7_20260814122731089.json.gz").rank
    1

    Raises ``ValueError`` naming the file when it is not a trace name.
    """
    base = os.path.basename(os.fspath(path))
    match = _TRACE_NAME.match(base)
    if match is None:
        raise ValueError(
            f"{base!r} is not a torchstep_prof trace name "
            f"(<role>_<stage>_step<n>_rank<r>-of-<w>_pid<p>_<17-digit UTC time>.json[.gz])"
        )
    ts = match["ts"]
    moment = _dt.datetime.strptime(ts[:14], _TIMESTAMP_FORMAT).replace(
        microsecond=int(ts[14:]) * 1000, tzinfo=_dt.timezone.utc
    )
    return TraceName(
        role=match["role"],
        stage=match["stage"],
        step=int(match["step"]),
        rank=int(match["rank"]),
        world_size=int(match["world"]),
        pid=int(match["pid"]),
        timestamp=moment,
        part=int(match["part"] or 0),
        gzip=bool(match["gz"]),
    )


def with_part(filename: str, part: int) -> str:
    """``filename`` (a trace's) with ``_part<part>`` before its ``.json`` / ``.json.gz``
    extension; ``part=0`` returns it unchanged."""
    if not part:
        return filename
    suffix = ".json.gz" if filename.endswith(".json.gz") else ".json"
    return f"{filename[: -len(suffix)]}_part{part}{suffix}"
