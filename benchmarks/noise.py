"""Benchmark: what a busy machine does to the quick setting's figures, unloaded and loaded side by side.

    python benchmarks/noise.py [--threads 2] [--out DIR]     # train both passes, then compare them
    python benchmarks/noise.py --compare RUNS_A RUNS_B       # compare the runs below that both runs/ folders hold

The runs: the quick setting (params.yaml with params.quick.yaml over it, as `make quickstart` runs it) of the DFP
study's baseline and dfp and the WUS study's baseline and wus, trained one after another in this process
(cheaptrain.runner.train_run, MLflow off), in two passes: unloaded, then loaded, where a busy-loop process (pure
Python `while True: pass`, pinned to one core) runs from the start of the second run to the end of the fourth. So
in the loaded pass the DFP baseline trains unloaded and its dfp run loaded, both WUS runs loaded. Both passes train
with the same number of CPU threads (--threads): the thread count changes the float rounding, and so the accuracies.

Printed per method, for each pass and their difference: compute saved (training FLOPs) and sample-passes saved
against the baseline, accuracy (the study's measure), time saved against the baseline from the robust training time
with its 95% interval (cheaptrain.timing), time saved against the run's own full epochs (robust, with its interval),
and the naive time saved from the summed epoch times; then whether each robust figure of the loaded pass stayed
within 3 points of the unloaded one. Training both passes takes about 10 minutes on 2 quiet cores.
"""

import argparse
import contextlib
import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError, positive_int
from cheaptrain.cli import run_command

REPO = Path(__file__).resolve().parents[1]
RUNS = (("dfp", "baseline"), ("dfp", "dfp"), ("wus", "baseline"), ("wus", "wus"))
LOADED_FROM = 1  # the busy loop runs from the start of the second run to the end of the last (the fourth)
WITHIN = 3.0  # points: how far a robust time saving of the loaded pass may move
ROBUST = ("time saved, robust %", "own time saved, robust %")


def quick_params() -> dict[str, Any]:
    """params.yaml as `make quickstart` sets it (`dvc exp run -S` with every leaf of params.quick.yaml), with a grid
    of RUNS only."""
    from dvc.utils.hydra import apply_overrides

    from cheaptrain.config import load_params
    from cheaptrain.quick import overrides

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "params.yaml"
        shutil.copy(REPO / "params.yaml", path)
        apply_overrides(path, overrides(load_params(REPO / "params.quick.yaml")))
        params = load_params(path)
    for study in ("dfp", "wus"):
        params["grid"][study]["methods"] = [method for s, method in RUNS if s == study]
    return params


@contextlib.contextmanager
def busy_core() -> Iterator[int]:
    """A process spinning on one core (the last this one may use) while the block runs; yields its pid."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(busy.pid, {max(os.sched_getaffinity(0))})
        yield busy.pid
    finally:
        busy.kill()
        busy.wait()


def train(params: dict[str, Any], runs_root: Path, threads: int, loaded: bool) -> None:
    """Train RUNS into `runs_root`, one after another; `loaded`: with a busy core from run LOADED_FROM on."""
    from cheaptrain.config import resolve_run
    from cheaptrain.runner import train_run

    with contextlib.ExitStack() as load:
        for i, (study, method) in enumerate(RUNS):
            if loaded and i == LOADED_FROM:
                print(f"busy loop started (pid {load.enter_context(busy_core())})", flush=True)
            cfg = resolve_run(params, study, "cifar10", "lenet", method, 0)
            cfg = dataclasses.replace(cfg, runs_root=str(runs_root), threads=threads)
            started = time.perf_counter()
            final = train_run(cfg, track=False)
            print(f"{runs_root.name} {study}/{cfg.name}: {final['train_time_s']:.1f} s of training, "
                  f"{time.perf_counter() - started:.0f} s in all", flush=True)  # fmt: skip


def summary(params: dict[str, Any], runs_root: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The aggregate stage's summary rows of RUNS in `runs_root`, by (study, method)."""
    from cheaptrain.aggregate import accuracy_measures, collect, summarize

    rows = summarize(collect(params, runs_root), accuracy_measures(params))
    return {(row["study"], row["method"]): row for row in rows}


