"""DVC stage `train_<study>`: train one configuration of the grid and log it to MLflow.

Reads params sections `train`, `recipes.<study>` and `methods.<method>`; writes runs/<study>/<run name>/.
Checks every run of `grid` first (params, and what only a run tells: the training-set size, the model's layers, the
schedule over its epochs), so that a mistake anywhere fails in seconds, not hours into `dvc repro`; `--check` does
only that. An interrupted run resumes from its checkpoint when run again. `--no-mlflow` trains without tracking
(a machine without MLflow does so by itself): the outputs and, with `train.ledger: record`, the ledger entry are
written all the same. `-S KEY=VALUE` sets a params value for this command only, as `dvc exp run -S` does (the
value read as YAML), for a machine without DVC: e.g. `-S train.compile=true -S recipes.wus.epochs=50`.
With params `train.processes: N` (N > 1) the stage starts itself again under torchrun, N processes on this machine
training one run data-parallel; `torchrun --nproc_per_node N stages/train.py ...` does the same directly (across
machines too: torchrun's --nnodes and --rdzv options).
"""

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies
# OpenMP threads sleep instead of spinning while they wait: the same arithmetic, and a neighbour on a core no longer
# slows training several-fold (benchmarks/noise.py). Set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cheaptrain import UserError, run_main
from cheaptrain.config import read_yaml


def set_params(params: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply each `a.b.c=value` to `params` in place (the value read as YAML, as DVC reads -S); the params'
    validation then names a key that does not exist."""
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise UserError(f"-S {assignment!r}: expected KEY=VALUE with a dotted key, e.g. -S train.compile=true")
        try:
            value = read_yaml(text)
        except yaml.YAMLError as e:
            raise UserError(f"-S {assignment!r}: the value is not valid YAML: {e}") from e
        section = params
        for depth, name in enumerate(path[:-1]):
            section = section.setdefault(name, {})
            if not isinstance(section, dict):
                where = ".".join(path[: depth + 1])
                raise UserError(f"-S {assignment!r}: {where} is {section!r}, not a section of settings")
        section[path[-1]] = value
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", help="the paper whose recipe trains the run: a key of `recipes`")
    parser.add_argument("--dataset", help="cifar10 or cifar100")
    parser.add_argument("--model", help="a model name, e.g. lenet, resnet18, vgg16")
    parser.add_argument(
        "--method", help="a section of params `methods`: baseline, a method or a named configuration (dfp_p50)"
    )
    parser.add_argument("--seed", type=int, help="random seed of the run")
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check every run of the grid, then exit")
    parser.add_argument("--no-mlflow", action="store_true", help="train without logging to MLflow")
    parser.add_argument(
        "-S", "--set", action="append", default=[], metavar="KEY=VALUE", dest="assignments",
        help="set a params value for this command only (a YAML value, as dvc exp run -S); repeatable",
    )  # fmt: skip
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

    from cheaptrain.config import check_prepared, load_params, resolve_run, validate_grid

    params = set_params(load_params(args.params), args.assignments)
    validate_grid(params)
    if args.check:
        print(f"{args.params}{' with -S' if args.assignments else ''}: every run of the grid has valid params")
        return
    # torch is imported only now: a mistake in the params fails in a fraction of a second, not after its import
    from cheaptrain.distributed import from_environment, stop
    from cheaptrain.runner import keep_freed_memory, train_run
    from cheaptrain.tracking import INTERRUPTS

    cfg = resolve_run(params, *run)
    check_prepared(params, cfg.dataset, cfg.data_dir)
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
