"""A run's training time, estimated so that a few slow epochs cannot swing it, and its spread.

On a shared machine an epoch's seconds say as much about the neighbours as about the method: a slow first epoch, or a
few epochs slowed while another job ran, can move a run's summed time by more than a method saves. So a run's
training time is estimated, not summed:

1. Each epoch's seconds are put at the run's typical machine speed, read from the run's own clock: every epoch
   ends by evaluating the same test set on the same device and threads, the same work whatever the method did, so
   its seconds (`eval_s`) move with the machine alone. An epoch's slowdown is the median evaluation seconds of the
   epochs within SPEED_WINDOW of it over the run's median; its training seconds are divided by it (`slowdown`). A
   machine that slows for minutes, or gets quieter late in a run, then moves every kind of epoch alike, whichever
   epochs it hit. A run without an evaluation time in every epoch is taken as measured.
2. Epoch 1 is reported apart (`first_epoch_s`, as measured): it pays one-off costs (allocation, caches,
   compilation) and does not enter the rates below.
3. Each epoch has an amount of work: its `train_flops` (forward + backward FLOPs of its training steps, the same on
   any machine) or, for runs logged before FLOPs were counted, its `trained_samples` (`work_measure`).
4. Epochs fall in kinds. The full epochs do the run's largest work; the cheaper ones are grouped by their work per
   sample (FLOPs per sample; without FLOPs, the parameters they update), so DFP's pruned epochs form one kind and
   WUS's skip epochs another. An epoch of a kind costs about the same per unit of work, so each kind's rate is the
   MEDIAN seconds per unit of work (a full epoch's work) over its epochs after the first: while fewer than half of
   them are slow, it stays within the range of the others. A kind with no epoch after the first uses epoch 1.
5. The run's robust training time (`robust_train_time_s`) = Σ over kinds of the kind's rate × its total work, epoch 1
   included, priced like its kind.

From it: the time saved against the paired baseline (`time_saving_pct`, `paired_saving`), 100·(1 − robust time /
the baseline's), the run's robust time put at the baseline's typical speed first (× the baseline's median evaluation
seconds / the run's: the same evaluation, on the same kind of machine, since only such runs pair), so that a machine
busier during one run than during the other, hours apart, does not enter it either; and the time saved against the
run's own full epochs (`own_time_saving_pct`), 100·(1 − robust time / (epochs × the
full kind's median epoch time)): both sides come from one run, so the drift of a machine between two runs does not
enter it, and a run of full epochs only saves exactly 0. `full_epoch_s` is the full kind's median epoch time, at
the run's typical speed as every epoch above.

Where the time goes: of the epochs after the first that do less than a full epoch's work (DFP's pruned epochs, WUS's
skip epochs), `cheap_time_share` is their median seconds and `cheap_work_share` their median work, both as a share of
a full epoch's. The two are equal where leaving work out saves its time exactly; a time share above the work share
is a cost the work measure does not count (loading, pruning's bookkeeping, a pass that cannot go faster).

Spread: each figure is recomputed from epochs resampled with replacement within each kind (all but epoch 1), in blocks
of BLOCK consecutive epochs of the kind (`resampled_medians`: neighbouring epochs share their speed window and the
machine's load of the moment, so they are not independent), `REPLICATES` times, seeded by the run's name (the same
output on every call); the 2.5th and 97.5th percentiles are its 95% interval. Over seeds (`seed_interval`), each
replicate is averaged over the seeds, and with 2+ seeds the interval is widened to the t-interval over seeds where that
is wider. The interval sees how epochs scatter within a run, not the scatter of a kind that has a single epoch.

Why the evaluation clock: where a method's kinds of epochs keep apart in time, drift within a run moves one kind
alone. InfoBatch's full epochs are its last ones (annealing), so a machine that got quieter late in a run lowered its
full rate alone, and its own saving with it, by tens of points on the ledger's shared CPU. Where full and cheaper
epochs interleave (DFP's schedule) the correction leaves the mean where it was. Between two runs hours apart the
seconds compare the machine's load as much as the methods. `python benchmarks/clock.py` prints both savings read with
both clocks over the ledger's seeds (docs/measured.md).

What the clock cannot see: a run whose training is slower per evaluation second than its baseline's (two machines of
one name whose training and evaluation speeds differ unequally, or load that slows one more than the other). A gap of
g% in that ratio lowers the paired saving below the own one by about (100 − own)·g/100; clock.py prints it per
configuration (its "ratio gap"). The own saving, both sides from one run, is unaffected.

Per kind of epoch, the medians as measured, of the ledger's entries whose study/name holds a word (all without one):

    python -m cheaptrain.timing vgg16-dfp wus_lr-s0
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from cheaptrain import UserError
from cheaptrain.cli import run_command
from cheaptrain.ledger import entries

REPLICATES = 1000
FULL = "full"
SPEED_WINDOW = 2  # epochs on each side whose evaluation seconds give an epoch's machine speed
BLOCK = 2 * SPEED_WINDOW + 1  # consecutive epochs of a kind resampled together: those that share a speed window


@dataclass(frozen=True)
class RunTime:
    """A run's wall-clock figures (module docstring); the `*_replicates`: the same from resampled epochs."""

    work_measure: str  # flops | samples
    first_epoch_s: float
    full_epoch_s: float
    robust_time_s: float
    own_saving_pct: float
    robust_time_replicates: list[float]
    own_saving_replicates: list[float]
    cheap_time_share: float | None = None  # median seconds of the cheaper epochs, of the full epoch's median
    cheap_work_share: float | None = None  # their median work, of a full epoch's
    eval_s: float | None = None  # the median evaluation seconds: the run's typical speed; None without them


