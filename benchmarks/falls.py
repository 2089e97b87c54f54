"""Analysis: which runs of the results ledger fell to chance accuracy while training, and whether one method's runs
fall more often than the others' on the same network.

    python benchmarks/falls.py [STUDY/DATASET/MODEL] [--compare METHOD OTHER] [--ledger DIR]

A run falls when its test accuracy, having been above chance, drops to chance (at most CHANCE_MARGIN points above 100 /
classes, `cheaptrain.aggregate.collapsed`'s line): its network stopped learning, as AlexNet without BatchNorm can at lr
0.1 after a loss spike. Some learn again (the lr drops, a unit comes back); one still at chance at its last epoch ended
at chance, and the report leaves it out of every figure and names it. A run whose loss became NaN (`diverged_epoch`: the
ledger keeps its epochs before) is at chance from that epoch, where it stopped. Per network (every one in the ledger, or
the one named), per method: its runs, how many fell, how many ended at chance, and for a method with falls the one-sided
Fisher exact p: the chance that at least that many of the network's falls would land on the method's runs were the falls
spread over all the network's runs (every method, one study's recipe) at random. The method is looked at because it
fell, so the p describes the ledger, not a test planned beforehand. Then each fall: its epochs at chance, whether and
when the run learned again, its highest training loss and its final accuracy. `--compare METHOD OTHER` (with a network)
adds the test of a comparison planned before its runs: the one-sided Fisher exact p that METHOD's runs fall more often
than OTHER's, the network's other runs left aside. No training: seconds.
"""

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError
from cheaptrain.aggregate import Run, chance_line, collapsed, ledger_runs
from cheaptrain.cli import run_command
from cheaptrain.ledger import divergence, ledger_root


def chance_spells(run: Run) -> list[tuple[int, int]]:
    """The run's spells at chance after it had learned: (first epoch, last epoch) of each run of epochs whose test
    accuracy is at most 100 / classes + CHANCE_MARGIN, once an earlier epoch was above that line."""
    line = chance_line(run.dataset)
    spells: list[tuple[int, int]] = []
    learned = False
    diverged = [{"epoch": run.metrics["diverged_epoch"], "test_acc": 0.0}] if "diverged_epoch" in run.metrics else []
    for row in run.history + diverged:  # the epoch whose loss became NaN is at chance: its weights are NaN
        epoch, at_chance = int(row["epoch"]), row["test_acc"] <= line
        if not at_chance:
            learned = True
        elif learned:
            if spells and spells[-1][1] == epoch - 1:
                spells[-1] = (spells[-1][0], epoch)
            else:
                spells.append((epoch, epoch))
    return spells


def fisher_p(falls: int, runs: int, network_falls: int, network_runs: int) -> float:
    """P(X >= falls), X hypergeometric: `runs` drawn from `network_runs` of which `network_falls` fell."""
    total = math.comb(network_runs, runs)
    top = min(runs, network_falls)
    ways = sum(
        math.comb(network_falls, k) * math.comb(network_runs - network_falls, runs - k) for k in range(falls, top + 1)
    )
    return ways / total


def spell_text(run: Run, spells: list[tuple[int, int]]) -> str:
    last_epoch = int(run.metrics.get("diverged_epoch", run.history[-1]["epoch"]))
    parts = [f"{a}-{b}" if a != b else f"{a}" for a, b in spells]
    at = sum(b - a + 1 for a, b in spells)
    again = "never learning again" if spells[-1][1] == last_epoch else f"learning again from epoch {spells[-1][1] + 1}"
    losses = [(row["train_loss"], int(row["epoch"])) for row in run.history if "train_loss" in row]
    peak = "; training loss at most {:.4g} (epoch {})".format(*max(losses)) if losses else ""
    diverged = divergence(run.metrics)
    end = f"; {diverged}, where it stopped" if diverged else f"; final {run.metrics['final_acc']:.2f}%"
    return (f"{run.method} seed {run.seed}: at chance in epochs {', '.join(parts)} ({at} of {last_epoch}), {again}"
            f"{peak}{end}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("network", nargs="?", help="STUDY/DATASET/MODEL (default: every network in the ledger)")
    parser.add_argument("--compare", nargs=2, metavar=("METHOD", "OTHER"),
                        help="with a network: the p that METHOD's runs fall more often than OTHER's")  # fmt: skip
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    args = parser.parse_args()
    if args.compare and args.network is None:
        raise UserError("--compare: name the network too (STUDY/DATASET/MODEL)")
    if args.compare and args.compare[0] == args.compare[1]:
        raise UserError(f"--compare: two methods, not {args.compare[0]} twice")
    root = args.ledger or ledger_root()
    if not root.is_dir():
        raise UserError(f"{root}: no results ledger there")
    if args.network is not None and len(args.network.split("/")) != 3:
        raise UserError(f"{args.network}: expected study/dataset/model")
    networks: dict[str, list[Run]] = {}
    for run in ledger_runs(root):
        networks.setdefault(f"{run.study}/{run.dataset}/{run.model}", []).append(run)
    if args.network is not None:
        if args.network not in networks:
            raise UserError(f"{args.network}: no entries in {root}; its networks: {', '.join(sorted(networks))}")
        networks = {args.network: networks[args.network]}
        missing = [m for m in args.compare or () if m not in {run.method for run in networks[args.network]}]
        if missing:
            raise UserError(f"--compare: {args.network} has no {' or '.join(missing)} entries")
    for network, runs in sorted(networks.items()):
        spells = {id(run): chance_spells(run) for run in runs}
        fell = [run for run in runs if spells[id(run)]]
        line = chance_line(runs[0].dataset)
        print(f"{network}: {len(runs)} runs, {len(fell)} fell to chance (a test accuracy at most {line:g}%)")
        methods = sorted({run.method for run in runs})
        width = max(16, *(len(m) + 2 for m in methods))
        print(f"  {'method':<{width}}{'runs':>5}{'fell':>6}{'ended at chance':>17}  p (falls spread at random)")
        counts: dict[str, tuple[int, int]] = {}  # method -> (runs, falls)
        for method in methods:
            own = [run for run in runs if run.method == method]
            falls = sum(1 for run in own if spells[id(run)])
            counts[method] = (len(own), falls)
            ended = sum(1 for run in own if collapsed(run))
            p = f"{fisher_p(falls, len(own), len(fell), len(runs)):.3g}" if falls else ""
            print(f"  {method:<{width}}{len(own):>5}{falls:>6}{ended:>17}  {p}")
        for run in sorted(fell, key=lambda r: (r.method, r.seed)):
            print(f"  - {spell_text(run, spells[id(run)])}")
        if args.compare:
            (n, a), (m, b) = counts[args.compare[0]], counts[args.compare[1]]
            p = fisher_p(a, n, a + b, n + m)
            verdict = "under 0.05: a finding" if p < 0.05 else "not under 0.05: not a finding"
            print(f"planned comparison: {args.compare[0]} fell in {a} of {n} runs, {args.compare[1]} in {b} of {m}; "
                  f"one-sided Fisher exact p that the first falls more often {p:.3g} ({verdict})")  # fmt: skip


if __name__ == "__main__":
    run_command(main)
