"""``TorchstepProfCallback`` for the Hugging Face ``Trainer``: chosen optimizer steps, profiled.

>>> from transformers import Trainer                                      # doctest: +SKIP
>>> from torchstep_prof.integrations.transformers import TorchstepProfCallback
>>> trainer = Trainer(model, args, train_dataset=data,                     # doctest: +SKIP
...                   callbacks=[TorchstepProfCallback(steps=[3, 5])])
>>> trainer.train()                                                        # doctest: +SKIP

Step ``n`` is the optimizer step that makes ``state.global_step`` ``n``; it is open from its
``on_step_begin`` until the next step begins (or training ends), so the logging, evaluation and
checkpoint it triggers belong to it. Inside it, ranges ``trainer/training_step`` (each
micro-batch's forward and backward, gradient clipping included in the last),
``trainer/optimizer_step`` (``optimizer.step()``) and ``trainer/evaluate`` (``Trainer.evaluate``).
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any, Mapping, Optional, Sequence, Union

from transformers import Trainer, TrainerCallback

from ..config.model import FinishHookConfig
from ..errors import TorchstepProfWarning, warn
from ._driver import StepDriver, build_scopes

__all__ = ["TorchstepProfCallback"]


def _find_trainer(callback: TrainerCallback) -> Optional[Trainer]:
    # transformers hands callbacks no Trainer; the one whose callback handler holds this callback
    # is on the stack while it calls us (Trainer.__init__ for on_init_end, train() afterwards).
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer) and callback in owner.callback_handler.callbacks:
            return owner
        frame = frame.f_back
    return None


class TorchstepProfCallback(TrainerCallback):
    """Profile chosen optimizer steps of ``Trainer.train()``; fused traces (one per step) by default.

    ``steps``: step numbers (``state.global_step + 1`` as the step begins); ``ranks``: a rank or
    ranks (default rank 0); ``contents``: as ``tsp.contents``; ``on_finish``: a command (string or
    list), a mapping of ``tsp.on_finish`` arguments with ``cmd``, or a ``FinishHookConfig``;
    ``config_fields``: any ``tsp.configure`` field (``save_path``, ``discrete``, ``schedule``,
    ``config=`` a file...). Arguments are checked here, not when training starts.
    ``metrics=18400`` (a port, ``True``, or a mapping of ``tsp.metrics`` arguments) also times
    every step and region for Prometheus.

    >>> cb = TorchstepProfCallback(steps=[3, 5], save_path="/tmp/prof",     # doctest: +SKIP
    ...                            on_finish={"cmd": "ls $TORCHSTEP_PROF_SAVE_PATH", "wait": True})

    An exception leaving ``trainer.train()`` closes the open step (its trace is written), the
    scopes and the finish hook's scope, as a ``with`` block would: pass the callback to
    ``Trainer(callbacks=[...])`` for that (one added later with ``add_callback`` covers the next
    ``train()`` call).
    """

    def __init__(
        self,
        steps: Optional[Sequence[int]] = None,
        *,
        ranks: Union[int, Sequence[int], None] = None,
        contents: Union[str, Sequence[str], None] = None,
        on_finish: Union[str, Sequence[str], Mapping[str, Any], FinishHookConfig, None] = None,
        **config_fields: Any,
    ) -> None:
        self._driver = StepDriver(build_scopes(steps, ranks, contents, on_finish, config_fields))
        self._guarded: Any = None  # the Trainer whose train() closes us if it raises

    # -- making train() exception-safe -------------------------------------------------------
    def _guard(self, trainer: Optional[Trainer]) -> bool:
        if trainer is None or self._guarded is trainer:
            return trainer is not None
        train = trainer.train
        driver = self._driver

        @functools.wraps(train)
        def train_closing_on_error(*args: Any, **kwargs: Any) -> Any:
            try:
                return train(*args, **kwargs)
            finally:
                driver.close()  # a no-op after on_train_end; after an exception, what it left

        trainer.train = train_closing_on_error  # type: ignore[method-assign]  # this instance only
        self._guarded = trainer
        return False  # guarded from the next train() call on

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._guard(_find_trainer(self))

    # -- the events ----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _find_trainer(self)
        if not self._guard(trainer):
            warn(
                "torchstep_prof: TorchstepProfCallback was added after the Trainer was made; "
                "an exception inside this train() call may leave a step open. "
                "Pass it as Trainer(callbacks=[TorchstepProfCallback(...)]).",
                TorchstepProfWarning,
            )
        self._driver.start()
        if trainer is not None:  # Trainer has no "evaluation begins" event
            self._driver.wrap_in_region(trainer, "evaluate")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.begin_step(state.global_step + 1)
        self._driver.enter_region("training_step")

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a micro-batch of gradient accumulation ended; the next one begins at once
        self._driver.enter_region("training_step")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.exit_region("training_step")
        self._driver.enter_region("optimizer_step")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.exit_region("optimizer_step")

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.end_step()  # the previous epoch's last step, its epoch-end evaluation included

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._driver.close()