def timed(history: list[dict[str, float]]) -> bool:
    """Whether every epoch of a run has its training seconds and samples: else it has no timing figures."""
    return bool(history) and all("epoch_train_s" in row and "trained_samples" in row for row in history)


def epoch_work(history: list[dict[str, float]]) -> tuple[list[float], str]:
    """Each epoch's work and what measures it: train_flops where every epoch has it, else trained_samples."""
    if all("train_flops" in row for row in history):
        return [row["train_flops"] for row in history], "flops"
    return [row["trained_samples"] for row in history], "samples"


def epoch_kinds(history: list[dict[str, float]], work: list[float], measure: str) -> list[str]:
    """Each epoch's kind: FULL for the run's largest work at the largest work per sample, else its work per sample
    (FLOPs per sample; without FLOPs, the parameters it updates)."""
    if measure == "flops":
        per_sample = [w / max(row["trained_samples"], 1) for w, row in zip(work, history, strict=True)]
    else:
        per_sample = [row.get("updated_params", 0.0) for row in history]
    most, costliest = max(work), max(per_sample)
    return [
        FULL if w == most and c == costliest else f"{c:.3g} per sample" for w, c in zip(work, per_sample, strict=True)
    ]


def typical_eval_s(history: list[dict[str, float]]) -> float | None:
    """The run's median evaluation seconds, its typical speed; None without an evaluation time in every epoch."""
    seconds = [row.get("eval_s", 0.0) for row in history]
    return statistics.median(seconds) if seconds and min(seconds) > 0 else None


def slowdown(history: list[dict[str, float]]) -> list[float]:
    """Each epoch's machine slowdown against the run's typical speed: the median evaluation seconds of the epochs
    within SPEED_WINDOW of it over the run's median (module docstring); all 1 without an evaluation time in every
    epoch."""
    typical = typical_eval_s(history)
    if typical is None:
        return [1.0] * len(history)
    seconds = [row["eval_s"] for row in history]
    window = [seconds[max(0, i - SPEED_WINDOW) : i + SPEED_WINDOW + 1] for i in range(len(seconds))]
    return [statistics.median(near) / typical for near in window]


