"""What a trace's step number counts: the code's own numbers, or a run's boundaries from 1.

Instrumented code numbers its steps itself (``tsp.step(n)``, ``begin_step(iter_num)``: a loop
that counts from 0 has a step 0). ``torchstep-prof run`` cannot see the loop's counter, so it
counts boundaries from 1 (the first ``Optimizer.step`` call ends step 1), which makes its step
``n`` the loop's iteration ``n - 1``. Both files say ``step<n>``; the trace's metadata and the
exit summary say which rule gave the number (docs/zero-code.md, "Step numbers").
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

__all__ = ["RunCounting", "counting_run", "step_meaning"]


@attrs.frozen(kw_only=True)
class RunCounting:
    """How ``torchstep-prof run`` counts: ``every`` ``boundary`` events (``Optimizer.step
    call``) end one step; the first ``every`` of them end step 1."""

    boundary: str
    every: int = 1

    def iterations(self, step: int) -> tuple[int, int]:
        """The loop iterations, counting from 0, whose boundaries make up ``step`` (one boundary
        an iteration).

        >>> RunCounting(boundary="Optimizer.step call").iterations(5)
        (4, 4)
        >>> RunCounting(boundary="Optimizer.step call", every=4).iterations(3)
        (8, 11)
        """
        return (step - 1) * self.every, step * self.every - 1

    def sentence(self, step: int) -> str:
        """``step 5 = Optimizer.step call 5 of the run: iteration 4 of a loop counting from 0``.

        >>> RunCounting(boundary="Optimizer.step call").sentence(5)
        'step 5 = Optimizer.step call 5 of the run: iteration 4 of a loop counting from 0 (begin_step(4) in code)'
        """
        first, last = self.iterations(step)
        if first == last:
            return (
                f"step {step} = {self.boundary} {step} of the run: iteration {first} of a loop counting "
                f"from 0 (begin_step({first}) in code)"
            )
        return (
            f"step {step} = {self.boundary}s {first + 1}-{last + 1} of the run: iterations {first}-{last} "
            "of a loop counting from 0"
        )


_RUN: list[RunCounting] = []  # set while `torchstep-prof run` drives the steps


def counting_run(counting: Optional[RunCounting]) -> None:
    """Note that ``torchstep-prof run`` numbers the steps from now on (``None``: no longer)."""
    _RUN[:] = [counting] if counting is not None else []


def step_meaning(step: int) -> dict[str, Any]:
    """The metadata fields that say what ``step`` counts, for a trace written now.

    >>> step_meaning(5)["step_counted_by"]
    'code'
    """
    if _RUN:
        counting = _RUN[0]
        first, last = counting.iterations(step)
        return {"step_counted_by": "run", "iterations": [first, last], "step_means": counting.sentence(step)}
    return {
        "step_counted_by": "code",
        "step_means": f"step {step} = the number the code gave (tsp.step({step}), begin_step({step}) or "
        "step=), or a region's entries counted from 1 when it gave none",
    }
