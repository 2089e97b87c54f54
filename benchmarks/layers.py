"""Benchmark: LeNet's two CPU layers against PyTorch's own, alone and in whole training steps.

    python benchmarks/layers.py [--repeats 10] [--steps 100]

LeNet's first max-pool is cheaptrain.models.MaxPool2x2 (against nn.MaxPool2d(2)) and its second conv is
cheaptrain.models.Conv2dNCHWInputGrad (against nn.Conv2d). Every figure is a ratio of medians over repeats that
alternate the contenders, as the trainer runs (channels_last, batch 128, freed memory kept):
  - each layer alone, forward and backward, on LeNet's shapes ([128, 6, 28, 28] in for the pool, [128, 6, 14, 14]
    for the conv);
  - whole LeNet training steps (SGD, random batches) with PyTorch's two layers, with only the pool swapped, and as
    create_model("lenet") builds it.
It also checks that the model with only the pool swapped ends bitwise equal to PyTorch's after the same steps (the
conv's input gradient differs in float rounding, so the full model drifts apart: the script prints by how much).
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
from cheaptrain.models import Conv2dNCHWInputGrad, MaxPool2x2, create_model
from cheaptrain.trainer import keep_freed_memory


def seconds(work: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        work()
    return time.perf_counter() - start


def lenet(pool: nn.Module, conv: nn.Conv2d) -> tuple[nn.Module, torch.optim.Optimizer]:
    """LeNet with `pool` first and `conv` second, the same initial weights every time."""
    torch.manual_seed(0)
    model = create_model("lenet", 10)
    conv.load_state_dict(model.features[3].state_dict())
    model.features[1], model.features[3] = pool, conv
    model = model.to(memory_format=torch.channels_last)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repeats", type=positive_int, default=10, help="alternations of the contenders (default: %(default)s)"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=100, help="passes or training steps per repeat (default: %(default)s)"
    )
    args = parser.parse_args()
    keep_freed_memory()
    generator = torch.Generator().manual_seed(0)

    def layer_pass(layer: nn.Module, shape: tuple[int, ...]) -> Callable[[], None]:
        x = torch.randn(shape, generator=generator).to(memory_format=torch.channels_last).requires_grad_()
        with torch.no_grad():
            grad = torch.randn(layer(x).shape, generator=generator).to(memory_format=torch.channels_last)
        return lambda: layer(x).backward(grad)

    conv = nn.Conv2d(6, 16, kernel_size=5).to(memory_format=torch.channels_last)
    ours_conv = Conv2dNCHWInputGrad(6, 16, kernel_size=5).to(memory_format=torch.channels_last)
    layers = {  # contenders per layer: PyTorch's first
        "pool": {"nn.MaxPool2d": layer_pass(nn.MaxPool2d(2), (128, 6, 28, 28)),
                 "MaxPool2x2": layer_pass(MaxPool2x2(), (128, 6, 28, 28))},
        "conv": {"nn.Conv2d": layer_pass(conv, (128, 6, 14, 14)),
                 "Conv2dNCHWInputGrad": layer_pass(ours_conv, (128, 6, 14, 14))},
    }  # fmt: skip

    batches = [torch.randn(128, 32, 32, 3, generator=generator).permute(0, 3, 1, 2) for _ in range(10)]
    labels = [torch.randint(0, 10, (128,), generator=generator) for _ in range(10)]
    models = {
        "PyTorch's layers": lenet(nn.MaxPool2d(2), nn.Conv2d(6, 16, kernel_size=5)),
        "MaxPool2x2 only": lenet(MaxPool2x2(), nn.Conv2d(6, 16, kernel_size=5)),
        "both (create_model)": lenet(MaxPool2x2(), Conv2dNCHWInputGrad(6, 16, kernel_size=5)),
    }
    assert [type(m) for m in models["both (create_model)"][0].modules()] == [
        type(m) for m in create_model("lenet", 10).modules()
    ]

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

    contests = {**layers, "LeNet training step": {name: train_steps(name) for name in models}}
    times = {what: {name: [] for name in works} for what, works in contests.items()}
    for works in contests.values():  # warm-up
        for work in works.values():
            seconds(work, 10)
    for _ in range(args.repeats):
        for what, works in contests.items():
            for name, work in works.items():
                times[what][name].append(seconds(work, args.steps) / args.steps)

    print(f"{torch.get_num_threads()} threads, {args.repeats} repeats of {args.steps}, medians:")
    for what, by_name in times.items():
        print(f"{what}: " + ", ".join(f"{name} {statistics.median(t) * 1e3:.3f} ms" for name, t in by_name.items()))
        names = list(by_name)
        for i, name in enumerate(names[1:], 1):
            for base in names[:i]:  # each against every earlier contender
                ratios = [b / a for a, b in zip(by_name[base], by_name[name], strict=True)]
                print(
                    f"  {name} takes {statistics.median(ratios):.2f}x of {base} "
                    f"(repeats {min(ratios):.2f}x .. {max(ratios):.2f}x)"
                )

    steps = (args.repeats + 1) * args.steps
    pytorch = list(models["PyTorch's layers"][0].parameters())
    same = all(  # bit patterns, not values: torch.equal would also call -0.0 and 0.0 equal
        torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32))
        for a, b in zip(pytorch, models["MaxPool2x2 only"][0].parameters(), strict=True)
    )
    drift = max(
        (a - b).abs().max().item() for a, b in zip(pytorch, models["both (create_model)"][0].parameters(), strict=True)
    )
    print(
        f"after {steps} identical steps: MaxPool2x2 only bitwise equal to PyTorch's layers: {same}; "
        f"largest parameter difference of both against PyTorch's layers: {drift:.2g}"
    )


if __name__ == "__main__":
    main()
