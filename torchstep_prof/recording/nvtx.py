"""NVTX ranges beside torch's: with ``contents("nvtx")`` a profiled region also pushes ``role/stage``.

Nsight Systems (``nsys profile``) shows NVTX ranges on its timeline; torch's own ranges live only
in torch's trace. So, while a trace records with ``nvtx`` in its contents, every region range
(the owner's, the regions nested in it) is wrapped in ``torch.cuda.nvtx.range_push`` /
``range_pop`` of the same name, in the thread that entered it (NVTX ranges are per thread, as
torch's are); other threads' and asyncio tasks' spans, whose entries need not nest, get a
``range_start`` / ``range_end`` range instead. Unselected steps push nothing: the idle region
stays the shared no-op. On a torch build without CUDA, NVTX is not there: one warning, then
regions behave as without ``nvtx``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..errors import TorchstepProfWarning, warn

__all__ = ["NvtxRange", "nvtx_wanted"]

CONTENT = "nvtx"


@functools.lru_cache(maxsize=1)
def _nvtx_module() -> Any:
    """torch's NVTX binding, or None on a build without it (a CPU build: ``torch._C._nvtx``
    is missing and ``torch.cuda.nvtx.range_push`` raises at each call)."""
    if getattr(torch._C, "_nvtx", None) is None:
        return None
    return torch._C._nvtx


_warned = False


def nvtx_wanted(contents: tuple[str, ...]) -> bool:
    """Whether traces recorded with ``contents`` push NVTX ranges; warns once when ``nvtx`` is
    asked for on a torch build without NVTX (the ranges are then left out)."""
    global _warned
    if CONTENT not in contents:
        return False
    if _nvtx_module() is not None:
        return True
    if not _warned:
        _warned = True
        warn(
            "torchstep_prof: contents asks for 'nvtx' but this torch build has no CUDA (no NVTX); "
            "regions push no NVTX ranges",
            TorchstepProfWarning,
        )
    return False


class NvtxRange:
    """``inner`` (a region's range or span, not yet entered) inside an NVTX range of ``name``.

    ``nested`` (the owner thread's ranges): a push / pop range, nested as torch's are. Otherwise
    (spans: another thread's regions, or an asyncio task's, whose entries interleave) a
    start / end range, which needs no nesting. Entered once, by one ``with`` (a fresh object
    per region, as the ranges it wraps are).

    >>> with NvtxRange("actor/update", contextlib.nullcontext()):  # doctest: +SKIP
    ...     pass
    """

    __slots__ = ("name", "inner", "nested", "_id")

    def __init__(self, name: str, inner: Any, *, nested: bool = True) -> None:
        self.name = name
        self.inner = inner
        self.nested = nested
        self._id = 0

    def __enter__(self) -> Any:
        nvtx = _nvtx_module()
        if self.nested:
            nvtx.rangePushA(self.name)
        else:
            self._id = nvtx.rangeStartA(self.name)
        try:
            return self.inner.__enter__()
        except BaseException:
            self._close(nvtx)
            raise

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Any:
        try:
            return self.inner.__exit__(exc_type, exc, tb)
        finally:
            self._close(_nvtx_module())

    def _close(self, nvtx: Any) -> None:
        if self.nested:
            nvtx.rangePop()
        else:
            nvtx.rangeEnd(self._id)
