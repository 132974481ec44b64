"""``TorchstepProfCallback`` for ``lightning.pytorch``: chosen optimizer steps of ``fit()``, profiled.

>>> import lightning.pytorch as pl                                         # doctest: +SKIP
>>> from torchstep_prof.integrations.lightning import TorchstepProfCallback
>>> trainer = pl.Trainer(max_steps=10, callbacks=[TorchstepProfCallback(steps=[3, 5])])  # doctest: +SKIP

Step ``n`` is the optimizer step that makes ``trainer.global_step`` ``n`` (the batches of one
gradient-accumulation window share it). It is open from its first ``on_train_batch_start``
until the next step begins, the epoch ends or training ends, so the validation it triggers
belongs to it. Inside it, ranges ``trainer/training_step`` (the module's ``training_step``),
``trainer/backward``, ``trainer/optimizer_step`` (the optimizer's update, after the closure:
Lightning runs ``training_step`` and ``backward`` inside ``optimizer.step(closure)``) and
``trainer/validation`` (a validation run; the sanity check before training is not profiled).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

from lightning.pytorch import Callback, LightningModule, Trainer

from ..config.model import FinishHookConfig
from ._driver import StepDriver, build_scopes

__all__ = ["TorchstepProfCallback"]


class TorchstepProfCallback(Callback):
    """Profile chosen optimizer steps of ``Trainer.fit()``; fused traces (one per step) by default.

    Same arguments as the Hugging Face callback: ``steps`` (``trainer.global_step + 1``),
    ``ranks``, ``contents``, ``on_finish`` (a command, a mapping of ``tsp.on_finish`` arguments
    with ``cmd``, or a ``FinishHookConfig``) and any ``tsp.configure`` field.
    ``metrics=18400`` (a port, ``True``, or a mapping of ``tsp.metrics`` arguments) also times
    every step and region for Prometheus.

    >>> cb = TorchstepProfCallback(steps=[3, 5], save_path="/tmp/prof")     # doctest: +SKIP

    An exception inside ``fit()`` closes the open step (its trace is written) and every scope
    (Lightning's ``on_exception``).
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

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        driver = self._driver
        driver.start()
        # Lightning has no event around training_step itself (it runs inside the optimizer's
        # closure).
        driver.wrap_in_region(pl_module, "training_step")
        # The update ends inside torch's Optimizer.step range: a step post-hook closes the region
        # there, so it nests in that range instead of straddling its end.
        for optimizer in trainer.optimizers:
            handle = optimizer.register_step_post_hook(lambda *_: driver.exit_region("optimizer_step"))
            driver.on_close(handle.remove)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._driver.begin_step(trainer.global_step + 1)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        self._driver.enter_region("backward")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._driver.exit_region("backward")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._driver.enter_region("optimizer_step")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._driver.enter_region("validation")

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._driver.exit_region("validation")

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._driver.end_step()  # the epoch's last step, its epoch-end validation included

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._driver.close()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._driver.close()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._driver.close()  # a no-op unless something above was skipped
