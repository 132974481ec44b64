"""Where this process sits in the job: the one rank resolver.

Global rank and world size come from ``torch.distributed`` when a default process group exists,
else from the ``RANK`` / ``WORLD_SIZE`` variables torchrun sets, else ``0`` of ``1``. Local rank
and local world size come from ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``; without them a process is
taken to be alone on its node with its global rank (``mp.spawn`` on one host). Values that make
no sense (``RANK=-1``, ``RANK=5 WORLD_SIZE=2``, ``WORLD_SIZE=0``, ``RANK=abc``) give one warning
and ``0`` of ``1`` (local rank ``0`` of ``1`` for ``LOCAL_*`` ones), so every file name parses.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

import attrs

from ._fork import at_fork_in_child
from .errors import TorchstepProfWarning, warn, warn_once

__all__ = ["Topology", "current_topology", "default_group", "group_registry"]


@attrs.frozen(kw_only=True)
class Topology:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


_WORLD: Any = None  # torch.distributed's process-wide group registry, once it is imported


def default_group() -> Any:
    """The default ``torch.distributed`` process group, or None (never imports torch.distributed).

    Read on the region path (a rank's decision is cached per scope and re-made only when this
    changes), so it reads the registry's attribute directly: ~50 ns, against ~250 ns for
    ``GroupMember.WORLD``'s class property, which returns the same object.
    """
    global _WORLD
    world = _WORLD
    if world is None:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available():
            return None
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        world = getattr(c10d, "_world", None)
        if world is None or not hasattr(world, "_default_pg"):  # another torch: the public way
            return dist.GroupMember.WORLD
        _WORLD = world
    return world._default_pg


class _NoProcessGroups:
    """Stands in for torch.distributed's group registry where it is not available."""

    _default_pg = None


class _PublicGroups:
    """The registry read the public way (a torch whose registry has no ``_default_pg``)."""

    @property
    def _default_pg(self) -> Any:
        import torch.distributed as dist

        return dist.GroupMember.WORLD


def group_registry() -> Any:
    """An object whose ``_default_pg`` is, at each read, the default process group (or None).

    For the region path, which holds it and reads one attribute per decision (no call): the
    registry object torch.distributed keeps for the life of the process. Ask for it once torch
    is imported (torch imports torch.distributed when the build has it).
    """
    default_group()
    if _WORLD is not None:
        return _WORLD
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return _NoProcessGroups()
    return _PublicGroups()


def _resolve(group: Any, environ: Mapping[str, str]) -> Topology:
    problems: list[str] = []
    if group is not None:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        _warn_if_ray_actor_without_rank(environ)
        rank, world_size = _checked_pair(environ, "RANK", 0, "WORLD_SIZE", 1, problems)
    if problems:
        rank, world_size, local_rank, local_world_size = 0, 1, 0, 1
    else:
        # Without LOCAL_* a process is taken to be alone on its node with its global rank.
        local_rank, local_world_size = _checked_pair(
            environ, "LOCAL_RANK", rank, "LOCAL_WORLD_SIZE", world_size, problems, at_most=world_size
        )
        if problems:
            # Alone on its node: a per-node hook then runs here rather than wait for node-mates
            # that may not exist (or leave this node's traces to an uploader that is not there).
            local_rank, local_world_size = 0, 1
    if problems:
        # Once per process and message: the topology is resolved again after a fork or a new
        # process group, and a DataLoader worker need not repeat its parent's warning.
        message = (
            f"torchstep_prof: ignoring a rank environment that makes no sense ({'; '.join(problems)}); "
            f"using rank {rank} of {world_size}, local rank {local_rank} of {local_world_size}"
        )
        warn_once(_warned, message, message)
    return Topology(rank=rank, world_size=world_size, local_rank=local_rank, local_world_size=local_world_size)


def _checked_pair(
    environ: Mapping[str, str],
    index_name: str,
    index_default: int,
    size_name: str,
    size_default: int,
    problems: list[str],
    at_most: Optional[int] = None,
) -> tuple[int, int]:
    """An (index, size) pair such as ``RANK`` / ``WORLD_SIZE``, unset ones at their defaults,
    with a line added to ``problems`` for each rule broken (an integer, index >= 0, size >= 1,
    index below size, size at most ``at_most``)."""
    found = len(problems)
    index_value = _integer(environ, index_name, index_default, 0, problems)
    size_value = _integer(environ, size_name, size_default, 1, problems)
    if len(problems) == found and index_value >= size_value:
        problems.append(
            f"{_shown(environ, index_name, index_value)} is not below {_shown(environ, size_name, size_value)}"
        )
    if len(problems) == found and at_most is not None and size_value > at_most:
        problems.append(f"{_shown(environ, size_name, size_value)} is more than the world size {at_most}")
    return index_value, size_value


def _integer(environ: Mapping[str, str], name: str, default: int, minimum: int, problems: list[str]) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{_shown(environ, name)} is not an integer")
        return default
    if value < minimum:
        problems.append(f"{_shown(environ, name)} is not >= {minimum}")
    return value


def _shown(environ: Mapping[str, str], name: str, default: Optional[int] = None) -> str:
    """``RANK=5`` as a shell would write it; ``WORLD_SIZE unset (1)`` for a default."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return f"{name} (unset: {default})"
    import shlex

    return f"{name}={shlex.quote(raw)}"


_warned: set[str] = set()


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
    """Drop the cached answer and the warnings given (tests that change ``RANK`` in-process)."""
    global _ray_warned
    _forget_cache()
    _warned.clear()
    _ray_warned = False


def _forget_cache() -> None:
    global _cached
    _cached = None


at_fork_in_child(_forget_cache)


# --- a Ray actor with no rank variables (it would silently be rank 0 of 1) ---------------------
# Ray starts actors as plain processes: nothing sets RANK / WORLD_SIZE / LOCAL_RANK /
# LOCAL_WORLD_SIZE unless the driver does (verl's workers do), so every actor of every role would
# write ``rank0-of-1`` traces and a per-node hook would never see its node-mates. Ray is never
# imported here: a process whose code did not import it is not a Ray worker.

_ray_warned = False


def _ray_actor_id() -> Any:
    ray = sys.modules.get("ray")
    if ray is None:
        return None
    try:
        if not ray.is_initialized():  # the driver before ray.init(), or a plain `import ray`
            return None
        return ray.get_runtime_context().get_actor_id()  # None in the driver and in tasks
    except Exception:  # an unusual Ray: say nothing rather than break rank resolution
        return None


def _warn_if_ray_actor_without_rank(environ: Mapping[str, str]) -> None:
    """Warn once per process when a Ray actor with no process group has no ``RANK``: its rank
    falls back to 0 of 1."""
    global _ray_warned
    if _ray_warned or environ.get("RANK"):
        return
    actor_id = _ray_actor_id()
    if actor_id is None:
        return
    _ray_warned = True
    warn(
        f"torchstep_prof: this Ray actor ({actor_id}) has no RANK variable, so its traces are "
        "named rank 0 of 1 like every other actor's. Set RANK, WORLD_SIZE, LOCAL_RANK and "
        "LOCAL_WORLD_SIZE in the actor before it profiles (runtime_env={'env_vars': {...}} "
        "or os.environ in its __init__), as verl's workers do.",
        TorchstepProfWarning,
    )
