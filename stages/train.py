"""DVC stage `train_<study>`: train one configuration of the grid and log it to MLflow.

Reads params sections `train`, `recipes.<study>` and `methods.<method>`; writes runs/<study>/<run name>/.
Checks every run of `grid` first (params, and what only a run tells: the training-set size, the model's layers, the
schedule over its epochs), so that a mistake anywhere fails in seconds, not hours into `dvc repro`; `--check` does
only that and, with `train.ledger: record`, looks up every run's ledger entry: it exits 1 naming each run whose entry
was trained differently, which would stop its stage. An interrupted run resumes from its checkpoint when run again.
`--no-mlflow` trains without tracking (a machine without MLflow does so by itself): the outputs and, with
`train.ledger: record`, the ledger entry are written all the same. `-S KEY=VALUE` sets a params value for this command
only, as `dvc exp run -S` does (the value read as YAML), for a machine without DVC: e.g. `-S train.compile=true
-S recipes.wus.epochs=50`; its sections must exist, but for a model's recipe settings or arguments and a method's
section (NEW_SECTIONS).
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

from cheaptrain import UserError
from cheaptrain.cli import run_command
from cheaptrain.config import read_yaml

# where -S may create a mapping that params lack ("*": any name): a model's recipe settings or arguments, a method's
# section (a named configuration needs `method:` too); anywhere else a missing one is a mistyped key
NEW_SECTIONS = [
    ("recipes", "*", "per_model"),
    ("recipes", "*", "per_model", "*"),
    ("recipes", "*", "model_args"),
    ("recipes", "*", "model_args", "*"),
    ("methods", "*"),
]


def may_create(path: list[str]) -> bool:
    return any(len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path, strict=True)) for p in NEW_SECTIONS)


def set_params(params: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply each `a.b.c=value` to `params` in place (the value read as YAML, as DVC reads -S). The top-level section
    and every section on the way must exist, but for those NEW_SECTIONS names; the params' validation then names a
    setting that does not exist."""
    created: set[str] = set()  # methods.<name> sections made here
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise UserError(f"-S {assignment!r}: expected KEY=VALUE with a dotted key, e.g. -S train.compile=true")
        if path[0] not in params:
            raise UserError(f"-S {assignment!r}: params has no section {path[0]} (its sections: {', '.join(params)})")
        try:
            value = read_yaml(text)
        except yaml.YAMLError as e:
            raise UserError(f"-S {assignment!r}: the value is not valid YAML: {' '.join(str(e).split())}") from e
        section = params
        for depth, name in enumerate(path[:-1]):
            where = ".".join(path[: depth + 1])
            if name not in section:
                if not may_create(path[: depth + 1]):
                    held = ", ".join(map(str, section)) or "nothing"
                    raise UserError(
                        f"-S {assignment!r}: params has no {where} ({'.'.join(path[:depth])} holds: {held})"
                    )
                if path[0] == "methods":
                    created.add(where)
                section[name] = {}
            elif section[name] is None:  # `dfp:` with nothing after it: the defaults
                section[name] = {}
            section = section[name]
            if not isinstance(section, dict):
                raise UserError(f"-S {assignment!r}: {where} is {section!r}, not a section of settings")
        section[path[-1]] = value
    check_new_methods(params, created)
    return params


def check_new_methods(params: dict[str, Any], created: set[str]) -> None:
    """A methods.<name> section made by -S is a registered method's or a named configuration's (with `method:`)."""
    if not created:
        return
    from cheaptrain.methods import METHODS  # late: methods import torch

    for where in sorted(created):
        name = where.split(".", 1)[1]
        if name not in METHODS and "method" not in params["methods"][name]:
            raise UserError(
                f"-S: params has no {where}, and {name} is no method (accepted: {', '.join(METHODS)}); a new named "
                f"configuration sets its method too, e.g. -S {where}.method=dfp"
            )


def ledger_stops(params: dict[str, Any]) -> list[str]:
    """With `train.ledger: record`, look up each grid run's ledger entry as its train stage does (ledger.find): print
    how many reuse theirs, and return one line per run whose entry, trained differently, would stop it. The data is
    that of the params (the prepared data's digest is compared when the stage trains: the download stage before it may
    prepare it again)."""
    from cheaptrain import ledger
    from cheaptrain.config import resolve_run, train_size_param
    from cheaptrain.runner import run_code_version

    runs, reused, stops = list(ledger.grid_runs(params)), 0, []
    for run in runs:
        cfg = resolve_run(params, *run)
        if (entry := ledger.lookup(cfg, train_size_param(params, cfg.dataset))) is None:
            continue
        if diffs := ledger.differences(entry, cfg, run_code_version(cfg)):
            stops.append(f"{cfg.study}/{cfg.name}: {'; '.join(diffs)}")
        else:
            reused += 1
    print(f"ledger: {reused} of {len(runs)} runs reuse their ledger entry, {len(runs) - reused - len(stops)} train, "
          f"{len(stops)} would stop at theirs")  # fmt: skip
    return stops


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
    parser.add_argument(
        "--check", action="store_true", help="only check every run of the grid (and ledger entries), then exit"
    )
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
        from cheaptrain.config import load_params, train_settings
        from cheaptrain.runner import runs_under_way

        device = "auto"  # the params' train.device where there are params: a checkpoint of another device restarts
        if Path(args.params).is_file() or args.assignments:
            device = train_settings(set_params(load_params(args.params), args.assignments))[0].get("device", "auto")
        lines = runs_under_way(device)
        print("\n".join(lines) if lines else "no run under way (no checkpoint in checkpoints/)")
        return
    if not args.check and None in run:
        parser.error("--study, --dataset, --model, --method and --seed are required (unless --check or --running)")

    from cheaptrain.config import check_prepared, load_params, resolve_run, train_settings, validate_grid

    params = set_params(load_params(args.params), args.assignments)
    validate_grid(params)
    if args.check:
        print(f"{args.params}{' with -S' if args.assignments else ''}: every run of the grid has valid params")
        if train_settings(params)[0]["ledger"] == "record" and (stops := ledger_stops(params)):
            listed = "\n".join(f"  - {line}" for line in stops)
            print(
                f"error: {len(stops)} runs of the grid have a ledger entry trained differently, which stops their "
                f"train stage:\n{listed}\nRetrain each and replace its entry on the kind of device that trained it "
                "(docs/ledger.md): on a CPU `make ledger STUDY=.. MODEL=.. METHOD=.. SEED=.. LEDGER=retrain`, in a GPU "
                "lease `benchmarks/gpu_session.py .. --retrain-stale`; -S train.ledger=retrain retrains every run it "
                "trains, matching entries too. For other training code, `python -m cheaptrain.replay --stale` first "
                "shows whether this code trains them the same.",
                file=sys.stderr,
            )
            sys.exit(1)
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
    run_command(main)
