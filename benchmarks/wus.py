"""Benchmark: what a Weight Update Skipping skip epoch costs against a normal epoch, per model, on this machine.

    python benchmarks/wus.py [--models lenet vgg11 resnet18] [--batches N] [--bias-layers 1]

Times single training batches of each model as a WUS run trains it (cheaptrain.trainer.prepare with the WUS recipe of
params.yaml: batch 128, SGD with its momentum and weight decay, channels_last as the trainer runs), each as a
one-batch epoch of the project's own loop (cheaptrain.trainer.train_epoch) with the `wus` method held in one phase:
  - normal:  every parameter trains (forward + full backward + SGD step);
  - skip:    every parameter frozen but the biases of the last --bias-layers layers (default 1: the classifier bias);
  - forward: the same batch through the model in training mode under torch.no_grad(), the floor a skip epoch can
    reach (the paper's "one forward pass").
The images are random (the cost does not depend on pixel values), so no dataset is needed. After an untimed warm-up,
the phases and models take turns batch by batch (normal, skip, forward, then rotated), so that the load of a shared
machine hits every phase alike. Prints, per model, the median time of a batch in each phase, skip/normal (target: at
most 0.35; also from the fastest batch of each phase, the least disturbed), forward/normal and skip/forward (about 1:
a skip epoch costs a forward pass).

Then, for each WUS and WUS+LR configuration of those models in the results ledger (`--ledger`, default ledger/),
what its schedule would save on this machine: the share of its epochs that skip (mean over its seeds, `skip_epochs`
of metrics.json) times 1 - skip/normal here, against its own full epochs; then the same share priced at its runs'
own skip/full epoch time where they trained ("there", at their mean `cheap_time_share`, printed as "skip/full": the
report's "cheaper epoch" column), and the time those runs saved against their own full epochs (`cheaptrain.timing`,
on their device). "There" meets what they measured wherever their skip epochs take one share of a full epoch's time
(the robust estimator is that product), so "here" differs from it by the ratio alone. A schedule trained on a GPU,
where a skip step waits on the host, is so priced as on a CPU like the WUS paper's.
"""

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int
from cheaptrain.aggregate import BASELINE, collapsed, ledger_runs
from cheaptrain.cli import run_command
from cheaptrain.config import load_params, resolve_run
from cheaptrain.data import Split
from cheaptrain.ledger import ledger_root
from cheaptrain.methods.wus import NORMAL, SKIP, WeightUpdateSkipping
from cheaptrain.runner import keep_freed_memory
from cheaptrain.timing import run_time
from cheaptrain.trainer import prepare, train_epoch

REPO = Path(__file__).resolve().parents[1]
TARGET = 0.35
PHASES = ("normal", "skip", "forward")
DEFAULT_BATCHES = {"lenet": 200, "alexnet": 60, "vgg11": 30, "vgg16": 20, "resnet18": 20}  # ~1 min in all, unloaded


class HeldPhase(WeightUpdateSkipping):
    """The `wus` method held in a phase set from outside, training the batch it is told to."""

    held = NORMAL
    indices = torch.arange(0)

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor:
        self.set_phase(self.held)
        return self.indices


class Subject:
    """One model as a WUS run trains it (prepare: the model, its optimizer, the method) on a few batches of random
    images."""

    def __init__(self, name: str, batches: int, bias_layers: int) -> None:
        cfg = resolve_run(load_params(REPO / "params.yaml"), "wus", "cifar10", name, "baseline", 0)
        self.cfg = dataclasses.replace(cfg, device="cpu")
        self.size = self.cfg.recipe.batch_size
        rng = np.random.default_rng(0)
        n = 8 * self.size
        split = Split(
            images=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            labels=rng.integers(0, 10, n).astype(np.int64),
            classes=[str(i) for i in range(10)],
        )
        self.name, self.batches = name, batches
        self.method = HeldPhase(bias_layers=bias_layers)
        self.training = prepare(self.cfg, split, split, self.method)
        self.step = 0
        self.times: dict[str, list[float]] = {p: [] for p in PHASES}

    def run(self, phase: str) -> float:
        """Time one batch of `phase`: a one-batch epoch of the training loop, or a forward pass."""
        self.step += 1
        indices = torch.arange(self.size) + self.size * (self.step % 8)
        t = self.training
        if phase == "forward":
            with torch.no_grad():
                start = time.perf_counter()
                t.model.train()  # BatchNorm as in a skip epoch: batch statistics, running averages updated
                x, y = t.train_data.batch(indices)
                F.cross_entropy(t.model(x), y, reduction="none")
                return time.perf_counter() - start
        self.method.held, self.method.indices = (SKIP if phase == "skip" else NORMAL), indices
        return train_epoch(t, 1, self.cfg.recipe.lr)["epoch_train_s"]


