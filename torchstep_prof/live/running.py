"""What a step boundary reads of live status: the status thread in force, if any.

Kept apart from ``reporter.py`` (the status thread, sampling, the stall rule), which is imported
only when a frame opts in (``engine.py``): a job that never does pays for neither the import nor
anything but one attribute read per step block.
"""

from __future__ import annotations

from typing import Any

from ..one_per_process import OnePerProcess

__all__ = ["LIVE"]

# ``LIVE.running`` is None unless a scope opted in to live status. Its worker is a
# ``reporter.Reporter``, typed where it is read (this module may not import reporter.py).
LIVE: OnePerProcess[Any] = OnePerProcess()
