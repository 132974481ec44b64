"""What ends a step under ``torchstep-prof run``: ``--step-on optimizer|backward|MODULE:QUALNAME``.

- ``optimizer`` (the default): each ``Optimizer.step`` call, through torch's global post-hook.
- ``backward``: each top-level ``torch.autograd.backward`` call (``Tensor.backward`` calls it):
  one made while no other is running in the training thread. A backward inside a backward
  (reentrant checkpointing, a custom ``Function`` that differentiates) is part of the outer one,
  and ``torch.autograd.grad`` ends nothing (gradient penalties, double backward's first pass).
- ``MODULE:QUALNAME``: each return of that function (outermost call, a raise included), wrapped
  as soon as its module has been imported (or, for the script itself, once its ``def`` or
  ``class`` statement has run): a module-level function or a method of a module-level class.

Each source calls ``on_boundary()`` in the thread that did the work; the driver counts.
"""

from __future__ import annotations

import ast
import functools
import importlib.abc
import os
import sys
import threading
from typing import Any, Callable, Optional

import attrs

__all__ = ["StepOn", "parse_step_on", "install_source"]

_ALLOWED = "'optimizer' (the default), 'backward' or MODULE:QUALNAME (a function, e.g. train:train_step)"


@attrs.frozen
class StepOn:
    """A parsed ``--step-on``: ``kind`` is ``optimizer``, ``backward`` or ``function``."""

    kind: str
    module: str = ""
    qualname: str = ""

    def boundary(self) -> str:
        """One boundary event, as a noun: ``Optimizer.step call``."""
        if self.kind == "optimizer":
            return "Optimizer.step call"
        if self.kind == "backward":
            return "top-level autograd backward"
        return f"return of {self.module}:{self.qualname}"

    def describe(self) -> str:
        return f"each {self.boundary()}"


def parse_step_on(text: str) -> StepOn:
    """``--step-on``'s value; ``ValueError`` names the option, the value and what is allowed.

    >>> parse_step_on("backward").kind, parse_step_on("train:Trainer.step").qualname
    ('backward', 'Trainer.step')
    """
    value = text.strip()
    if value in ("optimizer", "backward"):
        return StepOn(value)
    module, colon, qualname = value.partition(":")
    parts_ok = all(p.isidentifier() for p in module.split(".")) and all(p.isidentifier() for p in qualname.split("."))
    if not colon or not parts_ok:
        raise ValueError(f"--step-on: {text!r} is not allowed: use {_ALLOWED}; "
                         "QUALNAME is dotted names (no <locals>)")  # fmt: skip
    return StepOn("function", module, qualname)


def check_defined_in(step_on: StepOn, path: Optional[str]) -> None:
    """For a function of the script itself: ``ValueError`` unless the file at ``path`` defines
    ``QUALNAME`` at module level (a nested function cannot be reached)."""
    if path is None or not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as handle:
            body = ast.parse(handle.read()).body
    except (OSError, SyntaxError, ValueError):
        return  # python reports it when the script runs
    for part in step_on.qualname.split("."):
        found = [n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == part]  # fmt: skip
        if not found:
            break
        body = found[-1].body
    else:
        return
    raise ValueError(
        f"--step-on {step_on.module}:{step_on.qualname}: {path} defines no {step_on.qualname} at "
        "module level (QUALNAME names a module-level function or a method of a module-level class)"
    )


# --- the sources ---------------------------------------------------------------------------------


def install_source(
    step_on: StepOn, on_boundary: Callable[[], None], owner: int, main_names: tuple[str, ...]
) -> Callable[[], None]:
    """Start calling ``on_boundary`` at each boundary ``step_on`` names; returns the remover.

    ``main_names``: the names the script runs under (``__main__`` and its module name): a
    function of those is looked for in ``__main__`` as the script runs.
    """
    if step_on.kind == "optimizer":
        from torch.optim import optimizer as _optimizer_hooks

        # Hooks stay for the whole run: torch iterates its global hook dict lazily, so removing
        # one from inside a hook would break the running step.
        handle = _optimizer_hooks.register_optimizer_step_post_hook(lambda *_: on_boundary())
        return handle.remove
    if step_on.kind == "backward":
        return _wrap_backward(on_boundary, owner)
    return _FunctionSource(step_on, on_boundary, main_names).install()


