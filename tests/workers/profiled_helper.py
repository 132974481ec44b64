"""A helper with a profiled function, run as a finish hook's command (tests/test_child_processes.py):
appends one line to the file named by its argument, after calling the function three times."""

from __future__ import annotations

import sys

import torchstep_prof as tsp


@tsp.profiled(role="helper")
def upload() -> None:
    pass


if __name__ == "__main__":
    for _ in range(3):
        upload()
    with open(sys.argv[1], "a", encoding="utf-8") as log:
        log.write("hook ran\n")
