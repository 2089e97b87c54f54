"""The hooks a training method plugs into the loop. The baseline is this class itself: every hook does nothing.

A method is one file in this package with a `@register("name")` class. The loop calls, in order:

    setup(ctx)                               once, before training (or before resuming from a checkpoint)
    on_epoch_start(epoch, lr) -> indices     picks the samples to train on (None: all) and which parameters train
    on_batch_end(indices, losses)            per-sample training losses of each batch, on the training device
    on_validation_end(epoch, accuracy, lr)   the epoch's test accuracy (%) and the lr it was trained with
    epoch_metrics() -> dict                  logged per epoch with step=epoch
    run_metrics() -> dict                    logged once at the end of the run
    state_dict() / load_state_dict(state)    what a checkpoint must keep for an exact resume

Hooks run inside the timed training part of the epoch (except the validation hook), so a method's overhead counts
against its saving. Keep `on_batch_end` free of host synchronisation (.item(), .cpu(), printing tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class RunContext:
    model: nn.Module
    num_samples: int  # size of the training split
    epochs: int
    device: torch.device
    seed: int
    lr_at: Callable[[int], float]  # the recipe's schedule, for methods that plan ahead


class Method:
    """Train every sample with every parameter, every epoch."""

    name = "baseline"  # the registry name, set by @register

    def __init__(self, **params: Any) -> None:
        from cheaptrain.config import ConfigError

        if params:
            raise ConfigError([f"methods.{self.name}.{k}: unknown parameter (accepts none)" for k in params])

    def setup(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        return None

    def on_batch_end(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        pass

    def on_validation_end(self, epoch: int, accuracy: float, lr: float) -> None:
        pass

    def epoch_metrics(self) -> dict[str, float]:
        return {}

    def run_metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
