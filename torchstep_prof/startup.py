"""What importing the package starts: Kineto's log level, and profiling the environment switches on.

Kept out of ``__init__`` (which only re-exports) and run from it once, at import: both must
happen before anything else. No torch import: the command line imports the package too.
"""

from __future__ import annotations

import os
import sys

__all__ = ["at_import"]


def at_import() -> None:
    """The package's import-time work (called once by ``torchstep_prof/__init__.py``)."""
    # Kineto prints USDT lines on stderr for every profiler window unless this is set before the
    # first profiler use in the process (setting it later has no effect). Users can still override.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    # With profiling switched on by TORCHSTEP_PROF_CONFIG / _OVERRIDES there may be no scope
    # entered before step 1: do at import what entering a scope would (read the environment
    # into the root frame, register the exit work, load the names, pay torch.profiler's ~1 s
    # first start on a rank that may profile), not inside the first profiled step. Only in a
    # process that already imported torch (a training script; not the command line). A bad
    # environment is reported later, where docs/configuration.md says: at the first scope or region. When the
    # environment also sets a finish hook, its frame is read there too: that hook belongs to a
    # process that ran a scope or a region, not to every one that imports the package.
    from .config.variables import ENV_CONFIG, ENV_OVERRIDES

    if "torch" not in sys.modules or not (os.environ.get(ENV_CONFIG) or os.environ.get(ENV_OVERRIDES)):
        return
    from . import _load_every_name
    from .config.environment import read_environment
    from .config.model import ProfilerConfig
    from .engine import ENGINE
    from .errors import ConfigError
    from .selection.frames import current_frame
    from .selection.rules import rank_selected
    from .topology import current_topology

    try:
        layer = read_environment()
        config = layer.apply(ProfilerConfig())
    except ConfigError:
        return
    if not config.enable or config.schedule is None:
        return
    if not layer.sets_finish_hook:
        ENGINE.prepare(current_frame())  # outside every scope: the root frame
        return
    _load_every_name()
    if rank_selected(config.ranks, config.all_ranks, current_topology().rank):
        ENGINE.slot.warm_up(config.contents)
