"""Benchmark: what a Weight Update Skipping skip epoch costs against a normal epoch, per model, on this machine.

    python benchmarks/wus.py [--models lenet vgg11 resnet18] [--batches N] [--bias-layers 1]

Times single training batches (batch 128, SGD with the WUS recipe's momentum and weight decay, channels_last as the
trainer runs on CPU), each as a one-batch epoch of the project's own loop (cheaptrain.trainer.train_epoch) with the
`wus` method held in one phase:
  - normal:  every parameter trains (forward + full backward + SGD step);
  - skip:    every parameter frozen but the biases of the last --bias-layers layers (default 1: the classifier bias);
  - forward: the same batch through the model in training mode under torch.no_grad(), the floor a skip epoch can
    reach (what the issue calls "one forward pass").
The images are random (the cost does not depend on pixel values), so no dataset is needed. After an untimed warm-up,
the phases and models take turns batch by batch (normal, skip, forward, then rotated), so that the load of a shared
machine hits every phase alike. Prints, per model, the median time of a batch in each phase, skip/normal (target: at
most 0.35; also from the fastest batch of each phase, the least disturbed), forward/normal and skip/forward (about 1:
a skip epoch costs a forward pass).
"""

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int
from cheaptrain.data import DeviceData, channel_stats
from cheaptrain.methods import RunContext
from cheaptrain.methods.wus import NORMAL, SKIP, WeightUpdateSkipping
from cheaptrain.models import create_model
from cheaptrain.prepare import Split
from cheaptrain.trainer import keep_freed_memory, train_epoch

BATCH = 128
TARGET = 0.35
PHASES = ("normal", "skip", "forward")
DEFAULT_BATCHES = {"lenet": 200, "alexnet": 60, "vgg11": 30, "vgg16": 20, "resnet18": 20}  # ~1 min in all, unloaded


class HeldPhase(WeightUpdateSkipping):
    """The `wus` method held in a phase set from outside, training the batch it is told to."""

    held = NORMAL
    indices = torch.arange(BATCH)

    def on_epoch_start(self, epoch: int, lr: float) -> torch.Tensor:
        self.set_phase(self.held)
        return self.indices


class Subject:
    """One model with its optimizer, its method and a few batches of random images."""

    def __init__(self, name: str, batches: int, bias_layers: int) -> None:
        rng = np.random.default_rng(0)
        n = 8 * BATCH
        split = Split(
            images=rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            labels=rng.integers(0, 10, n).astype(np.int64),
            classes=[str(i) for i in range(10)],
        )
        mean, std = channel_stats(torch.from_numpy(split.images))
        self.name, self.batches = name, batches
        self.data = DeviceData(split, torch.device("cpu"), mean, std, channels_last=True)
        torch.manual_seed(0)
        self.model = create_model(name, 10).to(memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
        self.method = HeldPhase(bias_layers=bias_layers)
        self.method.setup(RunContext(self.model, n, 1, torch.device("cpu"), 0, lambda epoch: 0.01))
        self.generator = torch.Generator().manual_seed(0)
        self.step = 0
        self.times: dict[str, list[float]] = {p: [] for p in PHASES}

    def run(self, phase: str) -> float:
        """Time one batch of `phase`: a one-batch epoch of the training loop, or a forward pass."""
        self.step += 1
        indices = torch.arange(BATCH) + BATCH * (self.step % 8)
        if phase == "forward":
            with torch.no_grad():
                start = time.perf_counter()
                self.model.train()  # BatchNorm as in a skip epoch: batch statistics, running averages updated
                x, y = self.data.batch(indices)
                F.cross_entropy(self.model(x), y, reduction="none")
                return time.perf_counter() - start
        self.method.held, self.method.indices = (SKIP if phase == "skip" else NORMAL), indices
        return train_epoch(
            self.model, self.optimizer, self.data, self.method, 1, 0.01, BATCH, False, self.generator,
            contextlib.nullcontext(),
        )["epoch_train_s"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["lenet", "vgg11", "resnet18"], help="default: %(default)s")
    parser.add_argument("--batches", type=positive_int, help=f"timed batches per phase (default: {DEFAULT_BATCHES})")
    parser.add_argument("--bias-layers", type=int, default=1, help="methods.wus.bias_layers (default: %(default)s)")
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

    print(f"one batch of {BATCH}, CPU, {torch.get_num_threads()} threads, bias_layers {args.bias_layers}; ms a batch:")
    print(f"{'model':<10}{'batches':>8}{'normal':>9}{'skip':>8}{'forward':>9}{'skip/normal':>13}{'(fastest)':>10}"
          f"{'fwd/normal':>12}{'skip/fwd':>10}  skip <= {TARGET} normal")  # fmt: skip
    for s in subjects:
        normal, skip, fwd = (statistics.median(s.times[p]) for p in PHASES)
        fastest = min(s.times["skip"]) / min(s.times["normal"])
        verdict = "yes" if skip / normal <= TARGET else "no"
        if verdict == "no" and fwd / normal > TARGET:
            verdict += f" (the forward pass alone costs {fwd / normal:.2f})"
        print(f"{s.name:<10}{s.batches:>8}{1e3 * normal:>9.1f}{1e3 * skip:>8.1f}{1e3 * fwd:>9.1f}{skip / normal:>13.2f}"
              f"{fastest:>10.2f}{fwd / normal:>12.2f}{skip / fwd:>10.2f}  {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
