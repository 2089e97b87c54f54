"""Benchmark: the ledger's time savings read with the wall clock and with the evaluation clock, over its seeds.

    python benchmarks/clock.py [--ledger DIR] [--min-seeds 3] [--seeds STUDY/DATASET/MODEL/METHOD [--seed-range A-B]]

For every method configuration of the results ledger (study, dataset, model, method) with --min-seeds entries or more,
two time savings (cheaptrain.timing), each read two ways from the same entries:
  - own:      against the run's own full epochs (`run_time`);
  - paired:   against the baseline of the same recipe and seed (`paired_saving`), over the seeds whose baseline
              trained on the same machine (device, CPU threads and vector instructions: `aggregate.machine_difference`);
  - wall:       each epoch's seconds as measured (the entries' `eval_s` left out);
  - evaluation: each epoch's seconds put at the run's typical machine speed, read from its evaluation passes, and a
                run's at its baseline's typical speed, as the report computes them.
Runs that ended at chance accuracy are left out, as the report leaves them out. Printed per configuration: its seeds,
those paired on one machine, the compute saved (exact: the bound), then per saving and clock the mean over seeds and
their standard deviation, and last the ratio gap: over the paired seeds, the mean of how much longer (%) the run's full
epoch trains per second of its evaluation than its baseline's does. The evaluation clock cannot see that gap (two
machines of one name whose training and evaluation differ in speed unequally, or load that slows one more than the
other), and it lowers the paired saving below the own one by about (100 - own) x gap / 100. A clock that tracks the
machine leaves the own saving's mean where full and cheaper epochs interleave (DFP's schedule), narrows its scatter
where drift hit one kind of epoch alone, and brings the paired saving, hours apart on a shared machine, to the own one
less that gap. --seeds names one configuration and prints its figures seed by seed instead: a full epoch's seconds (the
median, as measured), the four savings, a full epoch's training seconds per evaluation second of the run and of its
baseline, and the gap between the two, or why a seed does not pair (another machine, no baseline), then each column's
mean and sd over the seeds that pair; --seed-range A-B keeps those seeds alone. No training: seconds.
"""

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cheaptrain import UserError, positive_int
from cheaptrain.aggregate import BASELINE, Run, collapsed, config_key, ledger_runs, machine_difference, pair_key
from cheaptrain.cli import run_command
from cheaptrain.ledger import ledger_root
from cheaptrain.timing import RunTime, paired_saving, run_time

CLOCKS = ("wall", "evaluation")
WIDTHS = (6, 7, 8, 19, 19, 19, 19, 10)  # the columns after the configuration


def timed(run: Run, clock: str) -> RunTime | None:
    """The run's robust figures read with `clock`."""
    history = run.history
    if clock == "wall":
        history = [{k: v for k, v in row.items() if k != "eval_s"} for row in history]
    return run_time(history, f"{run.study}/{run.name}")


def train_per_eval(t: RunTime | None) -> float | None:
    """A full epoch's training seconds per evaluation second, both at the run's typical speed; None without them."""
    return t.full_epoch_s / t.eval_s if t and t.eval_s else None


def ratio_gap(run: RunTime | None, baseline: RunTime | None) -> float | None:
    """How much longer (%) the run's full epoch trains per second of its evaluation than its baseline's does; None
    without the figures."""
    ours, theirs = train_per_eval(run), train_per_eval(baseline)
    return 100 * (ours / theirs - 1) if ours and theirs else None


def mean_sd(values: list[float]) -> str:
    if not values:
        return "—"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):6.1f} {sd:5.1f}"


def per_seed(group: list[Run], baselines: dict[tuple, Run], times: dict[tuple[int, str], RunTime | None]) -> None:
    """Print one configuration's figures seed by seed, then their means over the seeds that pair (the module's doc)."""
    heads = ("full s", "own wall", "own eval", "paired wall", "paired eval", "train/eval", "baseline", "gap")
    widths = (8, 10, 10, 13, 13, 12, 10, 8)
    formats = (".2f", ".1f", ".1f", ".1f", ".1f", ".2f", ".2f", "+.1f")
    print(f"{'seed':>4}" + "".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True)))

    def line(label: str, values: list[float | None], formats: tuple[str, ...], why: str = "") -> str:
        cells = ("—" if v is None else f"{v:{f}}" for v, f in zip(values, formats, strict=True))
        row = "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        return f"{label:>4}{row}" + (f"  {why}" if why else "")

    paired_rows = []
    for run in sorted(group, key=lambda r: r.seed):
        own = [t.own_saving_pct if (t := times[id(run), c]) else None for c in CLOCKS]
        wall, ratio = times[id(run), "wall"], train_per_eval(times[id(run), "evaluation"])
        values = [wall.full_epoch_s if wall else None, *own, None, None, ratio, None, None]
        baseline = baselines.get(pair_key(run))
        why = "no baseline" if baseline is None else machine_difference(run, baseline)
        if baseline is not None and not why:
            pairs = [(times[id(run), c], times[id(baseline), c]) for c in CLOCKS]
            values[3:5] = [paired_saving(t, bt)[0] if t and bt else None for t, bt in pairs]
            values[6] = train_per_eval(times[id(baseline), "evaluation"])
            values[7] = ratio_gap(times[id(run), "evaluation"], times[id(baseline), "evaluation"])
            paired_rows.append(values)
        print(line(str(run.seed), values, formats, why))
    if paired_rows:
        columns = [[v for v in column if v is not None] for column in zip(*paired_rows, strict=True)]
        means = [statistics.fmean(c) if c else None for c in columns]
        print(line("mean", means, formats, f"over the {len(paired_rows)} paired seeds"))
        sds = [statistics.stdev(c) if len(c) > 1 else None for c in columns]
        print(line("sd", sds, tuple(f.lstrip("+") for f in formats)))


