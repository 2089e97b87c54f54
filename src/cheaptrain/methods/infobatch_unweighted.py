"""InfoBatch without its expectation rescaling: the same candidates, draws and annealing, every loss weighing 1.

An ablation of one of InfoBatch's three operations (soft pruning, expectation rescaling, annealing): this keeps
soft pruning and annealing and drops the rescaling. It asks whether what InfoBatch does to a run comes from
the samples it leaves out or from the 1 / keep_ratio weight on the kept candidates (docs/measured.md, InfoBatch on
AlexNet). Every rule but the weights is InfoBatch's, inherited: with the same seed the two leave out the same samples
in epoch 2, and differ from then on only as their losses, hence their scores, differ.

Metrics as InfoBatch's; `upweighted_samples` is 0 in every epoch (no loss is weighted).
"""

from __future__ import annotations

import torch

from cheaptrain.methods.base import register
from cheaptrain.methods.infobatch import InfoBatch


@register("infobatch_unweighted")
class InfoBatchUnweighted(InfoBatch):
    """InfoBatch's choice of samples and annealing; the kept candidates' losses are not upweighted."""

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        trained = super().on_epoch_start(epoch, lr)
        self.weighing = False  # loss_weights answers None: the loop takes the plain batch mean
        self.epoch["upweighted_samples"] = 0
        return trained
