"""Analysis: how a seed-by-seed comparison of the results ledger moved as its seeds were added, and its interval
widened for every time it was looked at.

    python benchmarks/looks.py STUDY/DATASET/MODEL/METHOD [--against METHOD] [--at K [K ...]] [--looks N]

Each seed's accuracy difference between the configuration and the one --against names (default: its baseline, the
accuracy Δ), by the study's paper's measure (the report's default), over the seeds both have (runs that ended at chance
left out and named, as the report leaves them out), in the order the pairs became complete (the later `finished_at` of
the two entries' run.json; seed order where an entry lacks it). Printed for the first K of those seeds, for each K of
--at (default: every K from 3 on): the mean difference and its 95% t-interval (the report's, `equal_cost.Paired`), the
seeds it is ahead on, and whether the interval excludes 0 at that one look. A comparison looked at after each batch
of new seeds, and called a finding at the first look whose interval excludes 0, is one more often than 5% of the time
when nothing is there: last, for the seeds of the last look (the largest K of --at: a plan's figure stays as it was
when seeds come in later; all the seeds without --at), the interval widened for --looks looks (default: the number of
--at values, with --at) by Bonferroni's rule, a (1 − 0.05 / looks) t-interval, which holds whatever the looks saw. The
report widens it so for one look per seed count from 3 (`equal_cost.Paired.widened`); a plan that fixed fewer looks
reads its own here. No training: seconds.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError, positive_int
from cheaptrain.aggregate import BASELINE, Run, accuracy_measures, collapsed, config_key, half_width, ledger_runs
from cheaptrain.cli import run_command
from cheaptrain.ledger import ledger_root
from cheaptrain.report.equal_cost import Paired


def interval(differences: list[float], looks: int = 1) -> tuple[float, float]:
    """The mean difference's two-sided t-interval (3+ values): 95%, or widened for `looks` looks (half_width)."""
    mean, half = statistics.fmean(differences), half_width(differences, looks)
    assert half is not None
    return mean - half, mean + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configuration", help="study/dataset/model/method, e.g. dfp/cifar10/lenet/random_prune")
    parser.add_argument("--against", default=BASELINE, help="the other method of that study, dataset and model "
                        "(default: baseline: the accuracy Δ)")  # fmt: skip
    parser.add_argument("--at", type=positive_int, nargs="+", metavar="K", help="the seed counts to print (default: "
                        "every one from 3)")  # fmt: skip
    parser.add_argument("--looks", type=positive_int, help="how many times the comparison was looked at (default: "
                        "the number of --at values; without --at no widened interval)")  # fmt: skip
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    args = parser.parse_args()
    parts = args.configuration.split("/")
    if len(parts) != 4:
        raise UserError(f"{args.configuration}: expected study/dataset/model/method")
    root = args.ledger or ledger_root()
    if not root.is_dir():
        raise UserError(f"{root}: no results ledger there")
    measures = accuracy_measures({})  # the papers' measures, the report's default
    if parts[0] not in measures:
        raise UserError(f"{parts[0]}: not a study of the ledger; accepted: {', '.join(measures)}")
    measure = measures[parts[0]]
    entries: dict[str, dict[int, Run]] = {}  # method -> seed -> its entry, of the configuration's network
    at_chance: dict[str, list[int]] = {}  # method -> its seeds that ended at chance
    for run in ledger_runs(root):
        if config_key(run)[:3] == tuple(parts[:3]):
            if collapsed(run):
                at_chance.setdefault(config_key(run)[3], []).append(run.seed)
            else:
                entries.setdefault(config_key(run)[3], {})[run.seed] = run
    for method in (parts[3], args.against):
        if method not in entries:
            known = ", ".join(sorted(entries)) or "none"
            raise UserError(f"{'/'.join(parts[:3])}/{method}: no entries in {root}; its methods there: {known}")
    ours, theirs = entries[parts[3]], entries[args.against]
    seeds = sorted(ours.keys() & theirs.keys())
    came_in = {s: max(ours[s].finished_at, theirs[s].finished_at) for s in seeds}
    by_arrival = all(came_in.values())  # every entry says when it finished
    if by_arrival:  # in the order each pair became complete, as the report saw them
        seeds.sort(key=lambda s: (came_in[s], s))
    if len(seeds) < 3:
        left = "; ".join(f"{m} seed{'s' * (len(at_chance[m]) > 1)} {', '.join(map(str, sorted(at_chance[m])))}"
                         for m in (parts[3], args.against) if m in at_chance)  # fmt: skip
        left = f" (left out, ended at chance: {left})" if left else ""
        raise UserError(f"{parts[3]} and {args.against} share {len(seeds)} seed{'s' * (len(seeds) != 1)}{left}; a "
                        "t-interval needs 3")  # fmt: skip
    counts = args.at or list(range(3, len(seeds) + 1))
    if too_many := [k for k in counts if not 3 <= k <= len(seeds)]:
        raise UserError(f"--at {' '.join(map(str, too_many))}: the counts lie in 3-{len(seeds)} (the seeds shared)")
    differences = [ours[s].metrics[measure] - theirs[s].metrics[measure] for s in seeds]

    order = "as their pairs came in" if by_arrival else "in seed order"
    print(f"{args.configuration} minus {args.against} ({measure}, points) over the first K of their {len(seeds)} "
          f"shared seeds, {order}, in {root}")  # fmt: skip
    for method in dict.fromkeys((parts[3], args.against)):
        if failed := sorted(at_chance.get(method, [])):
            print(f"left out, ended at chance: {method} seed{'s' * (len(failed) > 1)} {', '.join(map(str, failed))}")
    print(f"{'K':>3}{'Kth seed':>10}{'mean':>8}  {'95% interval':<18}{'ahead on':>9}  finding")
    for k in counts:
        paired = Paired.of(differences[:k])  # the report's mean, interval and seeds ahead
        mean, ci = paired.mean, paired.ci
        found = "yes" if mean - ci > 0 or mean + ci < 0 else "no"
        shown = f"[{mean - ci:+.2f}, {mean + ci:+.2f}]"
        print(f"{k:>3}{seeds[k - 1]:>10}{mean:>+8.2f}  {shown:<18}{paired.ahead:>5} of {k:<3}{found}")
    looks = args.looks or (len(args.at) if args.at else None)
    if looks:
        last = max(counts)
        low, high = interval(differences[:last], looks)
        found = "excludes 0" if low > 0 or high < 0 else "contains 0"
        which = f"all {len(seeds)} seeds" if last == len(seeds) else f"the first {last} of {len(seeds)} seeds"
        print(f"{which}, widened for {looks} look{'s' * (looks > 1)} (Bonferroni: a "
              f"{100 * (1 - 0.05 / looks):.4g}% t-interval): [{low:+.2f}, {high:+.2f}], {found}")  # fmt: skip


if __name__ == "__main__":
    run_command(main)
