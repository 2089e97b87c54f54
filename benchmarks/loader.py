"""Benchmark: one LeNet training epoch of this project's loop against a conventional PyTorch input pipeline.

    python benchmarks/loader.py [--data data/prepared/cifar10] [--repeats 5]

Both loops train the same model (LeNet, SGD, batch 128) on the same prepared CIFAR-10 training split, with the same
augmentation (random crop with 4-pixel padding, horizontal flip), in the same process:
  - this project: the split lives on the device as one uint8 tensor; crop, flip and normalisation are tensor ops
    over the batch (cheaptrain.trainer.train_epoch);
  - conventional: torchvision RandomCrop(32, padding=4) + RandomHorizontalFlip + ToTensor + Normalize in a Dataset
    of PIL images, DataLoader(batch_size=128, shuffle=True, num_workers=2).
The trainer also keeps tensors channels_last (NHWC), which speeds up the model's own compute on CPU; the script times
this loop with and without it, so the loader's own share of the speed-up is visible. A fourth timing, the model's
steps on batches made beforehand, with no loading at all, gives the ceiling any loader could reach. The loops
alternate so that machine noise hits all of them; the script prints every epoch time and the ratios of the medians.

The trainer sets glibc's malloc to keep freed memory (cheaptrain.trainer.keep_freed_memory); the script does the
same at start, so every loop, the conventional one and its workers included, runs under it. `--default-malloc`
leaves glibc's default, to see what the setting is worth: the script prints this process's page faults in each
timed epoch. It also times making an epoch's batches on their own, against this loop's time above the model's.
"""

import argparse
import contextlib
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int
from cheaptrain.data import DeviceData, channel_stats
from cheaptrain.methods import Method
from cheaptrain.models import create_model
from cheaptrain.prepare import load_split
from cheaptrain.trainer import keep_freed_memory, train_epoch


class PILDataset(Dataset):
    """The usual CIFAR Dataset: a PIL image per sample, torchvision transforms in the worker processes."""

    def __init__(self, images, labels, transform) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def plain_epoch(model, optimizer, batches) -> float:
    """Seconds of one epoch of plain SGD steps over `batches` (a DataLoader, or a list of ready batches)."""
    start = time.perf_counter()
    model.train()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/prepared/cifar10", help="prepared dataset (the download stage's)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="epochs of each loop (default: %(default)s)")
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--default-malloc", action="store_true", help="do not keep freed memory (see above)")
    args = parser.parse_args()
    if not args.default_malloc:
        keep_freed_memory()

    split = load_split(Path(args.data), "train")
    mean, std = channel_stats(torch.from_numpy(split.images))
    device = torch.device("cpu")
    conventional = DataLoader(
        PILDataset(split.images, split.labels, transforms.Compose([
            transforms.RandomCrop(32, padding=4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean.tolist(), std.tolist()),
        ])),
        batch_size=128, shuffle=True, num_workers=2,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)

    def fresh():
        torch.manual_seed(0)
        model = create_model(args.model, len(split.classes))
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)

    faults: dict[str, list[int]] = {}  # this process's minor page faults during each timed epoch
    batches_alone: list[float] = []  # seconds to make an epoch's batches, outside any training loop

    def counted(name: str, epoch: Callable[[], float]) -> float:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = epoch()
        faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return seconds

    def conventional_epoch() -> float:
        model, optimizer = fresh()
        return counted("conventional", lambda: plain_epoch(model, optimizer, conventional))

    def ours(channels_last: bool) -> float:
        model, optimizer = fresh()
        data = DeviceData(split, device, mean, std, channels_last)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        method = Method()
        method.setup(None)
        epoch_args = (model, optimizer, data, method, 1, 0.01, 128, True, generator, contextlib.nullcontext())

        def epoch() -> float:
            return train_epoch(*epoch_args)["epoch_train_s"]

        return counted("ours" if channels_last else "ours, NCHW", epoch)

    def model_only() -> float:
        """The same steps on batches made beforehand (timed apart): the floor of any loop for this model."""
        model, optimizer = fresh()
        model = model.to(memory_format=torch.channels_last)
        data = DeviceData(split, device, mean, std, channels_last=True)
        order = torch.randperm(len(split.labels), generator=generator)
        start = time.perf_counter()
        batches = [data.batch(b, augment=True, generator=generator) for b in order.split(128)]
        batches_alone.append(time.perf_counter() - start)
        return counted("model only", lambda: plain_epoch(model, optimizer, batches))

    times: dict[str, list[float]] = {"conventional": [], "ours": [], "ours, NCHW": [], "model only": []}
    for repeat in range(args.repeats):
        times["conventional"].append(conventional_epoch())
        times["ours"].append(ours(channels_last=True))
        times["ours, NCHW"].append(ours(channels_last=False))
        times["model only"].append(model_only())
        print(f"repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    malloc = "default malloc" if args.default_malloc else "freed memory kept"
    print(
        f"\n{args.model}, one training epoch over {len(split.labels)} images, {torch.get_num_threads()} threads, "
        f"{malloc}, median of {args.repeats}: " + ", ".join(f"{k} {v:.2f} s" for k, v in median.items())
    )
    print("page faults of this process in an epoch, median: " + ", ".join(
        f"{k} {statistics.median(v):,.0f}" for k, v in faults.items()
    ))  # fmt: skip
    extra = statistics.median(x - y for x, y in zip(times["ours"], times["model only"], strict=True))
    print(
        f"making an epoch's batches alone: {statistics.median(batches_alone):.3f} s; this loop's time above the "
        f"model's own steps: {extra:.3f} s (median over the repeats)"
    )

    def ratio(a: str, b: str) -> tuple[float, float, float]:
        """Median, min and max over the repeats of a / b, each from epochs run next to each other."""
        ratios = [x / y for x, y in zip(times[a], times[b], strict=True)]
        return statistics.median(ratios), min(ratios), max(ratios)

    def show(what: str, r: tuple[float, float, float]) -> None:
        print(f"{what}: {r[0]:.2f}x (repeats {r[1]:.2f}x .. {r[2]:.2f}x)")

    speedup = ratio("conventional", "ours")
    show("speed-up of this loop (as the trainer runs it, channels_last)", speedup)
    show("speed-up from the loader alone (NCHW model, as the conventional loop)", ratio("conventional", "ours, NCHW"))
    show(
        "ceiling with a free loader (the model's own steps on batches made beforehand)",
        ratio("conventional", "model only"),
    )
    print(
        f"this loop takes {ratio('ours', 'model only')[0]:.2f}x the model's own time; "
        f"target 3.5x: {'met' if speedup[0] >= 3.5 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
