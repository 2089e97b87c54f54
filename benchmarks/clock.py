"""Benchmark: a run's own time saved read with the wall clock and with the evaluation clock, over the ledger's seeds.

    python benchmarks/clock.py [--ledger DIR] [--min-seeds 3]

For every configuration of the results ledger (study, dataset, model, method) with --min-seeds entries or more, the
time saved against the run's own full epochs (cheaptrain.timing.run_time), two ways, from the same entries:
  - wall:       each epoch's seconds as measured (the entries' `eval_s` left out);
  - evaluation: each epoch's seconds put at the run's typical machine speed, read from its evaluation passes
                (`timing.slowdown`), as the report computes it.
Printed per configuration: the compute saved (exact, the bound), then for each clock the mean over seeds, their
standard deviation and range. A correction that tracks the machine leaves the mean where full and cheaper epochs
interleave (DFP's schedule) and narrows the scatter where drift moved one kind of epoch alone. No training: seconds.
"""

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError, positive_int, run_main
from cheaptrain.ledger import Entry, entries, ledger_root
from cheaptrain.timing import run_time

CLOCKS = ("wall", "evaluation")


def own_saving(entry: Entry, clock: str) -> float | None:
    """The entry's own time saved (%) read with `clock`; None where it has no robust figure."""
    history = entry.history
    if clock == "wall":
        history = [{k: v for k, v in row.items() if k != "eval_s"} for row in history]
    timed = run_time(history, f"{entry.study}/{entry.name}")
    return timed.own_saving_pct if timed else None


def compute_saved(entry: Entry, baselines: dict[tuple, Entry]) -> float | None:
    """100·(1 − training FLOPs / the baseline's of the same seed), or None without one."""
    config = entry.info["config"]
    base = baselines.get((entry.study, config["dataset"], config["model"], config.get("seed")))
    if base is None or not base.metrics.get("total_train_flops"):
        return None
    return 100 * (1 - entry.metrics["total_train_flops"] / base.metrics["total_train_flops"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    parser.add_argument("--min-seeds", type=positive_int, default=3, help="configurations with fewer are left out")
    args = parser.parse_args()
    root = args.ledger or ledger_root()
    if not root.is_dir():
        raise UserError(f"{root}: no results ledger there")
    found = entries(root)
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    baselines = {}
    for e in found:
        c = e.info["config"]
        groups[(e.study, c["dataset"], c["model"], c["method"])].append(e)
        if c["method"] == "baseline":
            baselines[(e.study, c["dataset"], c["model"], c.get("seed"))] = e
    shown = {key: group for key, group in sorted(groups.items()) if len(group) >= args.min_seeds}
    if not shown:
        raise UserError(f"{root}: no configuration has {args.min_seeds} entries or more")

    print(f"own time saved % over seeds, {len(found)} entries of {root}: mean, sd [min, max] per clock")
    print(f"{'study/dataset/model/method':<42}{'seeds':>6}{'compute':>9}" + "".join(f"{c:>26}" for c in CLOCKS))
    for key, group in shown.items():
        figures = {c: [s for s in (own_saving(e, c) for e in group) if s is not None] for c in CLOCKS}
        computes = [s for s in (compute_saved(e, baselines) for e in group) if s is not None]
        compute = f"{statistics.fmean(computes):.1f}" if computes else "—"
        cells = []
        for clock in CLOCKS:
            values = figures[clock]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(
                f"{statistics.fmean(values):6.1f}, {sd:4.1f} [{min(values):5.1f}, {max(values):5.1f}]"
                if values
                else "—"
            )
        print(f"{'/'.join(key):<42}{len(group):>6}{compute:>9}" + "".join(f"{c:>26}" for c in cells))


if __name__ == "__main__":
    run_main(main)
