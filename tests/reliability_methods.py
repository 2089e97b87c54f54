"""Training methods for the reliability tests: state that must survive a checkpoint, and a loss that turns NaN.

In-process tests register them on the test's own registry; tests/test_reliability.py also copies this file into
the methods package of a throwaway repository, where it registers itself like any method, for the real stages.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import torch

from cheaptrain.methods.base import Method, register


class Stateful(Method):
    """Skips, from epoch 2 on, the quarter of the samples with the highest loss so far, ties broken by draws from
    its own generator and from Python's and numpy's: its state (a per-sample tensor, a generator, a counter) and
    the global generators must all come back from a checkpoint for a resumed run to match an uninterrupted one.

    STATEFUL_EPOCH_SLEEP (seconds) slows each epoch down, so that a test can kill a run in the middle."""

    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        self.loss_sum = torch.zeros(ctx.num_samples, device=ctx.device)
        self.generator = torch.Generator(device=ctx.device).manual_seed(ctx.seed + 1)
        self.selections = 0

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        time.sleep(float(os.environ.get("STATEFUL_EPOCH_SLEEP", "0")))
        if epoch == 1:
            return None
        self.selections += 1
        noise = torch.rand(self.ctx.num_samples, generator=self.generator, device=self.ctx.device)
        score = self.loss_sum + noise * (random.random() + np.random.rand())
        return score.argsort()[: self.ctx.num_samples * 3 // 4].sort().values

    def on_batch_end(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        self.loss_sum[indices] += losses

    def epoch_metrics(self) -> dict[str, float]:
        return {"stateful_loss_sum": float(self.loss_sum.sum()), "stateful_selections": self.selections}

    def run_metrics(self) -> dict[str, float]:
        return {"stateful_total_selections": self.selections}

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss_sum": self.loss_sum.clone(),
            "generator": self.generator.get_state(),
            "selections": self.selections,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_sum.copy_(state["loss_sum"])
        self.generator.set_state(state["generator"])
        self.selections = state["selections"]


class Poison(Method):
    """Sets the weights to NaN at the start of epoch 3: the loss becomes NaN there, every time."""

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        if epoch == 3:
            with torch.no_grad():
                next(self.ctx.model.parameters()).fill_(float("nan"))
        return None


if __name__.startswith("cheaptrain.methods."):  # copied into a methods package: register like any method
    register("stateful")(Stateful)
    register("poison")(Poison)
