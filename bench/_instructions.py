"""Instructions a code span executes, counted by valgrind's callgrind: a cost measure that gives the
same number run after run on a shared machine, where wall time between two processes does not.

Why: two fresh interpreters running the same training script here differ by up to 40% in step
time, with address randomization off too (physical page placement, neighbours on the host), so a
1% difference between ``python SCRIPT`` and ``torchstep-prof run`` cannot be seen in wall time with
any number of children a bench can afford. Callgrind counts every instruction of every thread of
the process (the interpreter, torch's kernels, any thread a library starts, the garbage
collector) from :func:`begin` to :func:`end`; two runs of one command agree within 0.01%.

The measured process marks its span with :func:`begin` and :func:`end` (no-ops when it is not
under :func:`count`), which issue callgrind's client requests through a tiny C library built on
first use with the system's ``gcc`` and valgrind's ``callgrind.h``. Collection is off until
``begin``, but valgrind still translates everything the process runs: a child that imports torch
takes 2-3 minutes.

    counted = count([sys.executable, "script.py"], env)   # script.py calls begin() / end()
    counted.instructions                                   # Ir between the two
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

LIBRARY_ENV = "TORCHSTEP_PROF_BENCH_CALLGRIND_LIB"
"""Set by :func:`count` in the measured process: the path of the client-request library."""

_SOURCE = """
#include <valgrind/callgrind.h>
void span_begin(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void span_end(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("span"); }
"""

_loaded: Optional[ctypes.CDLL] = None


def missing() -> Optional[str]:
    """Why instructions cannot be counted on this machine (a tool to install), or ``None``."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed (Debian: apt-get install valgrind)"
    if shutil.which("gcc") is None:
        return "gcc is not installed"
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        return "valgrind's callgrind.h is missing (Debian's valgrind package has it)"
    return None


def _build(folder: Path) -> Path:
    source, library = folder / "span.c", folder / "libspan.so"
    source.write_text(_SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _library() -> Optional[ctypes.CDLL]:
    global _loaded
    path = os.environ.get(LIBRARY_ENV)
    if path and _loaded is None:
        _loaded = ctypes.CDLL(path)
    return _loaded


def counting() -> bool:
    """Whether this process runs under :func:`count`."""
    return bool(os.environ.get(LIBRARY_ENV))


def begin() -> None:
    """Start counting (in the measured process); nothing outside :func:`count`."""
    library = _library()
    if library is not None:
        library.span_begin()


def end() -> None:
    """Stop counting and write the count; nothing outside :func:`count`."""
    library = _library()
    if library is not None:
        library.span_end()


class Counted:
    """What :func:`count` measured: ``instructions`` between begin and end, and the child's stdout."""

    def __init__(self, instructions: int, stdout: str) -> None:
        self.instructions = instructions
        self.stdout = stdout


def _span_total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):  # the dump's "summary:" reads 0 after CALLGRIND_ZERO_STATS
            return int(line.split()[1])
    raise RuntimeError(f"{dump}: no 'totals:' line: not a callgrind dump")


def count(command: Sequence[str], env: Mapping[str, str], timeout_s: float = 900) -> Counted:
    """Run ``command`` under callgrind; the instructions of its one begin/end span.

    Raises ``RuntimeError`` naming the command when the span was never closed (no dump).
    """
    with tempfile.TemporaryDirectory(prefix="tsp-callgrind-") as scratch:
        folder = Path(scratch)
        child_env = dict(env, **{LIBRARY_ENV: str(_build(folder))})
        out = folder / "callgrind.out"
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", *command],
            capture_output=True, text=True, env=child_env, timeout=timeout_s,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} under callgrind exited {done.returncode}: {done.stderr[-2000:]}")
        dumps = sorted(folder.glob("callgrind.out.*"))  # .1: the span's dump; the bare file: the rest
        if not dumps:
            raise RuntimeError(f"{' '.join(command)}: no span was counted (did it call begin() and end()?)")
        return Counted(_span_total(dumps[0]), done.stdout)
