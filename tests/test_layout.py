"""The package's layout keeps its promises (docs/architecture.md): every module says its job in
its first line, no two modules import each other (directly or around a cycle, lazy imports
included), and the configuration and trace-reading subpackages never import torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torchstep_prof"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path) -> set[str]:
    """The package's modules ``name`` imports anywhere in its code (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        # The package's own __init__ (the lazy public API) is the facade, not a dependency.
        found.update(c for c in candidates if c in MODULES and c not in (name, "torchstep_prof"))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    graph = {name: imported_modules(name, path) for name, path in MODULES.items()}
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_opens_with_a_one_line_summary(name):
    if name.endswith("__main__"):
        return
    docstring = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert docstring, f"{name} has no module docstring"
    first = docstring.splitlines()[0]
    assert first.endswith((".", ":")) or docstring.splitlines()[1:2] in ([], [""]), (
        f"{name}: the first line should be a sentence saying the module's job: {first!r}"
    )


@pytest.mark.parametrize("subpackage", ["config", "traces"])
def test_configuration_and_reading_traces_never_import_torch(subpackage):
    for name, path in MODULES.items():
        if name.startswith(f"torchstep_prof.{subpackage}"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names] if isinstance(node, ast.Import) else []
                )  # fmt: skip
                assert not any(n == "torch" or n.startswith("torch.") for n in names), name


def test_the_region_path_calls_no_method_on_a_from_imported_name():
    # Python 3.11 compiles `name.method(...)` as a plain attribute load, making and dropping a
    # bound method on every call, when `name` was bound by an import statement in the module:
    # in regions.py, the hot path, such objects are bound by assignment instead (calls on
    # imported modules are fine: a module's function is not bound).
    import importlib
    import types

    path = PACKAGE / "regions.py"
    module = importlib.import_module("torchstep_prof.regions")
    tree = ast.parse(path.read_text())
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    objects = {name for name in imported if not isinstance(getattr(module, name, None), types.ModuleType)}
    offenders = [
        f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in objects
    ]
    assert offenders == [], offenders
