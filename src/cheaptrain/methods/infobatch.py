"""InfoBatch (Qin et al., ICLR 2024): unbiased dynamic data pruning, a comparator for the DFP study.

Every rule follows the reference code, github.com/NUS-HPC-AI-Lab/InfoBatch, `infobatch/infobatch.py` (the package;
`research/infobatch.py` is an older variant whose `ratio` is the share kept, not pruned):

- Score: one per sample, its latest training loss before any weighting (`on_batch_end` gets the unweighted losses,
  as the reference's `update` copies the losses before rescaling them). Every score starts equal (3.0, as the
  reference's), so epoch 1 has no candidate and trains every sample. A sample left out of an epoch keeps its old
  score, which still counts in the next epoch's mean.
- Selection, at the start of each pruning epoch: the candidates are the samples whose score is strictly below the
  mean score. int(keep_ratio * candidates) of them, drawn uniformly at random without replacement, train; the
  rest of the candidates are left out. `prune_ratio` is thus a share of the candidates, not of the training set:
  the reference behaves so, and an epoch leaves out prune_ratio times the share of samples below the mean.
  keep_ratio = 1 - prune_ratio, floored at 0.1 as the reference does; ratios above 0.9, which the reference
  silently treats as 0.9, are refused here.
- Weights: in a pruning epoch a kept candidate's loss weighs 1 / keep_ratio, every other sample's 1, so that the
  candidates' expected gradient is unchanged; the loop trains on the batch mean of the weighted losses.
- Annealing: epoch e (counted from 1) prunes iff e <= delta * epochs, the reference's test `iterations <=
  num_epochs * delta` with its sampler's counter at e when epoch e starts (its constructor already counts one). So
  the first annealing epoch is floor(delta * epochs) + 1: 176 of 200 at delta 0.875, one later than ceil(delta *
  epochs) where delta * epochs is a whole number. Annealing epochs train every sample unweighted. (The reference
  resets its weights only when delta * epochs is a whole number, so otherwise its annealing epochs keep the last
  pruning epoch's weights; here they never weigh.)
- Randomness: the reference reseeds numpy's global generator with the epoch number, so its draws are the same in
  every run; here the draws come from the method's own torch.Generator seeded from the run's seed (another seed,
  another selection), and the loader's generator is untouched: `baseline` and `infobatch` train on the same batches
  in epoch 1.
- Defaults: the reference's, prune_ratio 0.5 and delta 0.875.

Metrics per epoch: `pruned_samples`, `candidates` (samples below the mean score; 0 in annealing epochs, which do not
select), `upweighted_samples` (the kept candidates), `selection_s`. Per run: `pruning_epochs` (epochs that left out a
sample), `annealing_epochs`, `pruned_samples_total`, `selection_s_total`, `monitoring_s` (the score updates and the
weight look-ups, host time) and `overhead_s`, their sum. Checkpoints hold the scores, the generator and the totals;
the weights follow from the next selection, so a resumed run is exact.
"""

from __future__ import annotations

import math
import time
from typing import Any, ClassVar

import torch

from cheaptrain import Param, is_number
from cheaptrain.methods.base import Method, RunContext, register

INITIAL_SCORE = 3.0  # the reference's; any value equal for all samples gives epoch 1 no candidate