def seed_range(text: str) -> range:
    """`A-B` (both included) or one seed, for --seed-range."""
    first, _, last = text.partition("-")
    try:
        span = range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a seed or a range such as 6-15") from None
    if not span:
        raise argparse.ArgumentTypeError(f"{text!r}: the range is empty")
    return span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger", type=Path, default=None, help="the results ledger (default: ledger/)")
    parser.add_argument("--min-seeds", type=positive_int, default=3, help="configurations with fewer are left out")
    parser.add_argument("--seeds", metavar="CONFIGURATION", help="one configuration seed by seed, e.g. "
                        "dfp/cifar10/lenet/infobatch_r24")  # fmt: skip
    parser.add_argument("--seed-range", type=seed_range, metavar="A-B", help="with --seeds: these seeds alone "
                        "(both ends included), e.g. 6-15")  # fmt: skip
    args = parser.parse_args()
    if args.seed_range and not args.seeds:
        parser.error("--seed-range needs --seeds")
    root = args.ledger or ledger_root()
    if not root.is_dir():
        raise UserError(f"{root}: no results ledger there")
    runs = [r for r in ledger_runs(root) if not collapsed(r)]
    baselines = {pair_key(r): r for r in runs if r.method == BASELINE}
    groups: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        if r.method != BASELINE:
            groups[config_key(r)].append(r)
    times = {(id(r), c): timed(r, c) for r in runs for c in CLOCKS}  # each run's figures once per clock
    if args.seeds:
        named = [group for key, group in groups.items() if "/".join(key[:4]) == args.seeds]
        if not named:
            known = ", ".join(sorted({"/".join(key[:4]) for key in groups}))
            raise UserError(f"--seeds {args.seeds}: no such method configuration in {root}; there: {known}")
        chosen = [r for group in named for r in group if args.seed_range is None or r.seed in args.seed_range]
        if not chosen:
            raise UserError(f"--seeds {args.seeds}: no entry with a seed in {args.seed_range.start}-"
                            f"{args.seed_range.stop - 1}")  # fmt: skip
        print(f"{args.seeds} in {root}, seed by seed: a full epoch's seconds, time saved % (own and paired, wall "
              "and evaluation clock), a full epoch's training seconds per evaluation second (the run's, its "
              "baseline's) and their gap %")  # fmt: skip
        per_seed(chosen, baselines, times)
        return
    shown = {key: group for key, group in sorted(groups.items()) if len(group) >= args.min_seeds}
    if not shown:
        raise UserError(f"{root}: no method configuration has {args.min_seeds} entries or more")

    print(f"time saved % over seeds, {len(runs)} entries of {root}: mean and sd, per saving and clock")
    heads = ["seeds", "paired", "compute"] + [f"{saving} {clock}" for saving in ("own", "paired") for clock in CLOCKS]
    heads.append("ratio gap")
    print(f"{'study/dataset/model/method':<38}" + "".join(f"{h:>{w}}" for h, w in zip(heads, WIDTHS, strict=True)))
    for key, group in shown.items():
        own = {c: [t.own_saving_pct for r in group if (t := times[id(r), c])] for c in CLOCKS}
        with_baseline = [(r, b) for r in group if (b := baselines.get(pair_key(r)))]
        pairs = [(r, b) for r, b in with_baseline if not machine_difference(r, b)]  # trained on one machine
        paired = {
            c: [paired_saving(t, bt)[0] for r, b in pairs if (t := times[id(r), c]) and (bt := times[id(b), c])]
            for c in CLOCKS
        }
        flops = [100 * (1 - r.metrics["total_train_flops"] / b.metrics["total_train_flops"]) for r, b in with_baseline
                 if r.metrics.get("total_train_flops") and b.metrics.get("total_train_flops")]  # fmt: skip
        compute = f"{statistics.fmean(flops):.1f}" if flops else "—"
        both = [ratio_gap(times[id(r), "evaluation"], times[id(b), "evaluation"]) for r, b in pairs]
        gaps = [g for g in both if g is not None]
        gap = f"{statistics.fmean(gaps):+.1f}" if gaps else "—"
        cells = [mean_sd(own[c]) for c in CLOCKS] + [mean_sd(paired[c]) for c in CLOCKS]
        row = [str(len(group)), str(len(pairs)), compute, *cells, gap]
        print(f"{'/'.join(key[:4]):<38}" + "".join(f"{c:>{w}}" for c, w in zip(row, WIDTHS, strict=True)))


if __name__ == "__main__":
    run_command(main)
