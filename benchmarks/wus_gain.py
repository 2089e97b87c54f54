"""Analysis: why a WUS run ends above its baseline, seed by seed, from the results ledger's entries alone.

    python benchmarks/wus_gain.py [--ledger DIR] [--model alexnet] [--min-seeds 3]

A WUS skip epoch keeps the weights as they are. Where a baseline's training loss climbs in its first learning-rate
phase (AlexNet at lr 0.1, without BatchNorm or warm-up), a run whose skip epochs start inside that phase sits the
climb out. For each WUS-study method configuration of --model with --min-seeds entries or more that pair with a
baseline of the same seed (runs that ended at chance left out, as the report leaves them out), printed per seed:
  - first skip:   the run's first skip epoch (its history.csv's `phase`: 1 in a skip epoch, 0 in a normal one);
  - skips:        its skip epochs (`skip_epochs` in its metrics.json);
  - loss gap:     the baseline's training loss at the first phase's last epoch (where the lr first drops, read from the
                  baseline's `lr` column) minus the run's: how much of the climb the run sat out;
  - Δ:            the run's accuracy minus the baseline's, the study's measure (params `aggregate.accuracy`: WUS's
                  final-epoch accuracy);
then Pearson's r between the loss gap and Δ, and the mean Δ of the seeds whose first skip falls inside the first phase
against the others'. Before them, per baseline, the epoch of its lowest training loss in that phase and the loss at
its end. No training: seconds.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError, positive_int
from cheaptrain.aggregate import BASELINE, Run, accuracy_measures, collapsed, config_key, ledger_runs, pair_key
from cheaptrain.cli import run_command
from cheaptrain.ledger import ledger_root

STUDY = "wus"
SKIP = 1  # the `phase` column of a WUS run's history.csv in a skip epoch (cheaptrain.methods.wus, which loads torch)


def first_phase_end(history: list[dict]) -> int:
    """The last epoch trained at the first epoch's learning rate."""
    first_lr = history[0]["lr"]
    return next((int(row["epoch"]) - 1 for row in history if row["lr"] != first_lr), int(history[-1]["epoch"]))


def first_skip(history: list[dict]) -> int | None:
    """The run's first skip epoch; None if it never skipped."""
    return next((int(row["epoch"]) for row in history if row.get("phase") == SKIP), None)


def train_loss(history: list[dict], epoch: int) -> float:
    return next(float(row["train_loss"]) for row in history if int(row["epoch"]) == epoch)


def mean_text(values: list[float]) -> str:
    return f"{statistics.fmean(values):+.2f} ({len(values)} seeds)" if values else "— (no seed)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    parser.add_argument("--model", default="alexnet", help="the network of the WUS study to read (default: alexnet)")
    parser.add_argument("--min-seeds", type=positive_int, default=3, help="configurations with fewer are left out")
    args = parser.parse_args()
    root = args.ledger or ledger_root()
    if not root.is_dir():
        raise UserError(f"{root}: no results ledger there")
    measure = accuracy_measures({})[STUDY]
    runs = [r for r in ledger_runs(root) if r.study == STUDY and r.model == args.model and not collapsed(r)]
    baselines = {pair_key(r): r for r in runs if r.method == BASELINE}
    groups: dict[tuple, list[tuple[Run, Run]]] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        if run.method != BASELINE and (baseline := baselines.get(pair_key(run))):
            groups.setdefault(config_key(run), []).append((run, baseline))
    shown = {key: pairs for key, pairs in sorted(groups.items()) if len(pairs) >= args.min_seeds}
    if not shown:
        raise UserError(f"{root}: no {STUDY} configuration of {args.model} has {args.min_seeds} seeds paired with a "
                        "baseline")  # fmt: skip

    print(f"{STUDY} {args.model} in {root}: accuracy Δ by {measure}, training losses from history.csv")
    print(
        "baselines' first lr phase: seed, its last epoch, the epoch of its lowest training loss, that loss, the end's"
    )
    for baseline in sorted(baselines.values(), key=lambda r: r.seed):
        end = first_phase_end(baseline.history)
        losses = {e: train_loss(baseline.history, e) for e in range(1, end + 1)}
        lowest = min(losses, key=losses.__getitem__)
        print(f"  s{baseline.seed:<3} {end:>5} {lowest:>5} {losses[lowest]:8.3f} {losses[end]:8.3f}")
    for key, pairs in shown.items():
        print(f"\n{'/'.join(key[:4])}: seed, first skip, skips, loss gap at the first phase's end, Δ")
        gaps, deltas, early, late = [], [], [], []
        for run, baseline in pairs:
            end = first_phase_end(baseline.history)
            gap = train_loss(baseline.history, end) - train_loss(run.history, end)
            delta = run.metrics[measure] - baseline.metrics[measure]
            first = first_skip(run.history)
            gaps.append(gap)
            deltas.append(delta)
            (early if first is not None and first <= end else late).append(delta)
            skips = int(run.metrics["skip_epochs"])
            print(f"  s{run.seed:<3} {first or '—':>5} {skips:>5} {gap:+8.3f} {delta:+7.2f}")
        r = statistics.correlation(gaps, deltas) if len(set(gaps)) > 1 and len(set(deltas)) > 1 else float("nan")
        print(f"  Pearson r (loss gap, Δ): {r:.2f} over {len(pairs)} seeds")
        print(f"  mean Δ, first skip inside the first lr phase: {mean_text(early)}; after it: {mean_text(late)}")


if __name__ == "__main__":
    run_command(main)
