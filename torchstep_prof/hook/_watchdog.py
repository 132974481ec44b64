"""A finish hook's watchdog: runs the command and ends its process group at its deadline.

The hook runs in a session of its own (a Ctrl-C or torchrun's ``killpg`` meant for training
must not cut an upload short), so nothing else ends it if training is killed: this small
process, the leader of that session, keeps the deadline whatever becomes of training. Run as a script with the standard library only
(``python -I -S _watchdog.py TIMEOUT_S GRACE_S STATUS_FD CMD...``, no import of torchstep_prof or
torch): it writes ``S`` to ``STATUS_FD`` once the command started, or ``E`` and the reason if it
could not, then waits; at ``TIMEOUT_S`` it sends SIGTERM to the group, SIGKILL ``GRACE_S``
later. It exits as the command did (killed by the same signal, or with its exit code).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

_GROUP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _ignore(signum: int, frame: Any) -> None:
    """Signals sent to the whole group are the command's: the watchdog stays to keep its deadline."""


def main(argv: list[str]) -> int:
    timeout_s, grace_s, status_fd = float(argv[1]), float(argv[2]), int(argv[3])
    for signum in _GROUP_SIGNALS:
        signal.signal(signum, _ignore)  # a caught signal is back to its default in the command
    try:
        child = subprocess.Popen(argv[4:])  # close_fds: the status pipe is not the command's
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        os.write(status_fd, f"E{exc}".encode("utf-8", "replace"))
        return 127
    os.write(status_fd, b"S")
    os.close(status_fd)
    try:
        code = child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(0, signal.SIGTERM)  # the command and everything it started in the group
        try:
            code = child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(0, signal.SIGKILL)  # the watchdog too
            return 137  # pragma: no cover - SIGKILL above ended this process
    if code < 0:  # end as the command ended, so the hook's record names the signal
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
            pass
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to end a process: as a shell says it
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