def run_time(history: list[dict[str, float]], seed: str) -> RunTime | None:
    """The robust figures of one run (module docstring); `seed` seeds its resampling. None without per-epoch times
    or work, or when no epoch does both the largest work and the largest work per sample."""
    if not timed(history):
        return None
    seconds = [row["epoch_train_s"] / slow for row, slow in zip(history, slowdown(history), strict=True)]
    work, measure = epoch_work(history)
    kinds = epoch_kinds(history, work, measure)
    most = max(work)
    if FULL not in kinds or most <= 0:
        return None
    share = [w / most for w in work]  # of a full epoch's work: full epochs are exactly 1
    totals: dict[str, float] = {}
    rates: dict[str, list[float]] = {}  # seconds per full epoch's work, epochs after the first
    for i, (kind, part, epoch_s) in enumerate(zip(kinds, share, seconds, strict=True)):
        totals[kind] = totals.get(kind, 0.0) + part
        if i > 0 and part > 0:
            rates.setdefault(kind, []).append(epoch_s / part)
    first_rate = seconds[0] / share[0] if share[0] > 0 else 0.0
    for kind in totals:
        rates.setdefault(kind, [first_rate])  # only epoch 1 is of this kind

    def figures(rate: dict[str, float] | dict[str, np.ndarray]) -> tuple[Any, Any]:  # figures, or arrays of them
        robust = sum(rate[k] * totals[k] for k in totals)
        return robust, 100 * (1 - robust / (len(history) * rate[FULL]))

    robust, own = figures({k: statistics.median(v) for k, v in rates.items()})
    cheap = [i for i in range(1, len(history)) if kinds[i] != FULL and 0 < share[i] < 1]
    full_s = statistics.median(rates[FULL])
    robust_replicates, own_replicates = figures(resampled_medians(rates, seed))
    return RunTime(
        work_measure=measure,
        first_epoch_s=history[0]["epoch_train_s"],
        full_epoch_s=full_s,
        robust_time_s=robust,
        own_saving_pct=own,
        robust_time_replicates=robust_replicates.tolist(),
        own_saving_replicates=own_replicates.tolist(),
        cheap_time_share=statistics.median(seconds[i] for i in cheap) / full_s if cheap else None,
        cheap_work_share=statistics.median(share[i] for i in cheap) if cheap else None,
        eval_s=typical_eval_s(history),
    )


@dataclass(frozen=True)
class KindMedians:
    """One kind of epoch of a run, its epochs after the first: how many, their median work (of a full epoch's) and
    median training seconds as measured."""

    kind: str
    epochs: int
    work_share: float
    median_s: float


def epoch_medians(history: list[dict[str, float]]) -> list[KindMedians]:
    """Per kind of epoch (FULL first, then by work), the medians a person compares by eye: seconds as measured, not
    put at the run's typical speed as run_time puts them. A kind whose only epoch is the first is left out."""
    if not timed(history):
        return []
    work, measure = epoch_work(history)
    kinds, most = epoch_kinds(history, work, measure), max(work)
    groups: dict[str, list[int]] = {}
    for i in range(1, len(history)):
        groups.setdefault(kinds[i], []).append(i)
    found = [
        KindMedians(
            kind,
            len(epochs),
            statistics.median(work[i] / most for i in epochs) if most > 0 else math.nan,
            statistics.median(history[i]["epoch_train_s"] for i in epochs),
        )
        for kind, epochs in groups.items()
    ]
    return sorted(found, key=lambda k: (k.kind != FULL, -k.work_share))


def paired_saving(run: RunTime, baseline: RunTime) -> tuple[float, list[float]]:
    """The time saved against the baseline (%) and its replicates (the two runs resample independently): the run's
    robust time at the baseline's typical speed against the baseline's (module docstring); in seconds as measured
    where either run lacks evaluation times."""
    speed = baseline.eval_s / run.eval_s if run.eval_s and baseline.eval_s else 1.0

    def saving(seconds: float, baseline_seconds: float) -> float:
        return 100 * (1 - seconds * speed / baseline_seconds) if baseline_seconds else math.nan

    pairs = zip(run.robust_time_replicates, baseline.robust_time_replicates, strict=True)
    return saving(run.robust_time_s, baseline.robust_time_s), [saving(t, b) for t, b in pairs]


