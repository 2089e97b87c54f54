"""Benchmark: LeNet's first max-pool, cheaptrain.models.MaxPool2x2 against PyTorch's nn.MaxPool2d(2), on the CPU.

    python benchmarks/pool.py [--repeats 10] [--steps 100]

Two figures, each a ratio of medians over repeats that alternate the two pools, as the trainer runs (channels_last,
batch 128, freed memory kept):
  - the pool alone, forward and backward, on a [128, 6, 28, 28] batch (LeNet's first conv output);
  - whole LeNet training steps (SGD, random batches), with either pool in the first place.
It also checks that both models end bitwise equal after the same steps.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int
from cheaptrain.models import MaxPool2x2, create_model
from cheaptrain.trainer import keep_freed_memory


def seconds(work: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeats", type=positive_int, default=10, help="alternations of the two (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=100, help="training steps per repeat (default: %(default)s)"
    )
    args = parser.parse_args()
    keep_freed_memory()
    generator = torch.Generator().manual_seed(0)

    x = torch.randn(128, 6, 28, 28, generator=generator).to(memory_format=torch.channels_last).requires_grad_()
    grad = torch.randn(128, 6, 14, 14, generator=generator).to(memory_format=torch.channels_last)
    pools = {"nn.MaxPool2d": nn.MaxPool2d(2), "MaxPool2x2": MaxPool2x2()}

    def pool_pass(pool: nn.Module) -> Callable[[], None]:
        return lambda: pool(x).backward(grad)

    batches = [torch.randn(128, 32, 32, 3, generator=generator).permute(0, 3, 1, 2) for _ in range(10)]
    labels = [torch.randint(0, 10, (128,), generator=generator) for _ in range(10)]
    models = {}
    for name, pool in pools.items():
        torch.manual_seed(0)
        model = create_model("lenet", 10)
        model.features[1] = pool
        model = model.to(memory_format=torch.channels_last)
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4))

    def train_steps(name: str) -> Callable[[], None]:
        model, optimizer = models[name]
        step = 0

        def one() -> None:
            nonlocal step
            loss = F.cross_entropy(model(batches[step % 10]), labels[step % 10])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1

        return one

    passes = {name: pool_pass(pool) for name, pool in pools.items()}
    steps = {name: train_steps(name) for name in pools}
    pool_times: dict[str, list[float]] = {name: [] for name in pools}
    step_times: dict[str, list[float]] = {name: [] for name in pools}
    for name in pools:  # warm-up
        seconds(passes[name], 10)
        seconds(steps[name], 10)
    for _ in range(args.repeats):
        for name in pools:
            pool_times[name].append(seconds(passes[name], args.steps) / args.steps)
            step_times[name].append(seconds(steps[name], args.steps) / args.steps)

    same = all(  # bit patterns, not values: torch.equal would also call -0.0 and 0.0 equal
        torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32))
        for a, b in zip(models["nn.MaxPool2d"][0].parameters(), models["MaxPool2x2"][0].parameters(), strict=True)
    )
    print(f"{torch.get_num_threads()} threads, {args.repeats} repeats of {args.steps}, medians:")
    for what, times in (("pool forward+backward", pool_times), ("LeNet training step", step_times)):
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        ratios = [b / a for a, b in zip(times["nn.MaxPool2d"], times["MaxPool2x2"], strict=True)]
        print(
            f"{what}: nn.MaxPool2d {ms['nn.MaxPool2d']:.3f} ms, MaxPool2x2 {ms['MaxPool2x2']:.3f} ms; "
            f"MaxPool2x2 takes {statistics.median(ratios):.2f}x (repeats {min(ratios):.2f}x .. {max(ratios):.2f}x)"
        )
    print(f"both models bitwise equal after {(args.repeats + 1) * args.steps} identical steps: {same}")


if __name__ == "__main__":
    main()
