"""The package's exceptions and warnings: one root each, ``ConfigError``, and ``warn()``."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Iterable, Optional, Sequence

import attrs

from .rendering import safe_text


class TorchstepProfError(Exception):
    """Root of every exception raised by torchstep_prof."""


@attrs.frozen
class Problem:
    """One thing wrong with a configuration: where (a dotted key path) and what.

    ``path`` is empty for a problem with the whole input (an unreadable file, say).
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def under(self, prefix: str) -> Problem:
        """The same problem seen from a parent: ``wait`` under ``schedule`` is ``schedule.wait``."""
        if not prefix:
            return self
        return Problem(f"{prefix}.{self.path}" if self.path else prefix, self.message)


class ConfigError(TorchstepProfError, ValueError):
    """A configuration was rejected; ``problems`` lists every reason, one line each.

    >>> from torchstep_prof import ScheduleConfig
    >>> ScheduleConfig(wait=-1, active=0)
    Traceback (most recent call last):
    ...
    torchstep_prof.errors.ConfigError: 2 problems in the configuration:
      wait: must be >= 0 (got -1)
      active: must be >= 1 (got 0)
    """

    def __init__(self, problems: Iterable[Problem | str]) -> None:
        self.problems: tuple[Problem, ...] = tuple(
            p if isinstance(p, Problem) else Problem("", str(p)) for p in problems
        )
        super().__init__(self._render(self.problems))

    @staticmethod
    def _render(problems: Sequence[Problem]) -> str:
        if len(problems) == 1:
            return str(problems[0])
        lines = "\n".join(f"  {p}" for p in problems)
        return f"{len(problems)} problems in the configuration:\n{lines}"

    def under(self, prefix: str) -> ConfigError:
        """This error with every key path placed under ``prefix``."""
        return ConfigError(p.under(prefix) for p in self.problems)

    def __reduce__(self):  # keep the problems across pickling (multiprocessing)
        return (type(self), (self.problems,))


class TorchstepProfWarning(UserWarning):
    """Root of every warning torchstep_prof issues (filter them all with this class)."""


class FinishHookWarning(TorchstepProfWarning):
    """A finish hook failed, timed out, could not start, or ran with something missing.

    Hooks never raise into training: their failures are reported with this warning and
    recorded (``tsp.records().hooks``).
    """


class ProfilerStartWarning(TorchstepProfWarning):
    """torch's profiler could not start; the block ran once, unprofiled."""


class ForeignProfilerWarning(TorchstepProfWarning):
    """Another torch profiler was running or warming up somewhere in the process: torchstep_prof
    started nothing meanwhile (regions ran unprofiled), or a trace of ours was ended by it."""


class LabelWarning(TorchstepProfWarning):
    """A region label is not a string (its text is used), or two labels name the same trace
    files once sanitized (``actor_1`` and ``actor-1``); the region runs as usual."""


class MetricsWarning(TorchstepProfWarning):
    """The metrics endpoint could not start (port in use, ``prometheus_client`` missing), a
    second metrics config was ignored, or more (role, stage) pairs were timed than get a series
    of their own; regions are still timed and training goes on."""


class TraceWriteWarning(TorchstepProfWarning):
    """A trace could not be written (unwritable folder, full disk, failed export); training goes
    on and the failure is recorded (``tsp.records().traces``)."""


def warn(message: str, category: type[Warning] = TorchstepProfWarning) -> None:
    """Issue a profiling warning that points at the user's line and never raises into training.

    The warning names the innermost line of the user's code on this thread's stack (the
    ``with tsp.profile_region(...)``, the ``optimizer.step()`` a run's hook fired from), never
    the package's line that noticed: frames of torchstep_prof, torch and the standard library
    that runs them are passed over. With no user code on the stack (the writer's thread, a
    hook's, ``torchstep-prof run`` before the script starts) it names no line at all
    (``torchstep_prof:0:``). There is no ``stacklevel``: the line is found, not counted. A
    count is true only for one path to the call, and the same warning is reached from a region,
    a scope, a step block or a hook's thread at different depths; walking out of the package
    names the user's line from any of them. Control characters in ``message`` are shown
    escaped (a label or request id could hold an escape sequence).

    Under ``-W error`` (``warnings.simplefilter("error")``) ``warnings.warn`` raises: a failed
    write could then replace the user's own exception. The message goes to stderr instead.
    """
    message = safe_text(message)
    frame = _user_frame(sys._getframe(1))
    where = frame.f_globals if frame is not None else globals()
    try:
        warnings.warn_explicit(
            message,
            category,
            frame.f_code.co_filename if frame is not None else "torchstep_prof",
            frame.f_lineno if frame is not None else 0,
            module=where.get("__name__"),
            registry=where.setdefault("__warningregistry__", {}),
        )
    except Warning:
        try:
            sys.stderr.write(f"{category.__name__}: {message}\n")
        except (OSError, ValueError, AttributeError):  # no usable stderr: nothing more to do
            pass


def warn_once(
    warned: set[Any],
    key: Any,
    message: str,
    category: type[Warning] = TorchstepProfWarning,
    *,
    limit: Optional[int] = None,
    past_limit: Optional[str] = None,
) -> None:
    """:func:`warn` the first time ``key`` comes up in ``warned`` (the caller's keys warned about);
    after ``limit`` different keys (None: no limit) only ``past_limit``, if given, once.

    >>> warn_once(_warned, ("write", errno), f"torchstep_prof: {path} cannot be written")  # doctest: +SKIP
    """
    if key in warned:
        return
    if limit is not None and len(warned) >= limit:
        if past_limit is None or len(warned) > limit:
            return
        message = past_limit
    warned.add(key)
    warn(message, category)


# Modules whose frames a warning never points at: ours, torch's (a run's optimizer and module
# hooks fire inside torch), and the standard library's that run our code (a generator scope's
# entry, a thread's start, an import, `python -m`). Our files by path too: `python -m
# torchstep_prof` runs our __main__.py as `__main__`.
_NOT_USER = frozenset({"torchstep_prof", "torch", "contextlib", "threading", "importlib", "runpy"})
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_frame(frame: Any) -> Any:
    """The innermost frame at or above ``frame`` that is the user's code; None when there is none."""
    while frame is not None:
        module = frame.f_globals.get("__name__") or ""
        if module.partition(".")[0] not in _NOT_USER and not frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            return frame
        frame = frame.f_back
    return None
