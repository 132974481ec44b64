"""The package's layers point down: each module imports only its own layer and the ones below it.

The order is the list below (and the same list in docs/architecture.md, which this test checks).
Every import counts, inside functions and under ``TYPE_CHECKING`` too: a lazy import still makes
the lower module know the higher one. The few imports that run up are listed in ``UPWARD`` with
the reason each one stays; one that no longer runs up must leave the list.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torchstep_prof"

# Bottom first. A module's layer is that of its longest listed prefix (``traces.reading`` before
# ``traces``); a new module or package needs a line here.
LAYERS: Sequence[tuple[str, Sequence[str]]] = (
    # Foundations: no knowledge of profiling state. Errors and warn(), printable text, the fork
    # handler, files in shared folders, decorators, the Ctrl-C guard, the list of process-wide
    # state, the rank, the background work registry, the one-worker-per-process slot, and the one
    # trace-name builder.
    ("foundations", ("errors", "rendering", "_fork", "_shared_files", "_wrapping", "interrupts", "process_state",
                     "topology", "background", "one_per_process", "naming", "traces",
                     "slow_steps.rule", "slow_steps.why", "timeline.wall_clock")),
    # The records every later layer fills (a trace written, a hook run): data only.
    ("records", ("summary.records",)),
    ("config", ("config",)),
    # Reading a trace file back: the writer reads a written trace's GPU time with it.
    ("reading traces", ("traces.reading",)),
    ("selection", ("selection",)),
    ("recording", ("recording",)),
    ("writing", ("writing",)),
    ("after a trace", ("hook", "summary", "region_metrics", "triggers", "slow_steps", "live", "timeline")),
    ("engine", ("engine", "process_exit")),
    ("training code's API", ("regions", "scopes")),
    ("entry points and analysis", ("zero_code", "integrations", "startup", "traces.analysis")),
    ("report", ("traces.report",)),
    ("command line", ("cli", "__main__")),
)  # fmt: skip

# (importer, imported): why this import runs up and stays.
UPWARD: Mapping[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str, layers: Sequence[tuple[str, Sequence[str]]] = LAYERS) -> int | None:
    """The index of ``name``'s layer (its longest listed prefix), or None when it has none."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def imports_of(name: str, source: str, modules: Iterable[str]) -> list[tuple[str, int]]:
    """The package modules ``name`` (relative to the package) imports anywhere, with the line."""
    known = set(modules) - {name}

    def ours(dotted: str) -> str | None:
        # The package's own __init__ (the lazy public API) is the facade, not a layer.
        relative = dotted.removeprefix("torchstep_prof.")
        return relative if dotted.startswith("torchstep_prof.") and relative in known else None

    is_package = (PACKAGE / Path(*name.split(".")) / "__init__.py").exists()
    here = ["torchstep_prof"] + name.split(".")
    package = here if is_package else here[:-1]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from .x import y, z`: the modules x.y and x.z where they are modules, else x
            hits = [ours(f"{target}.{alias.name}") for alias in node.names]
            hits = [hit for hit in hits if hit] or [ours(target)]
        elif isinstance(node, ast.Import):
            hits = [ours(alias.name) for alias in node.names]
        else:
            continue
        found.extend((hit, node.lineno) for hit in hits if hit)
    return found


def upward_imports(
    graph: Mapping[str, Sequence[tuple[str, int]]], layers: Sequence[tuple[str, Sequence[str]]] = LAYERS
) -> list[tuple[str, str, int]]:
    """Every import from a module to a module of a higher layer: (importer, imported, line)."""
    found = []
    for name, targets in sorted(graph.items()):
        low = layer_of(name, layers)
        for target, line in targets:
            high = layer_of(target, layers)
            if low is not None and high is not None and high > low:
                found.append((name, target, line))
    return found


GRAPH = {name: imports_of(name, path.read_text(), MODULES) for name, path in MODULES.items() if name}


def test_every_module_has_a_layer():
    missing = sorted(name for name in MODULES if name and layer_of(name) is None)
    assert missing == [], f"give these modules a layer in tests/test_layers.py LAYERS: {missing}"


def test_imports_point_down():
    names = [layer for layer, _ in LAYERS]
    offenders = [
        f"torchstep_prof/{MODULES[a].relative_to(PACKAGE)}:{line} imports {b} "
        f"({names[layer_of(a)]} -> {names[layer_of(b)]})"
        for a, b, line in upward_imports(GRAPH)
        if (a, b) not in UPWARD
    ]
    assert offenders == [], "imports that run up the layers:\n" + "\n".join(offenders)


def test_each_allowed_upward_import_still_runs_up():
    actual = {(a, b) for a, b, _ in upward_imports(GRAPH)}
    stale = sorted(pair for pair in UPWARD if pair not in actual)
    assert stale == [], f"no longer imported up: remove from UPWARD: {stale}"


def test_the_check_finds_an_upward_import_inside_a_function():
    layers = (("low", ("a",)), ("high", ("b",)))
    source = "def f():\n    from .b import thing\n"
    graph = {"a": imports_of("a", source, ["a", "b"]), "b": []}
    assert upward_imports(graph, layers) == [("a", "b", 2)]
    assert layer_of("b.c", layers) == 1 and layer_of("c", layers) is None


def test_architecture_md_lists_the_layers_in_this_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\d+\. \*\*([^*]+)\*\*", text, flags=re.MULTILINE)
    assert listed == [layer for layer, _ in LAYERS]
