"""Benchmark: a compiled training step specialised to the batch size (trainer.Training.step_model compiles with
`dynamic=False` and runs a shorter last batch uncompiled) against one compiled for any batch size (a dynamic batch
dimension: what torch.compile makes of a model once it sees a second size, as an epoch's last batch is).

    python benchmarks/shapes.py [--model lenet] [--device cpu] [--setting default] [--batches 20] [--epochs 5]

Two runs of the model (batch 128, SGD with momentum, no augmentation, as the WUS recipe trains; synthetic images of
--batches full batches) are prepared, one compiled each way, in the given compile setting (`default`: torch.compile's
default mode; `graphs-fused`: CUDA graphs, fused SGD and cudnn.benchmark, the setting of the H100's runs) and the
device's default autocast. After an untimed first epoch each (compiling), they take turns for --epochs timed epochs,
each timed between device synchronisations. Printed: each way's epochs, median seconds an epoch and images per second,
and the ratio dynamic / static of the medians. CPU threads: torch's choice, or --threads.
"""

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check's settings

import torch
from gpu_check import SKIP_SETTING, checked_device, config, synthetic_split

from cheaptrain import positive_int
from cheaptrain.methods import Method
from cheaptrain.models import MODELS
from cheaptrain.trainer import Training, prepare, train_epoch

SETTINGS = {"default": None, "graphs-fused": SKIP_SETTING}
BATCH = 128


def prepared(model: str, device: str, setting: str, batches: int, dynamic: bool) -> Training:
    """A run of `model` whose full batches run compiled, for one batch size or (`dynamic`) for any."""
    cfg = config(model, device, True, "auto", BATCH)
    cfg = replace(cfg, recipe=replace(cfg.recipe, augment=False))
    if SETTINGS[setting] is not None:
        cfg = SETTINGS[setting].config(cfg)
    t = prepare(cfg, synthetic_split(BATCH * batches, seed=1), synthetic_split(BATCH, seed=2), Method())
    if dynamic:  # the trainer's own pair, its compiled module replaced by one for any batch size
        trainable = tuple(p.requires_grad for p in t.model.parameters())
        _, uncompiled = t.step_model()
        mode = None if cfg.compile is True else cfg.compile
        t.step_models[trainable] = (torch.compile(uncompiled, mode=mode, dynamic=True), uncompiled)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lenet", choices=sorted(MODELS), help="the model (default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    parser.add_argument(
        "--setting",
        default="default",
        choices=sorted(SETTINGS),
        help="how the steps are compiled (default: %(default)s)",
    )
    parser.add_argument("--batches", type=positive_int, default=20, help="full batches of 128 an epoch")
    parser.add_argument("--epochs", type=positive_int, default=5, help="timed epochs of each way, taking turns")
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    checked_device(parser, args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    ways = {"static": False, "dynamic": True}
    runs = {way: prepared(args.model, args.device, args.setting, args.batches, dyn) for way, dyn in ways.items()}
    first = {way: train_epoch(t, 1, t.cfg.recipe.lr)["epoch_train_s"] for way, t in runs.items()}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for epoch in range(2, 2 + args.epochs):
        for way, t in runs.items():
            times[way].append(train_epoch(t, epoch, t.cfg.recipe.lr)["epoch_train_s"])
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(f"{args.model} on {device} ({args.setting}, torch {torch.__version__}, {torch.get_num_threads()} threads): "
          f"{args.batches} batches of {BATCH} an epoch, {args.epochs} timed epochs each, taking turns")  # fmt: skip
    median = {way: statistics.median(values) for way, values in times.items()}
    for way, values in times.items():
        epochs = " ".join(f"{s:.3f}" for s in values)
        print(f"  {way:8} first {first[way]:6.1f} s   epochs {epochs} s   median {median[way]:.3f} s, "
              f"{BATCH * args.batches / median[way]:,.0f} images/s")  # fmt: skip
    print(f"  dynamic / static {median['dynamic'] / median['static']:.3f}")


if __name__ == "__main__":
    main()