@register("infobatch")
class InfoBatch(Method):
    """Leave out a random share of the samples whose loss is below the mean, upweight the rest of them; anneal."""

    PARAMS: ClassVar[dict[str, Param]] = {
        "prune_ratio": Param(
            0.5, lambda v: is_number(v) and 0 < v <= 0.9, "a number in (0, 0.9]: the share of the candidates left out"
        ),
        "delta": Param(
            0.875, lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]: epochs up to delta * epochs may prune"
        ),
    }

    def check_run(self, ctx: RunContext) -> list[str]:
        if self.last_pruning_epoch(ctx.epochs) >= 2:
            return []
        return [
            f"methods.{self.name}.delta: {self.params['delta']!r} lets no epoch prune in this run's {ctx.epochs} "
            "epochs (epoch 1 never prunes: every score is equal); accepted: delta * epochs >= 2"
        ]

    def last_pruning_epoch(self, epochs: int) -> int:
        """The last epoch that may prune: floor(delta * epochs), the reference's boundary (module docstring)."""
        return math.floor(self.params["delta"] * epochs)

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.keep_ratio = max(0.1, 1.0 - self.params["prune_ratio"])  # the reference's floor (module docstring)
        self.last_pruning = self.last_pruning_epoch(ctx.epochs)
        self.scores = torch.full((ctx.num_samples,), INITIAL_SCORE, device=ctx.device)
        self.weights = torch.ones(ctx.num_samples, device=ctx.device)
        self.weighing = False  # whether this epoch weighs its losses: it upweights kept candidates
        # own stream for the draws: the loader's generator (data order, augmentation) stays untouched
        self.generator = torch.Generator(ctx.device).manual_seed(1_000_003 * (ctx.seed + 1))
        self.epoch = {"pruned_samples": 0, "candidates": 0, "upweighted_samples": 0, "selection_s": 0.0}
        self.totals = {"pruning_epochs": 0, "pruned_samples": 0, "selection_s": 0.0, "monitoring_s": 0.0}

    def select(self) -> tuple[torch.Tensor, int, int]:
        """The samples to train (sorted), the number of candidates and of kept candidates; sets the weights."""
        candidates = (self.scores < self.scores.mean()).nonzero().squeeze(1)
        kept = int(self.keep_ratio * len(candidates))  # the reference's count
        order = torch.randperm(len(candidates), generator=self.generator, device=self.ctx.device)
        self.weights.fill_(1.0)
        self.weights[candidates[order[:kept]]] = 1.0 / self.keep_ratio
        trains = torch.ones(self.ctx.num_samples, dtype=torch.bool, device=self.ctx.device)
        trains[candidates[order[kept:]]] = False
        return trains.nonzero().squeeze(1), len(candidates), kept

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        start = time.perf_counter()
        trained, candidates, kept = self.select() if epoch <= self.last_pruning else (None, 0, 0)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)  # once per epoch: the clock measures the selection done
        pruned = candidates - kept
        self.weighing = kept > 0
        self.epoch = {
            "pruned_samples": pruned,
            "candidates": candidates,
            "upweighted_samples": kept,
            "selection_s": time.perf_counter() - start,
        }
        self.totals["pruning_epochs"] += int(pruned > 0)
        self.totals["pruned_samples"] += pruned
        self.totals["selection_s"] += self.epoch["selection_s"]
        return trained if pruned else None  # no candidate (epoch 1) or annealing: every sample

    def loss_weights(self, indices: torch.Tensor) -> torch.Tensor | None:
        if not self.weighing:
            return None
        start = time.perf_counter()
        weights = self.weights[indices]
        self.totals["monitoring_s"] += time.perf_counter() - start
        return weights

    def on_batch_end(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        start = time.perf_counter()
        self.scores[indices] = losses  # the unweighted loss: the sample's latest score
        self.totals["monitoring_s"] += time.perf_counter() - start

    def epoch_metrics(self) -> dict[str, float]:
        return dict(self.epoch)

    def run_metrics(self) -> dict[str, float]:
        t = self.totals
        return {
            "pruning_epochs": float(t["pruning_epochs"]),
            "annealing_epochs": float(self.ctx.epochs - self.last_pruning),
            "pruned_samples_total": float(t["pruned_samples"]),
            "selection_s_total": t["selection_s"],
            "monitoring_s": t["monitoring_s"],
            "overhead_s": t["selection_s"] + t["monitoring_s"],
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "scores": self.scores.detach().cpu().clone(),
            "generator": self.generator.get_state(),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scores.copy_(state["scores"])
        self.generator.set_state(state["generator"])
        self.totals = dict(state["totals"])
