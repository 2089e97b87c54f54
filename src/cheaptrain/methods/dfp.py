"""Data Fine-Pruning (Li et al., ../shared/papers/data-fine-pruning.md) and its control, random pruning.

The exact rules are those of docs/methods.md, "Data Fine-Pruning", which also gives the defaults' arithmetic.

Monitoring (Algorithm 1): in every training batch, each sample whose loss exceeds the batch's mean loss by more
than `tolerance` (relative) gets dropping_count += 1. The counts live on the training device and are updated from
the losses of the training forward pass, without host synchronisation. At the start of epoch e, if
e mod window == 0, every count is reset: a new window begins. A batch's hook only keeps its (detached) losses and
indices; the counts take them in one vectorised update (`count_pending`) whenever they are read, at the latest
when the next epoch starts: the same counts as a per-batch update, for about a tenth of the cost on CPU, where a
handful of small ops per batch cost more than 0.5% of a LeNet epoch (benchmarks/dfp.py).

Schedule (Algorithm 2): epoch e prunes iff e mod window >= starting_point and e mod block < count. After the first
window the starting point is attenuated, starting_point = int(starting_point / attenuation): once at the start of
each later window (the epochs e mod window == 0; `attenuate_every: window`, the text's reading) or at every epoch
e > window (`attenuate_every: epoch`, the literal pseudo code). `schedule()` computes it once, for planning and for
the run alike.

Selection: a pruning epoch leaves out `prune_num` samples (a count, or a fraction of the training set) and trains
the rest, which the loop shuffles as usual. `dfp` leaves out the highest dropping counts (ties at random);
`random_prune` leaves out samples drawn uniformly at random: the same schedule and the same number, so it tells
whether DFP's choice of samples matters or only the fact that fewer are trained. Both monitor, so their overhead
and per-epoch metrics compare one to one. Selection reads the counts before the reset of a new window: a pruning
epoch at e mod window == 0 (possible once the starting point reaches 0) uses the full last window's counts.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import torch

from cheaptrain import Param, is_int, is_number
from cheaptrain.methods.base import Method, RunContext, register

ATTENUATE_EVERY = ("window", "epoch")


def _is_prune_num(value: Any) -> bool:
    return (is_int(value) and value >= 1) or (isinstance(value, float) and 0 < value < 1)


def schedule(
    epochs: int, window: int, starting_point: int, attenuation: float, attenuate_every: str, block: int, count: int
) -> list[tuple[int, bool]]:
    """(starting point in force, prunes?) of epochs 1..epochs: Algorithm 2, lines 2-6."""
    plan = []
    for e in range(1, epochs + 1):
        if (e > window) if attenuate_every == "epoch" else (e % window == 0):
            starting_point = int(starting_point / attenuation)
        plan.append((starting_point, e % window >= starting_point and e % block < count))
    return plan


def paper_pruning_epochs(epochs: int, window: int, starting_point: int, block: int, count: int) -> int | None:
    """n_prune by the paper's Eq. 3 (epochs divisible by window) or Eq. 4, as printed; None where Eq. 4's partial
    window is shorter than the starting point (its terms go negative). The equations assume a constant starting
    point, and count exactly only when the block grid is aligned with it (block divides window and starting point,
    or count == block); `schedule()` is the reference."""
    w, a, r, c, n = window, starting_point, block, count, epochs
    n_prune = ((w - a) // r * c + (w - a) % r) * (n // w)  # Eq. 3
    if n % w:  # Eq. 4 adds the partial last window
        if n % w < a:
            return None
        n_prune += (n % w - a) // r * c + (n % w - a) % r
    return n_prune


@register("dfp")
class DataFinePruning(Method):
    """Monitor every sample's loss against its batch; in the scheduled epochs, leave out the highest counts."""

    # The defaults plan 85 pruning epochs x 30% = 12.75% of sample-passes saved with the DFP recipe (200 epochs),
    # against the paper's 12.76% on ResNet-18 (docs/methods.md). The paper gives none of them.
    PARAMS: ClassVar[dict[str, Param]] = {
        "tolerance": Param(
            0.1, lambda v: is_number(v) and v >= 0, "a number >= 0 (0.1: a loss 10% above its batch's mean counts)"
        ),
        "window": Param(20, lambda v: is_int(v) and v >= 1, "a positive integer (epochs)"),
        "starting_point": Param(16, lambda v: is_int(v) and v >= 0, "an integer in [0, window - 1]"),
        "attenuation": Param(2.0, lambda v: is_number(v) and v >= 1, "a number >= 1 (1: it never changes)"),
        "attenuate_every": Param("window", lambda v: v in ATTENUATE_EVERY, " | ".join(ATTENUATE_EVERY)),
        "block": Param(2, lambda v: is_int(v) and v >= 1, "a positive integer (epochs)"),
        "count": Param(1, lambda v: is_int(v) and v >= 1, "an integer in [1, block] (pruning epochs per block)"),
        "prune_num": Param(
            0.3, _is_prune_num, "a number of samples (an integer >= 1) or a fraction of the training set in (0, 1)"
        ),
    }

    def cross_check(self) -> list[str]:
        p, key = self.params, f"methods.{self.name}"
        problems = []
        if self.valid("starting_point", "window") and p["starting_point"] >= p["window"]:
            problems.append(
                f"{key}.starting_point: {p['starting_point']!r} is invalid; accepted: an integer in [0, window - 1] = "
                f"[0, {p['window'] - 1}] (e mod window < window)"
            )
        if self.valid("count", "block") and p["count"] > p["block"]:
            problems.append(
                f"{key}.count: {p['count']!r} is invalid; accepted: an integer in [1, block] = [1, {p['block']}] "
                "(pruning epochs per block)"
            )
        return problems

    def check_run(self, ctx: RunContext) -> list[str]:
        key, n, prune_num = f"methods.{self.name}", ctx.num_samples, self.params["prune_num"]
        problems = []
        if not 1 <= self.pruned_per_epoch(n) < n:
            problems.append(
                f"{key}.prune_num: {prune_num!r} prunes {self.pruned_per_epoch(n)} of the {n} training samples; "
                f"accepted: 1 to {n - 1} samples (a fraction is rounded to a number of samples)"
            )
        if not any(prunes for _, prunes in self.planned(ctx.epochs)):
            problems.append(
                f"{key}: the schedule plans no pruning epoch in this run's {ctx.epochs} epochs (window "
                f"{self.params['window']}, starting_point {self.params['starting_point']}); lower starting_point or "
                "window"
            )
        return problems

    def pruned_per_epoch(self, num_samples: int) -> int:
        """Samples a pruning epoch leaves out: prune_num, a fraction of the training set rounded to a count."""
        prune_num = self.params["prune_num"]
        return round(prune_num * num_samples) if isinstance(prune_num, float) else prune_num

    def planned(self, epochs: int) -> list[tuple[int, bool]]:
        """This method's schedule over `epochs` epochs (see `schedule`)."""
        p = self.params
        return schedule(
            epochs, p["window"], p["starting_point"], p["attenuation"], p["attenuate_every"], p["block"], p["count"]
        )

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        self.factor = 1.0 + self.params["tolerance"]  # flagged: loss > batch mean * factor
        self.window: int = self.params["window"]
        self.num_pruned = self.pruned_per_epoch(ctx.num_samples)
        self.plan = self.planned(ctx.epochs)
        n = ctx.num_samples
        self._counts = torch.zeros(n, dtype=torch.int32, device=ctx.device)  # dropping_count
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # this epoch's (indices, losses), not yet counted
        # own stream for ties and random picks: the loader's generator (data order, augmentation) stays untouched
        self.generator = torch.Generator(ctx.device).manual_seed(1_000_003 * (ctx.seed + 1))
        self.starting_point = self.params["starting_point"]
        self.pruned = 0  # this epoch
        self.selection_s = 0.0  # this epoch
        self.counts_at_start = torch.zeros((), dtype=torch.int64, device=ctx.device)
        self.totals = {"pruning_epochs": 0, "pruned_samples": 0, "selection_s": 0.0, "monitoring_s": 0.0}

    def select(self) -> torch.Tensor:
        """Indices of the samples to train: all but the `num_pruned` highest counts, ties at random."""
        n = self.ctx.num_samples
        # integer counts plus a uniform [0, 1) key: orders by count, and at random within equal counts
        keys = torch.rand(n, generator=self.generator, device=self.ctx.device, dtype=torch.float64)
        keys += self.counts.double()  # same dtypes: a mixed-dtype in-place add is 30x slower on CPU
        return torch.topk(keys, n - self.num_pruned, largest=False, sorted=False).indices.sort().values

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor | None:
        self.count_pending()  # the last epoch's batches, timed as monitoring, not as selection
        start = time.perf_counter()
        self.starting_point, prunes = self.plan[epoch - 1]
        kept = self.select() if prunes else None  # before the reset: see the module docstring
        if epoch % self.window == 0:
            self.counts.zero_()  # Algorithm 1, lines 1-3: a new window
        self.counts_at_start = self.counts.sum()  # flagged_samples = the increase over this epoch
        self.pruned = self.num_pruned if prunes else 0
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)  # once per epoch: the clock measures the selection done
        self.selection_s = time.perf_counter() - start
        self.totals["pruning_epochs"] += int(prunes)
        self.totals["pruned_samples"] += self.pruned
        self.totals["selection_s"] += self.selection_s
        return kept

    def on_batch_end(self, indices: torch.Tensor, losses: torch.Tensor) -> None:
        start = time.perf_counter()
        self.pending.append((indices, losses))
        self.totals["monitoring_s"] += time.perf_counter() - start

    @property
    def counts(self) -> torch.Tensor:
        """dropping_count, with every batch seen so far counted."""
        self.count_pending()
        return self._counts

    def count_pending(self) -> None:
        """Add the batches kept by on_batch_end to the counts, in one vectorised update. Host time, without
        synchronisation: on CPU (synchronous ops) the whole cost; on CUDA the launch cost of a few kernels, whose
        device time (microseconds an epoch) is not included."""
        if not self.pending:
            return
        start = time.perf_counter()
        device = self._counts.device
        sizes = torch.tensor([len(i) for i, _ in self.pending], device=device)
        indices = torch.cat([i for i, _ in self.pending])
        losses = torch.cat([loss for _, loss in self.pending])
        batch = torch.repeat_interleave(sizes)  # the batch of each loss
        means = torch.zeros(len(sizes), dtype=losses.dtype, device=device).index_add_(0, batch, losses) / sizes
        flagged = losses > means[batch] * self.factor  # Algorithm 1: above the batch mean by the tolerance
        self._counts.index_add_(0, indices, flagged.int())  # repeated indices accumulate
        self.pending.clear()
        self.totals["monitoring_s"] += time.perf_counter() - start

    def epoch_metrics(self) -> dict[str, float]:
        flagged, count_max = torch.stack([self.counts.sum() - self.counts_at_start, self.counts.max().long()]).tolist()
        return {
            "pruned_samples": self.pruned,
            "flagged_samples": flagged,
            "dropping_count_max": count_max,
            "selection_s": self.selection_s,
        }

    def run_metrics(self) -> dict[str, float]:
        epochs, n = self.ctx.epochs, self.ctx.num_samples
        planned = sum(prunes for _, prunes in self.plan)
        t = self.totals
        metrics = {
            "planned_pruning_epochs": float(planned),
            "planned_saving_pct": 100.0 * planned * self.num_pruned / (epochs * n),
            "pruning_epochs": float(t["pruning_epochs"]),
            "pruned_samples_total": float(t["pruned_samples"]),
            "selection_s_total": t["selection_s"],
            "monitoring_s": t["monitoring_s"],
            "overhead_s": t["selection_s"] + t["monitoring_s"],
        }
        if len({sp for sp, _ in self.plan}) == 1:  # Eq. 3/4 have no attenuation: a constant starting point
            p = self.params
            eq = paper_pruning_epochs(epochs, p["window"], p["starting_point"], p["block"], p["count"])
            if eq is not None:
                metrics["planned_pruning_epochs_eq"] = float(eq)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts.detach().cpu().clone(),
            "starting_point": self.starting_point,  # informative: schedule() gives it for every epoch
            "generator": self.generator.get_state(),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts.copy_(state["counts"])
        self.starting_point = state["starting_point"]
        self.generator.set_state(state["generator"])
        self.totals = dict(state["totals"])


@register("random_prune")
class RandomPrune(DataFinePruning):
    """DFP's schedule and number of samples left out, the samples drawn uniformly at random each pruning epoch."""

    def select(self) -> torch.Tensor:
        n = self.ctx.num_samples
        perm = torch.randperm(n, generator=self.generator, device=self.ctx.device)
        return perm[self.num_pruned :].sort().values