def resampled_medians(rates: dict[str, list[float]], seed: str) -> dict[str, np.ndarray]:
    """Per kind, the REPLICATES medians of its rates (in epoch order) resampled in blocks: each replicate strings
    together blocks of BLOCK consecutive rates from starts drawn with replacement, wrapping round the kind's end
    (the circular block bootstrap), cut to the kind's count. Neighbouring epochs are not independent (their slowdown
    shares a window; a machine's load lasts minutes), and resampled one by one they would narrow the interval. A kind
    of BLOCK epochs or fewer is resampled one by one."""
    stream = np.random.RandomState(python_random_key(seed))  # seeded by the run's name: the same on every call
    medians = {}
    for kind, values in rates.items():
        n = len(values)
        length = BLOCK if n > BLOCK else 1
        starts = np.floor(stream.random_sample((REPLICATES, -(-n // length))) * n).astype(np.int64)
        picks = ((starts[:, :, None] + np.arange(length)) % n).reshape(REPLICATES, -1)[:, :n]
        medians[kind] = np.median(np.asarray(values)[picks], axis=1)  # the middle one, or the mean of the middle two
    return medians


def python_random_key(seed: str) -> np.ndarray:
    """The MT19937 key that `random.Random(seed)` seeds with for a str: the integer of its UTF-8 bytes followed by their
    SHA-512 digest, in 32-bit words, least significant first (CPython's seeding, version 2)."""
    data = seed.encode()
    number = int.from_bytes(data + hashlib.sha512(data).digest(), "big")
    words = number.to_bytes((number.bit_length() + 31) // 32 * 4 or 4, "little")
    return np.frombuffer(words, dtype="<u4").astype(np.uint32)


def interval(values: list[float]) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles."""
    cuts = statistics.quantiles(values, n=40, method="inclusive")
    return cuts[0], cuts[-1]


def seed_interval(replicates: list[list[float]], mean: float, ci95: float | None) -> tuple[float, float]:
    """The 95% interval of a mean over seeds: `replicates` holds each seed's bootstrap replicates of the figure, whose
    averages see how each run's epochs scatter, not how the seeds differ; so it is widened to the t-interval
    `mean ± ci95` over seeds where that is wider. `ci95`: its half-width, None with one seed; aggregate.summarize
    passes it from 2 seeds on (`aggregate.half_width`: t = 12.706 at 2), though the summary's `_ci95` columns start
    at 3. It always contains the mean."""
    lo, hi = interval([statistics.fmean(r) for r in zip(*replicates, strict=True)])
    if ci95 is not None:
        lo, hi = min(lo, mean - ci95), max(hi, mean + ci95)
    return min(lo, mean), max(hi, mean)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.timing",
        description="Per ledger entry and kind of epoch (full, pruned, skip), the epochs after the first: how many, "
        "their median work and training seconds as measured (epoch_train_s), and those seconds as a share of a full "
        "epoch's: the per-epoch figures docs/measured.md quotes. The report's shares put the seconds at the run's "
        "typical speed first (this module's docstring).",
    )
    parser.add_argument("words", nargs="*", help="the entries whose study/name holds one of them (default: every one)")
    args = parser.parse_args(argv)
    chosen = [e for e in entries() if not args.words or any(w in f"{e.study}/{e.name}" for w in args.words)]
    if not chosen:
        raise UserError("no ledger entry holds those words (`python -m cheaptrain.ledger list` names them)")
    print(f"{'entry':<44} {'device':<34} {'epochs':>6} {'work':>5} {'median s':>9} {'of full':>8}")
    for entry in chosen:
        kinds = epoch_medians(entry.history)
        full = next((k.median_s for k in kinds if k.kind == FULL), math.nan)
        for i, k in enumerate(kinds):
            name, device = (f"{entry.study}/{entry.name}", str(entry.info.get("device"))) if i == 0 else ("", "")
            print(f"{name:<44} {device[:34]:<34} {k.epochs:>6} {k.work_share:>5.2f} {k.median_s:>9.3f} "
                  f"{k.median_s / full:>8.2f}")  # fmt: skip
    print(f"{len(chosen)} entr{'y' if len(chosen) == 1 else 'ies'}; epochs after the first, seconds as measured "
          "(epoch_train_s), work of a full epoch's")  # fmt: skip


if __name__ == "__main__":
    run_command(main)
