"""Benchmark: one LeNet training epoch of this project's loop against the bare model's own steps and against a
conventional PyTorch input pipeline.

    python benchmarks/loader.py [--data data/prepared/cifar10] [--repeats 5]

Every loop trains the same model from the same initial weights with the DFP recipe of params.yaml (SGD, batch 128,
random crop with 4-pixel padding and horizontal flip) on the prepared CIFAR-10 training split, in the same process:
  - this loop: cheaptrain.trainer.train_epoch on what cheaptrain.trainer.prepare builds, as a run trains: the split
    on the device as one uint8 tensor, crop, flip and normalisation as tensor ops over the batch, per-sample losses
    handed to the method's hooks (the baseline's), channels_last;
  - this loop, NCHW: the same with train.channels_last off, so that the layout's share of the speed-up is visible;
  - the bare model: the same SGD steps on the very batches this loop trains on (the same seeded shuffle and crops),
    made beforehand: no loading, no hooks, the floor of any loop (making the batches is timed apart);
  - the bare model, batches in the loop: the same steps, each batch made just before it as this loop makes it,
    so that this loop's time above the bare model's splits into making the batches and the rest (per-sample losses,
    the method's hooks, the bookkeeping);
  - conventional: torchvision RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize in a Dataset
    of PIL images, DataLoader(batch_size=128, shuffle=True, num_workers=2), the NCHW model.
Target: this loop within 1.15x of the bare model's own time. The loops alternate so that machine noise hits all of
them; each ratio is taken per repeat between epochs run next to each other, and the median over the repeats is
printed with their range.

The trainer's process keeps freed memory (cheaptrain.runner.keep_freed_memory); so does this script's, the
conventional loop and its workers included. `--default-malloc` leaves glibc's default, to see what the setting is
worth: the script prints this process's page faults in each timed epoch.
"""

import argparse
import dataclasses
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int
from cheaptrain.cli import run_command
from cheaptrain.config import RunConfig, load_params, resolve_run
from cheaptrain.data import channel_stats, load_split
from cheaptrain.methods import Method
from cheaptrain.runner import keep_freed_memory
from cheaptrain.trainer import Training, prepare, train_epoch

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.15  # this loop's time / the bare model's own time


class PILDataset(Dataset):
    """The usual CIFAR Dataset: a PIL image per sample, torchvision transforms in the worker processes."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def plain_epoch(t: Training, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Seconds of one epoch of plain SGD steps of `t`'s model over `batches` (a DataLoader, or ready batches)."""
    start = time.perf_counter()
    t.model.train()
    for x, y in batches:
        loss = F.cross_entropy(t.model(x), y)
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.optimizer.step()
    return time.perf_counter() - start


