"""DVC stage `train_<study>`: train one configuration of the grid and log it to MLflow.

Reads params sections `train`, `recipes.<study>` and `methods.<method>`; writes runs/<study>/<run name>/.
Checks every run of `grid` first (params, and what only a run tells: the training-set size, the model's layers, the
schedule over its epochs), so that a mistake anywhere fails in seconds, not hours into `dvc repro`; `--check` does
only that. An interrupted run resumes from its checkpoint when run again. `--no-mlflow` trains without tracking
(a machine without MLflow does so by itself): the outputs and, with `train.ledger: record`, the ledger entry are
written all the same. With params `train.processes: N` (N > 1) the stage starts itself again under torchrun, N
processes on this machine training one run data-parallel; `torchrun --nproc_per_node N stages/train.py ...` does
the same directly (across machines too: torchrun's --nnodes and --rdzv options).
"""

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies
# OpenMP threads sleep instead of spinning while they wait: the same arithmetic, and a neighbour on a core no longer
# slows training several-fold (benchmarks/noise.py). Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cheaptrain import run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", help="the paper whose recipe trains the run: a key of `recipes`")
    parser.add_argument("--dataset", help="cifar10 or cifar100")
    parser.add_argument("--model", help="a model name, e.g. lenet, resnet18, vgg16")
    parser.add_argument("--method", help="baseline or a method of src/cheaptrain/methods")
    parser.add_argument("--seed", type=int, help="random seed of the run")
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check every run of the grid, then exit")
    parser.add_argument("--no-mlflow", action="store_true", help="train without logging to MLflow")
    parser.add_argument(
        "--running", action="store_true", help="list the runs under way (checkpoints/), whether each trains now; exit"
    )
    args = parser.parse_args()
    run = (args.study, args.dataset, args.model, args.method, args.seed)
    if args.running:
        from cheaptrain.runner import runs_under_way

        lines = runs_under_way()
        print("\n".join(lines) if lines else "no run under way (no checkpoint in checkpoints/)")
        return
    if not args.check and None in run:
        parser.error("--study, --dataset, --model, --method and --seed are required (unless --check or --running)")

    from cheaptrain.config import load_params, resolve_run, validate_grid
    from cheaptrain.distributed import from_environment, stop
    from cheaptrain.runner import keep_freed_memory, train_run
    from cheaptrain.tracking import INTERRUPTS

    params = load_params(args.params)
    validate_grid(params)
    if args.check:
        print(f"{args.params}: every run of the grid has valid params")
        return
    cfg = resolve_run(params, *run)
    if cfg.processes > 1 and "LOCAL_RANK" not in os.environ:  # not yet under torchrun: start the processes
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.processes}"]
        os.execv(sys.executable, [*launch, *sys.argv])  # torchrun in this process's place: it gets the signals
    processes = from_environment()
    cfg = dataclasses.replace(cfg, processes=processes.world)  # as launched: torchrun may be called directly
    keep_freed_memory()  # this process only trains
    for signum in (signal.SIGTERM, signal.SIGINT):  # a KeyboardInterrupt, but never inside a store write
        signal.signal(signum, INTERRUPTS.handle)
    try:
        final = train_run(cfg, track=not args.no_mlflow, processes=processes)
    except KeyboardInterrupt:
        sys.exit(130)  # the runner said where the checkpoint is
    finally:
        stop(processes)
    if not processes.main:
        return
    print(
        f"{cfg.study}/{cfg.name}: final {final['final_acc']:.2f}%, best-3 {final['best3_acc']:.2f}%, "
        f"training {final['train_time_s']:.1f} s"
    )


if __name__ == "__main__":
    run_main(main)
