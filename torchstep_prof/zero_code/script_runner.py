"""Run a script or a module as ``__main__``, as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would.

``sys.argv``, ``sys.path[0]``, ``__file__``, ``__cached__``, ``__spec__`` and the module
registered as ``__main__`` are set as the interpreter sets them (a module or a folder goes through
the very runpy function python calls); exceptions and ``SystemExit`` propagate unchanged (so the
exit code is the script's), and a traceback printed at exit shows what python's would: the
script's frames (after runpy's for a module), none of the command line's that led to it.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import runpy
import sys
import types
from importlib.machinery import SourceFileLoader
from typing import Any, Callable, Iterator, Sequence

__all__ = ["ScriptNotFound", "check_module", "check_script", "run_module", "run_script"]

# The function ``python -m`` and ``python FOLDER`` call. It is private to CPython, so typeshed does
# not declare it; it exists on every version the package supports (3.10+).
_run_module_as_main: Callable[..., Any] = runpy._run_module_as_main  # type: ignore[attr-defined]


class ScriptNotFound(Exception):
    """The script or module to run does not exist; the message says which, as python does."""


def check_script(path: str) -> None:
    """Raise ``ScriptNotFound`` unless ``path`` can be run as a script."""
    if not os.path.exists(path):
        raise ScriptNotFound(f"can't open file {os.path.abspath(path)!r}: [Errno 2] No such file or directory")


def check_module(name: str) -> None:
    """Raise ``ScriptNotFound`` unless ``name`` is an importable module (looked up as ``-m``
    does: the current directory first)."""
    import importlib.util

    with _path0(os.getcwd()):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:  # a parent package that is missing or broken
            raise ScriptNotFound(f"Error while finding module specification for {name!r} ({exc})") from None
    if spec is None:
        raise ScriptNotFound(f"No module named {name}")


def run_script(path: str, args: Sequence[str]) -> None:
    """Execute the file at ``path`` as ``__main__`` with ``sys.argv = [path, *args]``."""
    sys.argv[:] = [path, *args]
    if os.path.isdir(path) or not os.path.isfile(path):  # a folder or zip with __main__.py
        _set_path0(os.path.abspath(path))
        _fresh_main()
        # What the interpreter itself calls for a folder: the same frames in a traceback, and
        # its one-line message (exit 1) for a folder without __main__.py.
        _guarded(_run_module_as_main, "__main__", alter_argv=False)
        return
    # The interpreter puts the script's real folder first on the path, and gives __main__ the
    # absolute file name (while argv[0] stays as typed).
    _set_path0(os.path.dirname(os.path.realpath(path)))
    filename = os.path.abspath(path)
    main = _fresh_main(
        __file__=filename,
        __cached__=None,
        __loader__=SourceFileLoader("__main__", filename),
    )
    _guarded(_exec_file, filename, main)


def _exec_file(filename: str, main: types.ModuleType) -> None:
    with open(filename, "rb") as handle:  # bytes: compile() honours a coding cookie
        source = handle.read()
    # Compiled here, inside the guarded call: a SyntaxError's traceback is trimmed as a runtime
    # error's is, so it shows the script's error block alone, as python does.
    code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def run_module(name: str, args: Sequence[str]) -> None:
    """Run module ``name`` as ``__main__`` (``python -m name args``)."""
    sys.argv[:] = [name, *args]  # runpy sets argv[0] to the module's file, as -m does
    _set_path0(os.getcwd())
    _fresh_main()
    # The function python -m itself calls: a traceback shows the same two runpy frames, and a
    # package without __main__.py gets python's one-line message and exit code 1.
    _guarded(_run_module_as_main, name, alter_argv=True)


def _fresh_main(**fields: Any) -> types.ModuleType:
    """Register a new, empty ``__main__`` module holding what the interpreter's own one holds.

    Registered for good, as python's own ``__main__`` is: pickle and multiprocessing look it up,
    and atexit handlers of the script may outlive the run.
    """
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __spec__=None, __package__=None, **fields)
    sys.modules["__main__"] = main
    return main


def _guarded(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException:
        _trim_tracebacks_at_exit()
        raise


# --- sys.path[0] ------------------------------------------------------------------------------


def _set_path0(folder: str) -> None:
    # What the interpreter put there is the launcher's folder (bin/ for the console script, the
    # current directory for `python -m torchstep_prof`): the script's takes its place.
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


@contextlib.contextmanager
def _path0(folder: str) -> Iterator[None]:
    saved = list(sys.path)
    _set_path0(folder)
    try:
        yield
    finally:
        sys.path[:] = saved


# --- tracebacks -------------------------------------------------------------------------------

_RUNNER_CODE = _guarded.__code__
_EXEC_FILE_CODE = _exec_file.__code__


def _trim_tracebacks_at_exit() -> None:
    """Make the traceback the interpreter prints at exit start at the script's own frames."""
    previous = sys.excepthook
    if getattr(previous, "_torchstep_prof_trims", False):
        return

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        tb = _trimmed(tb)
        try:
            exc.__traceback__ = tb
        except (AttributeError, TypeError):  # pragma: no cover - an exotic exception object
            pass
        previous(exc_type, exc, tb)

    excepthook._torchstep_prof_trims = True  # type: ignore[attr-defined]  # a marker on the function
    sys.excepthook = excepthook


def _trimmed(tb: Any) -> Any:
    """``tb`` from the frame after the runner's on: the script's own frames (after runpy's two
    for a module or a folder, as python shows them); ``None`` for a SyntaxError, which python
    prints with no frames at all."""
    runner = None
    entry = tb
    while entry is not None:
        if entry.tb_frame.f_code is _RUNNER_CODE:
            runner = entry
        entry = entry.tb_next
    if runner is None:
        return tb  # not an exception that came out of the script
    entry = runner.tb_next
    if entry is not None and entry.tb_frame.f_code is _EXEC_FILE_CODE:
        entry = entry.tb_next  # compile() and exec() of a script, which python does in C
    return entry