def figures(rows: dict[tuple[str, str], dict[str, Any]], study: str, method: str) -> dict[str, tuple[float, ...]]:
    """One method's figures: (value,) or (value, lo, hi); NaN where the summary has none."""
    row, baseline = rows[(study, method)], rows[(study, "baseline")]

    def get(*columns: str) -> tuple[float, ...]:
        return tuple(row.get(c, math.nan) for c in columns)

    return {
        "compute saved %": get("compute_saving_pct_mean"),
        "samples saved %": get("sample_saving_pct_mean"),
        f"accuracy % ({row['acc_measure']})": get("acc_mean"),
        "time saved, robust %": get("time_saving_pct_mean", "time_saving_pct_lo", "time_saving_pct_hi"),
        "own time saved, robust %": get("own_time_saving_pct_mean", "own_time_saving_pct_lo", "own_time_saving_pct_hi"),
        "time saved, naive (summed epochs) %": (100 * (1 - row["train_time_s_mean"] / baseline["train_time_s_mean"]),),
    }


def show(value: tuple[float, ...]) -> str:
    return f"{value[0]:.2f}" + (f" [{value[1]:.2f}, {value[2]:.2f}]" if len(value) == 3 else "")


def has_pair(params: dict[str, Any], root: Path, study: str, method: str) -> bool:
    """Every run of the study's grid with `method` or its baseline has finished in `root`."""
    from cheaptrain.aggregate import finished, grid_runs, run_folder

    runs = [run for run in grid_runs(params) if run[0] == study and run[3] in ("baseline", method)]
    return all(finished(run_folder(root, *run)) for run in runs)


def compare(params: dict[str, Any], unloaded_root: Path, loaded_root: Path) -> None:
    """Print both passes side by side, and whether each robust time saving of the loaded pass stayed within WITHIN:
    of each method of RUNS that both folders hold with its baseline."""
    pairs = [
        (study, method)
        for study, method in RUNS
        if method != "baseline" and all(has_pair(params, root, study, method) for root in (unloaded_root, loaded_root))
    ]
    if not pairs:
        methods = ", ".join(f"{s}/{m}" for s, m in RUNS if m != "baseline")
        raise UserError(f"{unloaded_root} and {loaded_root} do not both hold any of {methods} with its baseline")
    compared = {study: ["baseline", *(m for s, m in pairs if s == study)] for study, _ in pairs}
    # a grid of what is compared only, so that summarising finds every run of it
    params = params | {"grid": {s: params["grid"][s] | {"methods": methods} for s, methods in compared.items()}}
    unloaded, loaded = summary(params, unloaded_root), summary(params, loaded_root)
    print(f"\nunloaded: {unloaded_root}\nloaded:   {loaded_root}")
    if skipped := [f"{s}/{m}" for s, m in RUNS if m != "baseline" and (s, m) not in pairs]:
        print(f"not in both (with its baseline), not compared: {', '.join(skipped)}")
    print(f"{'method':<8}{'figure':<38}{'unloaded':>24}{'loaded':>24}{'loaded - unloaded':>19}")
    verdicts = []
    for study, method in pairs:
        before, after = figures(unloaded, study, method), figures(loaded, study, method)
        for name in before:
            delta = after[name][0] - before[name][0]
            print(f"{method:<8}{name:<38}{show(before[name]):>24}{show(after[name]):>24}{delta:>+19.2f}")
        for name in ROBUST:
            delta = after[name][0] - before[name][0]
            verdicts.append((f"{method}, {name}", delta, abs(delta) <= WITHIN))
    print(f"\nrobust time figures of the loaded pass within {WITHIN:g} points of the unloaded pass's:")
    for what, delta, held in verdicts:
        print(f"  {what}: {delta:+.2f} points, {'held' if held else 'NOT held'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("UNLOADED", "LOADED"), help="two runs/ folders")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    parser.add_argument("--threads", type=positive_int, default=cores, help="CPU threads (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="where both passes' runs go (default: a new temporary folder)")
    args = parser.parse_args()
    compared = [path.resolve() for path in args.compare or []]  # before the chdir below
    out = args.out.resolve() if args.out else None
    os.chdir(REPO)  # the quick setting's data: data/prepared/cifar10
    params = quick_params()
    if compared:
        compare(params, *compared)
        return

    from cheaptrain.runner import keep_freed_memory

    keep_freed_memory()  # as a train stage does
    out = out or Path(tempfile.mkdtemp(prefix="noise-"))
    for name in ("unloaded", "loaded"):
        train(params, out / name, args.threads, loaded=name == "loaded")
    compare(params, out / "unloaded", out / "loaded")
    print(f"(compare again: python benchmarks/noise.py --compare {out / 'unloaded'} {out / 'loaded'})")


if __name__ == "__main__":
    run_command(main)
