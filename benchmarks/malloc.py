"""Benchmark: what keeping freed memory (cheaptrain.runner.keep_freed_memory) is worth to a training process.

    python benchmarks/malloc.py [--data data/prepared/cifar10] [--rounds 3] [--epochs 2]

Each round starts two fresh processes, one with glibc's default malloc and one with the trainer's setting, taking
turns. Each does what a train stage does before and while training: load the splits and prepare the run
(cheaptrain.trainer.prepare: LeNet with the DFP recipe of params.yaml, channels_last, batch 128, crop + flip), then
train --epochs epochs of this project's loop (cheaptrain.trainer.train_epoch), and prints every epoch's time and the
process's minor page faults in it. A fresh process matters: glibc's default moves its threshold as blocks come and
go, so the effect depends on what the process allocated before (in benchmarks/loader.py, after the conventional loop,
it is small).
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import positive_int  # the package root imports no torch

REPO = Path(__file__).resolve().parents[1]


def child(data: str, epochs: int, keep: bool) -> None:
    import dataclasses

    import torch

    from cheaptrain.config import load_params, resolve_run
    from cheaptrain.data import load_split
    from cheaptrain.methods import Method
    from cheaptrain.runner import keep_freed_memory
    from cheaptrain.trainer import prepare, train_epoch

    if keep:
        keep_freed_memory()
    cfg = resolve_run(load_params(REPO / "params.yaml"), "dfp", "cifar10", "lenet", "baseline", 0)
    cfg = dataclasses.replace(cfg, device="cpu")
    t = prepare(cfg, load_split(Path(data), "train"), load_split(Path(data), "test"), Method())
    rows = []
    for epoch in range(1, epochs + 1):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        seconds = train_epoch(t, epoch, cfg.recipe.lr)["epoch_train_s"]
        rows.append((seconds, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "epochs": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="data/prepared/cifar10", help="prepared dataset (the download stage's)")
    parser.add_argument("--rounds", type=positive_int, default=3, help="pairs of processes (default: %(default)s)")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs per process (default: %(default)s)")
    parser.add_argument("--child", choices=["default", "keep"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.data, args.epochs, args.child == "keep")
        return
    if not (Path(args.data) / "train.npz").is_file():
        sys.exit(f"error: no prepared data in {args.data}: run `make quickstart`, or pass --data")
    epochs: dict[str, list[tuple[float, int]]] = {"default": [], "keep": []}
    for round_ in range(args.rounds):
        for mode in ("default", "keep") if round_ % 2 == 0 else ("keep", "default"):
            cmd = [sys.executable, __file__, "--child", mode, "--data", args.data, "--epochs", str(args.epochs)]
            done = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            rows = done["epochs"]
            epochs[mode] += [tuple(r) for r in rows]
            print(f"round {round_ + 1}, {mode:7s}: " + ", ".join(f"{s:.2f} s ({f:,} faults)" for s, f in rows))
    median = {m: statistics.median(s for s, _ in rows) for m, rows in epochs.items()}
    faults = {m: statistics.median(f for _, f in rows) for m, rows in epochs.items()}
    threads = f"{done['threads']} thread{'s' * (done['threads'] != 1)}"
    print(
        f"\nLeNet epoch, torch {done['torch']}, {threads}, median over {len(epochs['keep'])} epochs "
        f"each: default malloc {median['default']:.2f} s ({faults['default']:,.0f} page faults), freed memory kept "
        f"{median['keep']:.2f} s ({faults['keep']:,.0f}); kept / default: {median['keep'] / median['default']:.2f}"
    )


if __name__ == "__main__":
    main()
