"""The hooks a training method plugs into the loop. The baseline is this class itself: every hook does nothing.

A method is one file in this package with a `@register("name")` class that declares its parameters in `PARAMS`
(cheaptrain.Param: default, test, what it accepts) and overrides the hooks it needs. The loop calls, in order:

    setup(ctx)                               once, before training (or before resuming from a checkpoint)
    on_epoch_start(epoch, lr) -> indices     picks the samples to train on (None: all) and which parameters train
    loss_weights(indices) -> weights         per-sample weights of a batch's losses (None: unweighted)
    on_batch_end(indices, losses)            per-sample (unweighted) training losses of each batch, on the device
    on_validation_end(epoch, accuracy, lr)   the epoch's test accuracy (%) and the lr it was trained with
    epoch_metrics() -> dict                  logged per epoch with step=epoch
    run_metrics() -> dict                    logged once at the end of the run
    state_dict() / load_state_dict(state)    what a checkpoint must keep for an exact resume

Before any work, `cross_check()` and `check_run(ctx)` name what is wrong with the parameters together and with the
run (its training-set size, its model, its epochs), so that a bad run fails in `--check`, not at its first epoch.

Hooks run inside the timed training part of the epoch (except the validation hook), so a method's overhead counts
against its saving. Keep `on_batch_end` and `loss_weights` free of host synchronisation (.item(), .cpu(), printing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from cheaptrain import ConfigError, Param, check_params


@dataclass
class RunContext:
    model: nn.Module  # on the meta device in check_run: its structure, not its weights
    num_samples: int  # size of the training split
    epochs: int
    device: torch.device
    seed: int
    lr_at: Callable[[int], float]  # the recipe's schedule, for methods that plan ahead


class Method:
    """Train every sample with every parameter, every epoch: the baseline."""

    name = "baseline"  # the registry name, set by @register
    PARAMS: ClassVar[dict[str, Param]] = {}

    def __init__(self, **params: Any) -> None:
        self.params, problems = check_params(f"methods.{self.name}", self.PARAMS, params)
        self.invalid = set(problems)
        lines = [*problems.values(), *self.cross_check()]
        if lines:
            raise ConfigError(lines)

    def valid(self, *names: str) -> bool:
        """Whether these parameters passed their own tests (cross_check's rules apply only then)."""
        return not self.invalid.intersection(names)

    def cross_check(self) -> list[str]:
        """Rules across parameters, each checked when its parameters are valid(): one line per problem."""
        return []

    def check_run(self, ctx: RunContext) -> list[str]:
        """What only the run tells (training-set size, the model's layers, the epochs): one line per problem."""
        return []

    def setup(self, ctx: RunContext) -> None:
        """Once, before the first epoch: the run's model, data size, schedule."""
        self.ctx = ctx

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        """The indices of the samples this epoch trains (None: all); may freeze or unfreeze parameters."""
        return None

    def loss_weights(self, indices: torch.Tensor) -> torch.Tensor | None:
        """Per-sample weights of this batch's losses (None: every sample weighs 1)."""
        return None

    def on_batch_end(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        """The batch's per-sample losses, unweighted and detached, on the training device."""

    def on_validation_end(self, epoch: int, accuracy: float, lr: float) -> None:
        """The epoch's test accuracy (%) and the lr it trained with."""

    def epoch_metrics(self) -> dict[str, float]:
        """Figures of the epoch just trained, logged with step=epoch."""
        return {}

    def run_metrics(self) -> dict[str, float]:
        """Figures of the whole run, logged once at its end."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to decide exactly as an uninterrupted one."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned."""


METHODS: dict[str, type[Method]] = {"baseline": Method}


def register(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: the method is `name` in params (`methods.<name>`, `grid.<study>.methods`)."""

    def add(cls: type[Method]) -> type[Method]:
        cls.name = name
        METHODS[name] = cls
        return cls

    return add
