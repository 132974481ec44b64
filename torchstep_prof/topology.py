"""Where this process sits in the job: the one rank resolver.

Global rank and world size come from ``torch.distributed`` when a default process group exists,
else from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets, else ``0`` of ``1``. Local rank
and local world size come from ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``; without them a process is
taken to be alone on its node with its global rank (``mp.spawn`` on one host).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

import attrs

from ._ray_rank import warn_if_ray_actor_without_rank
from .errors import warn

__all__ = ["Topology", "current_topology"]


@attrs.frozen(kw_only=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        warn(f"torchstep_prof: ignoring {name}={raw!r} (not an integer); using {default}", stacklevel=3)
        return default


_GROUP_MEMBER: Any = None  # torch.distributed.GroupMember, once torch.distributed is imported


def default_group() -> Any:
    # Looked up without importing torch.distributed (a process that never imported it has no
    # process group), and cheaply: this runs on the region path.
    global _GROUP_MEMBER
    group_member = _GROUP_MEMBER
    if group_member is None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return None
        group_member = _GROUP_MEMBER = dist.GroupMember
    return group_member.WORLD


def distributed_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group exists (never imports it)."""
    return default_group() is not None


def _resolve(group: Any, environ: Mapping[str, str]) -> Topology:
    warn_if_ray_actor_without_rank(group, environ)
    rank = _env_int(environ, "RANK", 0)
    world_size = _env_int(environ, "WORLD_SIZE", 1)
    if group is not None:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
    return Topology(
        rank=rank,
        world_size=world_size,
        local_rank=_env_int(environ, "LOCAL_RANK", rank),
        local_world_size=_env_int(environ, "LOCAL_WORLD_SIZE", world_size),
    )


# (process group it was computed for, topology). The environment of a process does not change
# its rank, so only a new process group (or a fork: see the hook below) invalidates the cache.
_cached: Optional[tuple[Any, Topology]] = None


def current_topology() -> Topology:
    """This process's rank, world size, local rank and local world size.

    >>> current_topology().world_size >= 1
    True
    """
    global _cached
    group = default_group()
    cached = _cached
    if cached is not None and cached[0] is group:
        return cached[1]
    topology = _resolve(group, os.environ)
    _cached = (group, topology)
    return topology


def forget_topology() -> None:
    """Drop the cached answer (tests that change ``RANK`` in-process)."""
    global _cached
    _cached = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=forget_topology)
