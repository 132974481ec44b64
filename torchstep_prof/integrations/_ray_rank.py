"""One warning for a Ray actor that has no rank variables (it would silently be rank 0 of 1).

Ray starts actors as plain processes: nothing sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``LOCAL_WORLD_SIZE`` unless the driver does (verl's workers do), so every actor of every role
would write ``rank0-of-1`` traces and a per-node hook would never see its node-mates. Ray is
never imported here: a process whose code did not import it is not a Ray worker.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from ..errors import TorchstepProfWarning, warn

__all__ = ["RANK_VARIABLES", "warn_if_ray_actor_without_rank"]

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

_warned = False


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


def warn_if_ray_actor_without_rank(group: Any, environ: Mapping[str, str]) -> None:
    """Warn once per process when a Ray actor's rank falls back to 0 of 1 for want of ``RANK``.

    ``group`` is the default ``torch.distributed`` process group (``None`` when there is none):
    with one, the rank comes from it and nothing is missing.
    """
    global _warned
    if _warned or group is not None or environ.get("RANK"):
        return
    actor_id = _ray_actor_id()
    if actor_id is None:
        return
    _warned = True
    warn(
        f"torchstep_prof: this Ray actor ({actor_id}) has no RANK variable, so its traces are "
        "named rank 0 of 1 like every other actor's. Set RANK, WORLD_SIZE, LOCAL_RANK and "
        "LOCAL_WORLD_SIZE in the actor before it profiles (runtime_env={'env_vars': {...}} "
        "or os.environ in its __init__), as verl's workers do.",
        TorchstepProfWarning,
    )
