"""Every process-wide state is in torchstep_prof/process_state.py's one list, and the tests'
reset brings each one it resets back to what a new process has.

The package is scanned for what can hold state across calls: ``global`` statements, module-level
mutable values (containers, locks, context variables, thread-locals, instances made at import),
mutable class attributes, and the threads each module starts.
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

from torchstep_prof.process_state import STATES, reset_for_tests

PACKAGE = Path(__file__).resolve().parents[1] / "torchstep_prof"

# Look like state to the scan, hold none: filled once at import and never changed.
CONSTANTS = {
    ("", "_EXPORTS"): "the public API's names and where each lives",
    ("config.converter", "_STAND_INS"): "type names shown in error messages",
    ("config.environment", "_EMPTY"): "the empty layer (frozen)",
    ("config.files", "CONFIG_FORMATS"): "file suffixes and their formats",
    ("config.files", "_PARSERS"): "the parser of each format",
    ("regions", "_IDLE_REGION"): "the shared no-op region (no attributes)",
    ("recording.slot_states", "ON_START"): "what a start does in each slot state (a table)",
    ("recording.slot_states", "TRANSITIONS"): "the slot's moves (a table)",
    ("rendering", "_NAMED"): "escapes shown by name",
    ("summary.records", "ProfilingRecords.costs"): "a frozen record's default",
    ("traces.reading.cache", "_CHECKS"): "the fields a cache entry is checked against",
}

_MUTABLE_CALLS = {"set", "dict", "list", "WeakSet", "WeakKeyDictionary", "WeakValueDictionary",
                  "local", "Lock", "RLock", "ContextVar", "deque", "Event", "count"}  # fmt: skip


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _holds_state(value: ast.expr) -> bool:
    if isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        name = _callee(value)
        if name in _MUTABLE_CALLS:
            return True
        # An instance of a class made at import (``ENGINE = Engine()``).
        return name.lstrip("_")[:1].isupper() and not value.args and not value.keywords
    return False


def _assigned(node: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return node.target.id, node.value
    return None


def find_state(source: str) -> set[str]:
    """The names in ``source`` that may hold process-wide state (``thread`` for a thread started)."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(node.names)
        elif isinstance(node, ast.Call) and _callee(node) == "Thread":
            found.add("thread")
    for node in tree.body:
        pair = _assigned(node)
        if pair is not None and pair[0] != "__all__" and _holds_state(pair[1]):
            found.add(pair[0])
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                pair = _assigned(item)
                if pair is not None and _holds_state(pair[1]):
                    found.add(f"{node.name}.{pair[0]}")
    return found


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_every_process_wide_state_is_listed():
    listed = {(state.module, state.name) for state in STATES}
    missing = sorted(
        f"{module or 'torchstep_prof'}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for module in [_module(path)]
        for name in find_state(path.read_text())
        if (module, name) not in listed and (module, name) not in CONSTANTS
    )
    assert missing == [], f"add to torchstep_prof/process_state.py STATES (with its reset and fork): {missing}"


def test_every_listed_state_exists():
    stale = []
    for state in STATES:
        source = (PACKAGE / Path(*state.module.split("."))).with_suffix(".py")
        if not source.exists() or state.name not in find_state(source.read_text()):
            stale.append(f"{state.module}: {state.name}")
    assert stale == [], f"listed in process_state.STATES, not found in the package: {stale}"


def test_each_entry_says_how_tests_reset_it_and_what_a_fork_does():
    for state in STATES:
        assert state.holds and state.tests and state.fork, state
        assert state.reset is None or state.reset[0] in ("call", "set"), state


def test_the_scan_finds_a_global_a_class_attribute_and_a_thread():
    source = (
        "import threading\n_seen = set()\nclass A:\n    _n = {}\n"
        "def f():\n    global _flag\n    threading.Thread(target=f).start()\n"
    )
    assert find_state(source) == {"_seen", "A._n", "_flag", "thread"}


def test_reset_for_tests_brings_state_back_to_a_new_process():
    from torchstep_prof.recording import nvtx, session
    from torchstep_prof.selection import steps

    steps.COUNTERS.setdefault("role", {})
    steps.next_occurrence("role", "stage", 1)
    nvtx._warned = True
    session._warned_no_cuda = True
    reset_for_tests()
    assert steps.COUNTERS == {}
    assert steps.next_occurrence("role", "stage", 1) == 1
    assert nvtx._warned is False and session._warned_no_cuda is False
    steps.forget_occurrences()


def test_reset_for_tests_leaves_modules_never_imported_unimported():
    resettable = {f"torchstep_prof.{state.module}" for state in STATES if state.reset is not None}
    absent = sorted(name for name in resettable if name not in sys.modules)
    reset_for_tests()
    assert [name for name in absent if name in sys.modules] == []
    # Every module it resets has what it resets.
    for state in STATES:
        if state.reset is not None:
            owner = importlib.import_module(f"torchstep_prof.{state.module}")
            for part in state.reset[1].split("."):
                owner = getattr(owner, part)
