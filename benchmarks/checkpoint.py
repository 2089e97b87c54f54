"""Benchmark: what a run's checkpoint after each epoch costs its training loop (cheaptrain.runner.Recorder), written in
line (the epoch waits for the file on disk) against written in a thread while the next epoch trains (the runner's
way: the epoch waits only for the checkpoint's bytes).

    python benchmarks/checkpoint.py [--model resnet18] [--epoch-s 1.4] [--epochs 4] [--repeats 3]

The state is the model's weights and its SGD momentum, as a run checkpoints them (ResNet-18: about 90 MB). An epoch is
a fixed amount of matrix products, sized to take --epoch-s seconds alone (1.4 s: a ResNet-18 epoch on an H100). The
two ways and epochs without a checkpoint take turns, --repeats times, each for --epochs epochs (the first of each
turn left out); each epoch's time counts its checkpoint. Printed: each way's median epoch, its cost over an epoch
without a checkpoint, and the ratio of the two ways' medians.
"""

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from cheaptrain import atomic_write, positive_int
from cheaptrain.models import MODELS, create_model
from cheaptrain.runner import checkpoint_bytes


def model_state(name: str) -> dict:
    """A model's weights and SGD momentum after one step, as a run's checkpoint holds them."""
    model = create_model(name, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def products_for(seconds: float) -> int:
    """How many 512x512 matrix products take `seconds` here, alone."""
    a = torch.randn(512, 512)
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 0.5:
        a @ a
        n += 1
    return max(1, round(n * seconds / (time.perf_counter() - start)))


def epochs(products: int, count: int, state: dict, path: Path, way: str) -> list[float]:
    """Seconds of each of `count` epochs, each ending with a checkpoint written in line, or behind the next epoch, or
    none."""
    a, times = torch.randn(512, 512), []
    with ThreadPoolExecutor(max_workers=1) as writer:
        writing = None
        for _ in range(count):
            start = time.perf_counter()
            for _ in range(products):
                a @ a
            if writing is not None:
                writing.result()  # as Recorder.settle: the previous checkpoint is on disk
            if way == "behind":
                writing = writer.submit(atomic_write, path, checkpoint_bytes(state))
            elif way == "in line":
                atomic_write(path, checkpoint_bytes(state))
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=list(MODELS), help="whose state (default: %(default)s)")
    parser.add_argument("--epoch-s", type=float, default=1.4, help="an epoch's seconds alone (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=4, help="epochs per turn, >= 2 (default: %(default)s)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="turns of each way (default: %(default)s)")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error(f"--epochs {args.epochs}: at least 2 (the first epoch of each turn is left out)")
    state = model_state(args.model)
    size = len(checkpoint_bytes(state)) / 1e6
    products = products_for(args.epoch_s)
    times: dict[str, list[float]] = {"none": [], "in line": [], "behind": []}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as folder:  # the disk a run's checkpoints/ is on
        for _ in range(args.repeats):
            for way in times:
                times[way] += epochs(products, args.epochs, state, Path(folder) / "checkpoint.pt", way)[1:]
    medians = {way: statistics.median(values) for way, values in times.items()}
    print(f"{args.model}: a {size:.0f} MB checkpoint after each epoch of about {args.epoch_s} s ({products} matrix "
          f"products), {args.repeats} turns of {args.epochs} epochs each way, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    for way, median in medians.items():
        print(f"  {way:8} {median:.3f} s an epoch (median), {median / medians['none'] - 1:+.1%} on an epoch without")
    print(f"behind / in line: {medians['behind'] / medians['in line']:.3f}")


if __name__ == "__main__":
    main()