def batches_in_loop(t: Training) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches train_epoch makes for `t` in its first epoch (the same draws from its generator, in order), each
    made when the loop asks for it, as train_epoch makes them."""
    order = torch.randperm(len(t.train_data), generator=t.generator, device=t.train_data.device)
    for b in order.split(t.cfg.recipe.batch_size):
        yield t.train_data.batch(b, t.cfg.recipe.augment, t.generator)


def epoch_batches(t: Training) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same batches, all made beforehand."""
    return list(batches_in_loop(t))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/prepared/cifar10", help="prepared dataset (the download stage's)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="epochs of each loop (default: %(default)s)")
    parser.add_argument("--model", default="lenet", help="model (default: %(default)s)")
    parser.add_argument("--default-malloc", action="store_true", help="do not keep freed memory (see above)")
    args = parser.parse_args()
    if not args.default_malloc:
        keep_freed_memory()
    if not (Path(args.data) / "train.npz").is_file():
        sys.exit(f"error: no prepared data in {args.data}: run `make quickstart`, or pass --data")

    train_split, test_split = load_split(Path(args.data), "train"), load_split(Path(args.data), "test")
    cfg = dataclasses.replace(
        resolve_run(load_params(REPO / "params.yaml"), "dfp", "cifar10", args.model, "baseline", 0), device="cpu"
    )
    nchw = dataclasses.replace(cfg, channels_last=False)
    mean, std = channel_stats(torch.from_numpy(train_split.images))
    conventional = DataLoader(
        PILDataset(train_split.images, train_split.labels, transforms.Compose([
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean.tolist(), std.tolist()),
        ])),
        batch_size=cfg.recipe.batch_size, shuffle=True, num_workers=2,
    )  # fmt: skip

    def fresh(config: RunConfig) -> Training:
        return prepare(config, train_split, test_split, Method())  # seeded: the same weights and draws every time

    faults: dict[str, list[int]] = {}  # this process's minor page faults during each timed epoch
    batches_alone: list[float] = []  # seconds to make an epoch's batches, outside any training loop

    def counted(name: str, epoch: Callable[[], float]) -> float:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = epoch()
        faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return seconds

    def ours(config: RunConfig, name: str) -> float:
        t = fresh(config)
        return counted(name, lambda: train_epoch(t, 1, config.recipe.lr)["epoch_train_s"])

    def bare_model() -> float:
        t = fresh(cfg)
        start = time.perf_counter()
        batches = epoch_batches(t)
        batches_alone.append(time.perf_counter() - start)
        return counted("bare model", lambda: plain_epoch(t, batches))

    def bare_model_making_batches() -> float:
        t = fresh(cfg)
        return counted("bare model, batches in the loop", lambda: plain_epoch(t, batches_in_loop(t)))

    def conventional_epoch() -> float:
        t = fresh(nchw)
        return counted("conventional", lambda: plain_epoch(t, conventional))

    loops: dict[str, Callable[[], float]] = {
        "conventional": conventional_epoch,
        "this loop": lambda: ours(cfg, "this loop"),
        "this loop, NCHW": lambda: ours(nchw, "this loop, NCHW"),
        "bare model": bare_model,
        "bare model, batches in the loop": bare_model_making_batches,
    }
    times: dict[str, list[float]] = {name: [] for name in loops}
    for repeat in range(args.repeats):
        for name, loop in loops.items():
            times[name].append(loop())
        print(f"repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

    median = {k: statistics.median(v) for k, v in times.items()}
    malloc = "default malloc" if args.default_malloc else "freed memory kept"
    threads = f"{(n := torch.get_num_threads())} thread{'s' * (n != 1)}"
    print(
        f"\n{args.model}, one training epoch over {len(train_split.labels)} images, torch {torch.__version__}, "
        f"{threads}, {malloc}, median of {args.repeats}: " + ", ".join(f"{k} {v:.2f} s" for k, v in median.items())
    )
    print("page faults of this process in an epoch, median: " + ", ".join(
        f"{k} {statistics.median(v):,.0f}" for k, v in faults.items()
    ))  # fmt: skip

    def above(a: str, b: str) -> float:
        """Median over the repeats of a's seconds minus b's, each from epochs run next to each other."""
        return statistics.median(x - y for x, y in zip(times[a], times[b], strict=True))

    inline = "bare model, batches in the loop"
    making, rest = above(inline, "bare model"), above("this loop", inline)
    print(
        f"this loop's time above the bare model's: {above('this loop', 'bare model'):.3f} s; of it, making the batches "
        f"in the loop {making:.3f} s (making them alone, outside any loop: {statistics.median(batches_alone):.3f} s), "
        f"the rest (per-sample losses, the method's hooks, the bookkeeping) {rest:.3f} s (medians over the repeats)"
    )

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        """Median, min and max over the repeats of a / b, each from epochs run next to each other."""
        ratios = [x / y for x, y in zip(times[a], times[b], strict=True)]
        return statistics.median(ratios), min(ratios), max(ratios)

    def show(what: str, r: tuple[float, float, float], end: str = "") -> None:
        print(f"{what}: {r[0]:.2f}x (repeats {r[1]:.2f}x .. {r[2]:.2f}x){end}")

    show("speed-up of this loop over the conventional one (as the trainer runs it, channels_last)",
         ratio("conventional", "this loop"))  # fmt: skip
    show("speed-up of this loop, NCHW, over the conventional one (the loader's share)",
         ratio("conventional", "this loop, NCHW"))  # fmt: skip
    show("speed-up of the bare model over the conventional loop (a free loader's ceiling)",
         ratio("conventional", "bare model"))  # fmt: skip
    own = ratio("this loop", "bare model")
    show("this loop's time / the bare model's own time", own,
         f"; target within {TARGET:.2f}x: {'held' if own[0] <= TARGET else 'NOT held'}")  # fmt: skip


if __name__ == "__main__":
    run_command(main)