def _outermost(fn: Callable[..., Any], on_boundary: Callable[[], None], owner: int) -> Callable[..., Any]:
    depth = threading.local()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return fn(*args, **kwargs)
        level = getattr(depth, "n", 0)
        depth.n = level + 1
        try:
            return fn(*args, **kwargs)
        finally:
            depth.n = level
            if level == 0:
                on_boundary()

    wrapper._torchstep_prof_original = fn  # type: ignore[attr-defined]  # a marker on the function
    return wrapper


def _wrap_backward(on_boundary: Callable[[], None], owner: int) -> Callable[[], None]:
    import torch.autograd

    original = torch.autograd.backward
    # Tensor.backward calls torch.autograd.backward by attribute: one wrapper sees both.
    torch.autograd.backward = _outermost(original, on_boundary, owner)

    def remove() -> None:
        torch.autograd.backward = original

    return remove


class _FunctionSource(importlib.abc.MetaPathFinder):
    """Wraps ``MODULE:QUALNAME`` once it exists: right after its module is imported (a finder
    first on ``sys.meta_path`` that asks nothing of other imports), or in ``__main__``, through a
    trace of the script's module-level lines only until the ``def``/``class`` has run."""

    def __init__(self, step_on: StepOn, on_boundary: Callable[[], None], main_names: tuple[str, ...]) -> None:
        self.step_on = step_on
        self.on_boundary = on_boundary
        self.owner = threading.get_ident()
        self.main_names = main_names
        self.undo: list[Callable[[], None]] = []
        self._tracing = False

    def install(self) -> Callable[[], None]:
        module = self.step_on.module
        if module in sys.modules and module not in self.main_names:
            self._wrap_in(vars(sys.modules[module]))
        elif module not in self.main_names:
            sys.meta_path.insert(0, self)
            self.undo.append(lambda: sys.meta_path.remove(self) if self in sys.meta_path else None)
        if module in self.main_names:
            if sys.gettrace() is None:
                self._trace_main()
            else:
                from ..errors import TorchstepProfWarning, warn

                warn(f"torchstep_prof run: --step-on {module}:{self.step_on.qualname}: a tracer (a debugger, "
                     "coverage) already runs, so the script's function cannot be found: no step will end",
                     TorchstepProfWarning)  # fmt: skip
        return self.remove

    def remove(self) -> None:
        if self._tracing:
            sys.settrace(None)
            self._tracing = False
        while self.undo:
            self.undo.pop()()

    # import hook: let the real finders find it, then wrap after the module ran
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.step_on.module:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, source = spec.loader, self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                source._wrap_in(vars(module))

            def __getattr__(self, name: str) -> Any:  # get_source, resource readers...
                return getattr(loader, name)

        spec.loader = _Loader()
        return spec

    def _trace_main(self) -> None:
        source = self

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and source._wrap_in(frame.f_globals):
                sys.settrace(None)
                source._tracing = False
                frame.f_trace = None
                return None
            return local

        def global_trace(frame: Any, event: str, arg: Any) -> Any:
            # Only the script's own module-level frame is traced, line by line.
            current = sys.modules.get("__main__")
            if current is not None and frame.f_globals is current.__dict__ and frame.f_code.co_name == "<module>":
                return local
            return None

        self._tracing = True
        sys.settrace(global_trace)

    def _wrap_in(self, namespace: dict) -> bool:
        head, *rest = self.step_on.qualname.split(".")
        owner: Any = None
        target = namespace.get(head)
        for part in rest:
            if target is None:
                return False
            owner, target = target, vars(target).get(part) if hasattr(target, "__dict__") else None
        if target is None or getattr(target, "_torchstep_prof_original", None) is not None:
            return False
        raw = target.__func__ if isinstance(target, (staticmethod, classmethod)) else target
        if not callable(raw):
            return False
        wrapper = _outermost(raw, self.on_boundary, self.owner)
        wrapped: object = wrapper  # what replaces the target: the wrapper, or it in the same descriptor
        if isinstance(target, staticmethod):
            wrapped = staticmethod(wrapper)
        elif isinstance(target, classmethod):
            wrapped = classmethod(wrapper)
        name = rest[-1] if rest else head
        if owner is None:
            namespace[name] = wrapped
            self.undo.append(lambda: namespace.__setitem__(name, target))
        else:
            setattr(owner, name, wrapped)
            self.undo.append(lambda: setattr(owner, name, target))
        return True