def projections(ratios: dict[str, float], root: Path) -> None:
    """Print what each WUS configuration of the ledger on these models would save here (see the module's doc)."""
    runs = [r for r in ledger_runs(root) if r.study == "wus" and r.model in ratios and r.method != BASELINE]
    groups: dict[tuple[str, str], list] = {}
    for run in sorted(runs, key=lambda r: (list(ratios).index(r.model), r.method, r.seed)):
        if not collapsed(run):
            groups.setdefault((run.model, run.method), []).append(run)
    if not groups:
        print(f"\nno WUS entries of {', '.join(ratios)} in {root}: nothing to project")
        return
    print(f"\nthe ledger's WUS schedules ({root}) at this machine's skip/normal: own time saved %")
    print(f"{'model':<10}{'method':<8}{'seeds':>6}{'skip share':>12}{'here':>8}{'there':>8}{'skip/full':>11}"
          f"{'measured':>10}  measured on")  # fmt: skip
    for (model, method), group in groups.items():
        share = statistics.fmean(r.metrics["skip_epochs"] / r.metrics["epochs"] for r in group)
        timed = [t for r in group if (t := run_time(r.history, f"wus/{r.name}"))]
        measured = f"{statistics.fmean(t.own_saving_pct for t in timed):.1f}" if timed else "—"
        shares = [t.cheap_time_share for t in timed if t.cheap_time_share is not None]  # their skip/full epoch time
        there = statistics.fmean(shares) if shares else None
        at_theirs = f"{100 * share * (1 - there):.1f}" if there is not None else "—"
        devices = ", ".join(sorted({r.device for r in group if r.device}))
        print(f"{model:<10}{method:<8}{len(group):>6}{100 * share:>12.1f}{100 * share * (1 - ratios[model]):>8.1f}"
              f"{at_theirs:>8}{f'{there:.2f}' if there is not None else '—':>11}{measured:>10}  {devices}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["lenet", "vgg11", "resnet18"], help="default: %(default)s")
    parser.add_argument("--batches", type=positive_int, help=f"timed batches per phase (default: {DEFAULT_BATCHES})")
    parser.add_argument("--bias-layers", type=int, default=1, help="methods.wus.bias_layers (default: %(default)s)")
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    args = parser.parse_args()
    keep_freed_memory()  # as the trainer runs

    subjects = [Subject(m, args.batches or DEFAULT_BATCHES.get(m, 20), args.bias_layers) for m in args.models]
    for s in subjects:
        for phase in PHASES * 2:
            s.run(phase)  # warm-up: first-call costs (allocator, oneDNN kernels) stay out of the figures
    for i in range(max(s.batches for s in subjects)):
        order = PHASES[i % 3 :] + PHASES[: i % 3]  # rotate which phase goes first
        for s in subjects:
            if i < s.batches:
                for phase in order:
                    s.times[phase].append(s.run(phase))
        if (i + 1) % 10 == 0:
            print(f"{i + 1} batches per phase timed", file=sys.stderr, flush=True)

    threads = torch.get_num_threads()
    print(f"one batch of {subjects[0].size}, CPU, {threads} threads, bias_layers {args.bias_layers}; ms a batch:")
    print(f"{'model':<10}{'batches':>8}{'normal':>9}{'skip':>8}{'forward':>9}{'skip/normal':>13}{'(fastest)':>10}"
          f"{'fwd/normal':>12}{'skip/fwd':>10}  skip <= {TARGET} normal")  # fmt: skip
    ratios = {}  # skip/normal per model, for the ledger's schedules below
    for s in subjects:
        normal, skip, fwd = (statistics.median(s.times[p]) for p in PHASES)
        ratios[s.name] = skip / normal
        fastest = min(s.times["skip"]) / min(s.times["normal"])
        verdict = "yes" if skip / normal <= TARGET else "no"
        if verdict == "no" and fwd / normal > TARGET:
            verdict += f" (the forward pass alone costs {fwd / normal:.2f})"
        print(f"{s.name:<10}{s.batches:>8}{1e3 * normal:>9.1f}{1e3 * skip:>8.1f}{1e3 * fwd:>9.1f}{skip / normal:>13.2f}"
              f"{fastest:>10.2f}{fwd / normal:>12.2f}{skip / fwd:>10.2f}  {verdict}")  # fmt: skip
    root = args.ledger or ledger_root()
    if root.is_dir() and args.bias_layers == 1:  # the ledger's runs skip with the default
        projections(ratios, root)


if __name__ == "__main__":
    run_command(main)
