"""What training costs, counted rather than timed: the arithmetic of a training step, identical on any machine.

A step's cost is the floating-point operations of its forward and backward pass as PyTorch's FlopCounterMode counts
them (matrix multiplies and convolutions, the ops that dominate; elementwise ops and the optimizer step are not
counted). They are counted once per kind of batch, on a copy of the model on the meta device (no arithmetic runs,
no memory is used), with the parameters that train in it: a WUS skip batch, whose backward stops at the trained
biases, counts its forward pass only; a batch of 80 samples counts 80/128 of a full one. An epoch's cost is the sum
over its batches, so a DFP pruning epoch costs what its fewer batches cost.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def step_flops(model: nn.Module, batch_size: int, channels_last: bool) -> int:
    """FLOPs of one training step of `model` (forward, cross-entropy, backward) on a batch of 32x32 images, with its
    parameters' requires_grad as they are now."""
    meta = copy.deepcopy(model).to("meta")  # keeps each parameter's requires_grad
    x = torch.empty(batch_size, 3, 32, 32, device="meta")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.zeros(batch_size, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        loss = F.cross_entropy(meta(x).float(), y)
        if loss.requires_grad:  # not when every parameter is frozen
            loss.backward()
    return counter.get_total_flops()


class StepCosts:
    """FLOPs of a training step per batch size and set of trainable parameters, each counted once."""

    def __init__(self, model: nn.Module, channels_last: bool) -> None:
        self.model, self.channels_last = model, channels_last
        self.counted: dict[tuple[int, tuple[bool, ...]], int] = {}

    def epoch(self, batch_sizes: list[int]) -> int:
        """FLOPs of an epoch of these batches, with the parameters that train now."""
        trainable = tuple(p.requires_grad for p in self.model.parameters())
        total = 0
        for size in batch_sizes:
            key = (size, trainable)
            if key not in self.counted:
                self.counted[key] = step_flops(self.model, size, self.channels_last)
            total += self.counted[key]
        return total
