"""The aggregate stage: pairing by seed, the interval math, compute saved, the robust wall-clock figures, the papers'
figures joined to the right rows, the tables and the report, "within noise", clear errors for bad input; synthetic
run folders, plus the real quick pipeline (e2e)."""

from __future__ import annotations

import csv
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from cheaptrain import UserError
from cheaptrain.aggregate import (
    SUMMARY_COLUMNS,
    Run,
    accuracy_measures,
    add_published,
    collect,
    describe,
    load_published,
    read_summary,
    summarize,
    summary_csv,
    t975,
)
from cheaptrain.check import LEDGER_ONLY, NOT_GATED, WALL_CLOCK_GATES
from cheaptrain.report.equal_cost import Paired, cost_table, implementation_of, paired_lead
from cheaptrain.report.figures import (
    FIGURES,
    LEDGER_FIGURES,
    cost_figure,
    curve_figure,
    phases_figure,
    pruned_figure,
    saving_figure,
    spans,
)
from cheaptrain.report.tables import findings, paper_tables, setting_differences
from cheaptrain.timing import (
    BLOCK,
    FULL,
    REPLICATES,
    epoch_medians,
    paired_saving,
    resampled_medians,
    run_time,
    slowdown,
)

from conftest import REPO, grid, read_csv, run_in, write_run

PUBLISHED = REPO / "data" / "published_results.csv"
MEASURES = {"dfp": "best3_acc", "wus": "final_acc"}


FLOPS_PER_SAMPLE = 1.2e6  # forward + backward of a normal step
SKIP_FLOPS_PER_SAMPLE = 0.4e6  # a WUS skip step: the forward and the last layer's bias


def synthetic_run(
    root: Path, study: str, dataset: str, model: str, method: str, seed: int, epochs: int = 10, flops: bool = True
) -> dict:
    """A plausible run: accuracy rises, DFP prunes from epoch 4, WUS skips from epoch 6 (one fallback at 8); without
    `flops`, a run logged before FLOPs were counted."""
    history = []
    for e in range(1, epochs + 1):
        row = {"epoch": e, "lr": 0.02 if e <= 6 else 0.004, "train_loss": 2 / e, "train_acc": 30 + 3 * e}
        pruned = 5000 if method in ("dfp", "random_prune") and e >= 4 else 0
        skip = method in ("wus", "wus_lr") and e >= 6 and e != 8
        row["trained_samples"] = 50000 - pruned
        row["epoch_train_s"] = (1.0 if skip else 3.0 * (1 - pruned / 50000)) + 0.01 * seed
        if flops:
            row["train_flops"] = row["trained_samples"] * (SKIP_FLOPS_PER_SAMPLE if skip else FLOPS_PER_SAMPLE)
        drop = {"dfp": 0.3, "random_prune": 0.8, "wus": 1.0, "wus_lr": 0.6}.get(method, 0)
        row["test_acc"] = 40 + 20 * (1 - math.exp(-e / 3)) - drop * (e >= 4) + seed * 0.5
        row |= {"test_loss": 1.0, "eval_s": 0.2}
        if method in ("dfp", "random_prune"):
            row |= {"pruned_samples": pruned, "flagged_samples": 100, "dropping_count_max": 3, "selection_s": 0.01}
        if method in ("wus", "wus_lr"):
            row |= {"phase": int(skip), "updated_params": 10 if skip else 62006, "val_acc_std": 0.5}
        history.append(row)
    accs = [r["test_acc"] for r in history]
    metrics = {
        "final_acc": accs[-1],
        "best_acc": max(accs),
        "best3_acc": sum(sorted(accs)[-3:]) / 3,
        "train_time_s": sum(r["epoch_train_s"] for r in history),
        "eval_time_s": 2.0,
        "wall_time_s": 40.0,
        "total_trained_samples": sum(r["trained_samples"] for r in history),
        "epochs": epochs,
    }
    if flops:
        metrics["total_train_flops"] = sum(r["train_flops"] for r in history)
    if method in ("dfp", "random_prune"):
        metrics |= {"planned_pruning_epochs": 7, "planned_saving_pct": 7.0, "pruning_epochs": 7,
                    "pruned_samples_total": 35000, "selection_s_total": 0.07, "overhead_s": 0.1}  # fmt: skip
    if method in ("wus", "wus_lr"):
        metrics |= {"initial_epoch": 5, "skip_epochs": 4, "normal_epochs": 6, "updated_params_total": 372076,
                    "updated_params_reduction_pct": 40.0 + seed, "trainable_in_skip": 10}  # fmt: skip
    recipe = {"epochs": epochs, "batch_size": 128, "lr": 0.02, "schedule": "step", "step_size": 4, "gamma": 0.1,
              "momentum": 0.9, "weight_decay": 1e-4, "augment": study == "dfp"}  # fmt: skip
    write_run(root, study, f"{dataset}-{model}-{method}-s{seed}", history, metrics, {"recipe": recipe})
    return metrics


def synthetic_grid(root: Path, seeds=(0, 1, 2), models=("lenet",), flops: bool = True) -> dict:
    params = {
        "grid": {
            "dfp": {"datasets": ["cifar10"], "models": list(models), "methods": ["baseline", "dfp", "random_prune"],
                    "seeds": list(seeds)},
            "wus": {"datasets": ["cifar10"], "models": list(models), "methods": ["baseline", "wus", "wus_lr"],
                    "seeds": list(seeds)},
        }
    }  # fmt: skip
    for study, g in params["grid"].items():
        for model in g["models"]:
            for method in g["methods"]:
                for seed in g["seeds"]:
                    synthetic_run(root, study, "cifar10", model, method, seed, flops=flops)
    return params


def by_key(summary: list[dict]) -> dict[tuple, dict]:
    return {(r["study"], r["dataset"], r["model"], r["method"]): r for r in summary}


def test_describe_matches_a_hand_computed_t_interval():
    mean, sd, ci = describe([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert sd == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert ci == pytest.approx(4.303 * sd / math.sqrt(3))  # t_{0.975, 2} = 4.303
    assert describe([5.0]) == (5.0, None, None)
    assert describe([1.0, 3.0])[2] is None  # no interval under 3 seeds
    many = [float(i % 7) for i in range(40)]
    assert describe(many)[2] == pytest.approx(2.0227 * describe(many)[1] / math.sqrt(40), rel=1e-4)  # beyond the table


@pytest.mark.parametrize(("df", "exact"), [(31, 2.0395), (40, 2.0211), (60, 2.0003), (120, 1.9799), (1000, 1.9623)])
def test_the_t_quantile_beyond_the_table_is_the_exact_one(df, exact):
    """Past the table's 30 degrees of freedom the quantile keeps falling towards 1.96, not straight to it."""
    assert t975(df + 1) == pytest.approx(exact, abs=1e-4)  # t975 takes the number of seeds, df + 1


def test_the_t_quantile_falls_smoothly_from_the_table_to_its_expansion():
    assert t975(30 + 1) == 2.042 > t975(31 + 1) > t975(32 + 1) > 1.96


def test_two_seeds_widen_the_time_saving_intervals_by_the_spread_between_them(tmp_path):
    """Each run's epochs take the same seconds, so its bootstrap has no spread; the seeds' savings differ (26.67%,
    18.67%): both intervals are the t-interval over the 2 seeds, t = 12.706, while the summary's ci95 columns start at
    3 seeds as before."""
    for seed, cheap in ((0, 1.0), (1, 1.6)):
        write_timed_run(tmp_path, "baseline", timed_history([3.0] * 10), seed)
        write_timed_run(tmp_path, "wus", timed_history([3.0] * 6 + [cheap] * 4, skip={7, 8, 9, 10}), seed)
    params = {"grid": {"wus": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline", "wus"],
                               "seeds": [0, 1]}}}  # fmt: skip
    row = by_key(summarize(collect(params, tmp_path), MEASURES))[("wus", "cifar10", "lenet", "wus")]
    savings = [100 * (1 - (18 + 4 * cheap) / 30) for cheap in (1.0, 1.6)]
    half = 12.706 * statistics.stdev(savings) / math.sqrt(2)
    for name in ("own_time_saving_pct", "time_saving_pct"):
        assert row[f"{name}_mean"] == pytest.approx(statistics.fmean(savings))
        assert row[f"{name}_lo"] == pytest.approx(statistics.fmean(savings) - half)
        assert row[f"{name}_hi"] == pytest.approx(statistics.fmean(savings) + half)
        assert row[f"{name}_ci95"] is None and row[f"{name}_std"] == pytest.approx(statistics.stdev(savings))


def test_methods_are_paired_with_the_baseline_of_the_same_seed(tmp_path):
    params = synthetic_grid(tmp_path)
    summary = by_key(summarize(collect(params, tmp_path), MEASURES))
    dfp, base = summary[("dfp", "cifar10", "lenet", "dfp")], summary[("dfp", "cifar10", "lenet", "baseline")]
    assert dfp["seeds"] == 3 and dfp["acc_measure"] == "best3_acc"
    runs = {s: json.loads((tmp_path / "dfp" / f"cifar10-lenet-{m}-s{s}" / "metrics.json").read_text())
            for m in ("dfp",) for s in (0, 1, 2)}  # fmt: skip
    bases = {s: json.loads((tmp_path / "dfp" / f"cifar10-lenet-baseline-s{s}" / "metrics.json").read_text())
             for s in (0, 1, 2)}  # fmt: skip
    savings = [100 * (1 - runs[s]["train_time_s"] / bases[s]["train_time_s"]) for s in (0, 1, 2)]
    deltas = [runs[s]["best3_acc"] - bases[s]["best3_acc"] for s in (0, 1, 2)]
    assert dfp["time_saving_pct_mean"] == pytest.approx(sum(savings) / 3)
    assert dfp["time_saving_pct_ci95"] == pytest.approx(describe(savings)[2])
    assert dfp["acc_delta_mean"] == pytest.approx(sum(deltas) / 3)
    assert dfp["acc_delta_mean"] == pytest.approx(-0.3)  # the same offset every seed: paired, the seed effect cancels
    assert dfp["acc_delta_std"] == pytest.approx(0, abs=1e-9)
    assert dfp["sample_saving_pct_mean"] == pytest.approx(7.0)  # 7 epochs of 10% pruned
    assert dfp["planned_saving_pct_mean"] == 7.0
    assert "acc_delta_mean" not in base and "time_saving_pct_mean" not in base
    wus = summary[("wus", "cifar10", "lenet", "wus")]
    assert wus["acc_measure"] == "final_acc"
    assert wus["acc_delta_mean"] == pytest.approx(-1.0)
    assert wus["updated_params_reduction_pct_mean"] == pytest.approx(41.0)
    assert wus["mlflow_run_ids"] == "cifar10-lenet-wus-s0 cifar10-lenet-wus-s1 cifar10-lenet-wus-s2"


def test_own_time_saving_compares_a_run_with_its_own_full_epochs(tmp_path):
    """Full epochs: the run's largest work; cheaper epochs priced by their kind's time per unit of work."""
    params = synthetic_grid(tmp_path)
    summary = by_key(summarize(collect(params, tmp_path), MEASURES))

    def saving(full: float, cheap: float, n_full: int, n_cheap: int) -> float:
        return 100 * (1 - (n_full * full + n_cheap * cheap) / ((n_full + n_cheap) * full))

    seeds = (0, 1, 2)
    dfp = [saving(3.0 + 0.01 * s, 2.7 + 0.01 * s, 3, 7) for s in seeds]  # 7 epochs leave out 10%
    wus = [saving(3.0 + 0.01 * s, 1.0 + 0.01 * s, 6, 4) for s in seeds]  # 4 skip epochs, one fallback among them
    assert summary[("dfp", "cifar10", "lenet", "dfp")]["own_time_saving_pct_mean"] == pytest.approx(sum(dfp) / 3)
    assert summary[("wus", "cifar10", "lenet", "wus")]["own_time_saving_pct_mean"] == pytest.approx(sum(wus) / 3)
    # where the time goes: a cheaper epoch's seconds and work, each as a share of a full epoch's
    cheap = {m: summary[("dfp" if m == "dfp" else "wus", "cifar10", "lenet", m)] for m in ("dfp", "wus")}
    assert cheap["dfp"]["cheap_work_share_mean"] == pytest.approx(0.9)  # 10% of the samples left out
    assert cheap["dfp"]["cheap_time_share_mean"] == pytest.approx(
        sum((2.7 + 0.01 * s) / (3 + 0.01 * s) for s in seeds) / 3
    )
    assert cheap["wus"]["cheap_work_share_mean"] == pytest.approx(1 / 3)  # the forward pass of a forward + backward
    assert cheap["wus"]["cheap_time_share_mean"] == pytest.approx(
        sum((1 + 0.01 * s) / (3 + 0.01 * s) for s in seeds) / 3
    )
    baseline = summary[("dfp", "cifar10", "lenet", "baseline")]
    assert "cheap_time_share_mean" not in baseline and "cheap_work_share_mean" not in baseline  # no cheaper epochs
    assert baseline["own_time_saving_pct_mean"] == 0  # exactly, however its epochs scatter
    assert baseline["first_epoch_s_mean"] == pytest.approx(3.01) and baseline["full_epoch_s_mean"] == pytest.approx(
        3.01
    )
    assert run_time([{"epoch_train_s": 1.0}], "no work") is None and run_time([], "empty") is None


def test_resampled_medians_keep_neighbouring_epochs_together():
    """A machine's load lasts minutes: a kind whose rates run slow for a stretch of epochs, resampled in blocks, spreads
    its median wider than the same rates resampled one by one, which takes neighbours as independent. Seeded by the
    run's name: the same replicates on every call, others for another run."""
    rng = random.Random(7)
    rates = [1.0 + 0.02 * rng.random() + (0.3 if 60 <= e < 100 else 0.0) for e in range(170)]  # 40 slow in a row
    blocked = resampled_medians({"kind": rates, "short": rates[:BLOCK]}, "dfp/cifar10-lenet-dfp-s0")
    low, high = np.percentile(blocked["kind"], [2.5, 97.5])
    draws = np.random.default_rng(0).integers(0, len(rates), (REPLICATES, len(rates)))
    one_by_one = np.median(np.asarray(rates)[draws], axis=1)
    low_1, high_1 = np.percentile(one_by_one, [2.5, 97.5])
    assert high - low > 1.5 * (high_1 - low_1)
    assert blocked["kind"].shape == (REPLICATES,) and set(blocked["short"]) <= set(rates[:BLOCK])  # odd: one of them
    again = resampled_medians({"kind": rates, "short": rates[:BLOCK]}, "dfp/cifar10-lenet-dfp-s0")
    assert np.array_equal(again["kind"], blocked["kind"])
    assert not np.array_equal(resampled_medians({"kind": rates}, "dfp/cifar10-lenet-dfp-s1")["kind"], blocked["kind"])


def timed_history(seconds: list[float], skip: set[int] = frozenset()) -> list[dict[str, float]]:
    """Epochs of 50,000 samples taking `seconds`; the epochs in `skip` are WUS skip epochs."""
    return [
        {"epoch": e, "test_acc": 50.0 + e, "epoch_train_s": t, "trained_samples": 50000,
         "train_flops": 50000 * (SKIP_FLOPS_PER_SAMPLE if e in skip else FLOPS_PER_SAMPLE),
         "updated_params": 10 if e in skip else 62006}
        for e, t in enumerate(seconds, 1)
    ]  # fmt: skip


def test_the_first_epoch_is_priced_at_the_full_epochs_rate_not_counted_among_them():
    """Epoch 1 (compiling, warming caches) is timed apart: left out of its kind's rates, its work is priced at the
    median of the later full epochs."""
    t = run_time(timed_history([100.0, 1.0, 1.0, 2.0]), "epoch 1 apart")
    assert t.first_epoch_s == 100.0
    assert t.full_epoch_s == 1.0  # the median of epochs 2-4; with epoch 1 among them, 1.5
    assert t.robust_time_s == 4.0  # four full epochs at 1 s
    assert t.own_saving_pct == 0.0


def write_timed_run(root: Path, method: str, history: list[dict[str, float]], seed: int = 0) -> None:
    metrics = {"final_acc": 60.0, "best_acc": 60.0, "best3_acc": 60.0, "epochs": len(history),
               "train_time_s": sum(r["epoch_train_s"] for r in history),
               "total_trained_samples": sum(r["trained_samples"] for r in history),
               "total_train_flops": sum(r["train_flops"] for r in history)}  # fmt: skip
    write_run(root, "wus", f"cifar10-lenet-{method}-s{seed}", history, metrics)


def nearest_full_epoch_saving(history: list[dict[str, float]]) -> float:
    """The estimator the robust one replaces, for contrast: each cheaper epoch priced at its nearest full epochs."""
    times = [r["epoch_train_s"] for r in history]
    full = [i for i, r in enumerate(history) if r["updated_params"] == max(h["updated_params"] for h in history)]

    def price(i: int) -> float:
        nearest = [i] if i in full else [j for j in full if j < i][-1:] + [j for j in full if j > i][:1]
        return sum(times[j] for j in nearest) / len(nearest)

    return 100 * (1 - sum(times) / sum(price(i) for i in range(len(times))))


def test_a_slow_first_epoch_and_a_few_slow_epochs_do_not_move_the_robust_savings(tmp_path):
    """WUS with skip epochs 8-10 (2.6 s against 6 s) saves 17.0% of a 10-epoch run, against its baseline and against
    its own full epochs. Epoch 1 at 10x and two later epochs at 2-5x, in both runs, move neither by a point."""
    jitter = [1.00, 1.01, 0.99, 1.02, 0.98, 1.00, 1.01, 0.99, 1.00, 1.02]
    base_quiet = [6.0 * j for j in jitter]
    wus_quiet = [6.0 * j if e <= 7 else 2.6 * j for e, j in enumerate(jitter, 1)]
    truth = 100 * (1 - (7 * 6.0 + 3 * 2.6) / (10 * 6.0))
    slow = {"baseline": {1: 10, 5: 3, 7: 2}, "wus": {1: 10, 4: 5, 9: 2}}  # epoch: how many times slower
    base_noisy = [t * slow["baseline"].get(e, 1) for e, t in enumerate(base_quiet, 1)]
    wus_noisy = [t * slow["wus"].get(e, 1) for e, t in enumerate(wus_quiet, 1)]
    params = {"grid": {"wus": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline", "wus"],
                               "seeds": [0]}}}  # fmt: skip
    figures = {}
    for name, (base, wus) in {"quiet": (base_quiet, wus_quiet), "noisy": (base_noisy, wus_noisy)}.items():
        root = tmp_path / name
        write_timed_run(root, "baseline", timed_history(base))
        write_timed_run(root, "wus", timed_history(wus, skip={8, 9, 10}))
        figures[name] = by_key(summarize(collect(params, root), MEASURES))[("wus", "cifar10", "lenet", "wus")]
    for name in ("quiet", "noisy"):
        for column in ("time_saving_pct_mean", "own_time_saving_pct_mean"):
            assert figures[name][column] == pytest.approx(truth, abs=1.0), (name, column)
    noisy = figures["noisy"]
    assert noisy["first_epoch_s_mean"] == pytest.approx(60.0)
    assert noisy["full_epoch_s_mean"] == pytest.approx(6.0, abs=0.1)  # the median of epochs 2-7, one at 5x
    assert noisy["compute_saving_pct_mean"] == pytest.approx(100 * 3 * (1 - 1 / 3) / 10)  # the bound, above 17%
    assert noisy["own_time_saving_pct_lo"] <= noisy["own_time_saving_pct_mean"] <= noisy["own_time_saving_pct_hi"]
    # what the slow epochs did to the summed times and to the nearest-full-epoch estimator
    assert abs(100 * (1 - sum(wus_noisy) / sum(base_noisy)) - truth) > 10
    assert abs(nearest_full_epoch_saving(timed_history(wus_noisy, skip={8, 9, 10})) - truth) > 5
    again = by_key(summarize(collect(params, tmp_path / "noisy"), MEASURES))[("wus", "cifar10", "lenet", "wus")]
    assert again == noisy  # the bootstrap is seeded: the same intervals every time


def test_epoch_medians_are_per_kind_as_measured_without_the_first_epoch():
    """WUS's shape: full epochs at about 4 s (one at 40: a busy neighbour), skip epochs at a third of the work and
    about 1.5 s, and a kind whose only epoch is the first (half the work, 30 s): it is left out. The seconds are as
    measured: the evaluation times, which double halfway, would change them in run_time."""
    history = []
    for e, (seconds, work) in enumerate([(30.0, 0.5), (4.0, 1), (40.0, 1), (4.2, 1), (1.5, 1 / 3), (1.4, 1 / 3)], 1):
        history.append({"epoch": e, "epoch_train_s": seconds, "trained_samples": 50000,
                        "train_flops": 50000 * work * FLOPS_PER_SAMPLE, "eval_s": 1.0 if e < 4 else 2.0})  # fmt: skip
    full, skip = epoch_medians(history)
    assert (full.kind, full.epochs, full.work_share, full.median_s) == (FULL, 3, 1.0, 4.2)
    assert (skip.epochs, skip.median_s) == (2, pytest.approx(1.45)) and skip.work_share == pytest.approx(1 / 3)
    assert epoch_medians([{k: v for k, v in r.items() if k != "epoch_train_s"} for r in history]) == []


def test_the_evaluation_clock_takes_out_drift_that_hit_one_kind_of_epoch_alone():
    """InfoBatch's shape: pruned epochs 2-35 at 0.8 of a full epoch's work, full epochs 36-40 last. The machine runs
    at half speed until epoch 30, training and evaluation alike: the seconds as measured price the pruned epochs at
    the slow speed and the full ones at the fast, an own saving far from the truth; the evaluation clock recovers it.
    One evaluation slowed alone (epoch 33) moves nothing: an epoch's speed is the median of five evaluations."""
    epochs, slow_until, pruned = 40, 30, range(2, 36)
    truth = 100 * (1 - (epochs - 0.2 * len(pruned)) / epochs)  # 17%: time saved exactly as work
    history = []
    for e in range(1, epochs + 1):
        work = 0.8 if e in pruned else 1.0
        machine = 2.0 if e <= slow_until else 1.0  # how many times slower than the quiet machine
        history.append({
            "epoch": e, "epoch_train_s": 5.0 * work * machine, "trained_samples": 50000 * work,
            "train_flops": 50000 * work * FLOPS_PER_SAMPLE, "eval_s": (0.5 if e != 33 else 3.0) * machine,
        })  # fmt: skip
    measured = run_time([{k: v for k, v in r.items() if k != "eval_s"} for r in history], "as measured")
    clocked = run_time(history, "evaluation clock")
    assert abs(measured.own_saving_pct - truth) > 20  # the pruned epochs priced at the slow machine: a negative saving
    assert clocked.own_saving_pct == pytest.approx(truth)
    assert clocked.cheap_time_share == pytest.approx(0.8) and clocked.cheap_work_share == pytest.approx(0.8)
    assert clocked.full_epoch_s == pytest.approx(10.0)  # at the run's typical (median) speed, the slow one here
    assert clocked.first_epoch_s == 10.0  # epoch 1 as measured: its one-off costs are what it reports
    speed = slowdown(history)
    assert speed[0] == 1.0 and speed[-1] == 0.5  # the typical speed is the slow one; the quiet end runs at twice it
    assert speed[32] == speed[31] == 0.5  # epoch 33's slow evaluation alone is no drift: the speed of its neighbours
    # its baseline, hours earlier, full epochs throughout on a machine 1.5x slower still: paired at its typical speed
    machine = [1.5 * (2.0 if e <= slow_until else 1.0) for e in range(1, epochs + 1)]
    base = [{"epoch": e, "epoch_train_s": 5.0 * m, "trained_samples": 50000, "train_flops": 50000 * FLOPS_PER_SAMPLE,
             "eval_s": 0.5 * m} for e, m in enumerate(machine, 1)]  # fmt: skip
    saving, spread = paired_saving(clocked, run_time(base, "baseline"))
    assert saving == pytest.approx(truth) and min(spread) <= saving <= max(spread)
    seconds = paired_saving(measured, run_time([{k: v for k, v in r.items() if k != "eval_s"} for r in base], "b"))[0]
    assert abs(seconds - truth) > 20  # in seconds as measured: the slower machine's time counted as saved


def test_compute_saving_is_exact_and_intervals_cover_the_seeds(tmp_path):
    params = synthetic_grid(tmp_path)
    summary = by_key(summarize(collect(params, tmp_path), MEASURES))
    dfp, wus = summary[("dfp", "cifar10", "lenet", "dfp")], summary[("wus", "cifar10", "lenet", "wus")]
    assert dfp["compute_saving_pct_mean"] == pytest.approx(7.0, rel=1e-12)  # 7 epochs of 10% fewer samples
    assert wus["compute_saving_pct_mean"] == pytest.approx(4 * (1 - 1 / 3) * 10, rel=1e-12)  # 4 skip epochs at 1/3
    assert dfp["compute_saving_pct_std"] == pytest.approx(0, abs=1e-12) and dfp["work_measure"] == "flops"
    assert "compute_saving_pct_mean" not in summary[("dfp", "cifar10", "lenet", "baseline")]
    for row in (dfp, wus):  # 3 seeds: at least the t-interval over seeds
        mean, ci = row["time_saving_pct_mean"], row["time_saving_pct_ci95"]
        assert row["time_saving_pct_lo"] <= mean - ci and row["time_saving_pct_hi"] >= mean + ci


def test_runs_without_train_flops_still_aggregate(tmp_path):
    """Runs logged before FLOPs were counted: epochs weighed by trained samples, WUS kinds by updated parameters."""
    params = synthetic_grid(tmp_path, seeds=(0,), flops=False)
    summary = add_published(summarize(collect(params, tmp_path), MEASURES), load_published(PUBLISHED))
    rows = by_key(summary)
    wus = rows[("wus", "cifar10", "lenet", "wus")]
    assert wus["work_measure"] == "samples" and "compute_saving_pct_mean" not in wus
    assert wus["own_time_saving_pct_mean"] == pytest.approx(100 * (1 - (6 * 3.0 + 4 * 1.0) / 30))
    assert wus["time_saving_pct_mean"] == pytest.approx(100 * (1 - 22.0 / 30))
    lines = findings(summary, {"acc_points": 0.5, "saving_points": 3.0})
    assert any("cifar10/lenet/wus" in line and "compute saved unknown (runs without train_flops" in line
               for line in lines)  # fmt: skip


def test_published_figures_join_the_right_rows():
    published = load_published(PUBLISHED)
    rows = [
        {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": "baseline", "acc_mean": 75.0},
        {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": "dfp", "acc_mean": 74.0,
         "acc_delta_mean": -1.0, "time_saving_pct_mean": 10.0},
        {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": "random_prune", "acc_mean": 74.0},
        {"study": "wus", "dataset": "cifar100", "model": "vgg16", "method": "wus_lr", "acc_mean": 69.0,
         "acc_delta_mean": -1.0, "updated_params_reduction_pct_mean": 50.0},
        {"study": "wus", "dataset": "cifar10", "model": "lenet", "method": "wus", "acc_mean": 60.0},
    ]  # fmt: skip
    base, dfp, control, wus_lr, lenet_wus = add_published(rows, published)
    assert base["paper_acc"] == 75.15 and base["paper_train_time_s"] == 1220
    assert dfp["paper_acc"] == 74.72 and dfp["paper_acc_delta"] == pytest.approx(74.72 - 75.15)
    assert dfp["acc_delta_vs_paper"] == pytest.approx(-1.0 - (74.72 - 75.15))
    assert dfp["paper_time_saving_pct"] == 11.80 and dfp["time_saving_vs_paper"] == pytest.approx(10 - 11.8)
    assert dfp["paper_overhead_s"] == 4.27
    assert not any(k.startswith("paper_") for k in control)  # the random control is not in the paper
    assert wus_lr["paper_acc"] == 69.79 and wus_lr["paper_acc_delta"] == pytest.approx(69.79 - 70.82)
    assert wus_lr["paper_time_saving_pct"] == 34.05 and wus_lr["paper_updated_params_reduction_pct"] == 56
    assert wus_lr["updated_params_reduction_vs_paper"] == pytest.approx(-6)
    assert not any(k.startswith("paper_") for k in lenet_wus)  # the WUS paper has no LeNet


def test_tables_are_laid_out_like_the_papers(tmp_path):
    params = synthetic_grid(tmp_path)
    summary = add_published(summarize(collect(params, tmp_path), MEASURES), load_published(PUBLISHED))
    tables = {t.slug: t for t in paper_tables(summary)}
    assert list(tables) == ["dfp_table1", "dfp_table2", "wus_table1", "wus_table2", "wus_table3"]
    t1 = tables["dfp_table1"]
    assert t1.headers[:4] == ["dataset", "model", "method", "seeds"]
    assert {"time saved %", "paper %", "planned saving %", "samples saved %"} <= set(t1.headers)
    rows = {r[2]: dict(zip(t1.headers, r, strict=True)) for r in t1.rows}
    assert rows["dfp"]["paper %"] == "11.80" and rows["random_prune"]["paper %"] == "not in the paper"
    assert rows["baseline"]["time saved %"] == "—"
    dfp = by_key(summary)[("dfp", "cifar10", "lenet", "dfp")]
    lo, hi = dfp["time_saving_pct_lo"], dfp["time_saving_pct_hi"]
    assert rows["dfp"]["time saved %"] == f"{dfp['time_saving_pct_mean']:.1f} [{lo:.1f}, {hi:.1f}]"  # 95% interval
    assert rows["dfp"]["compute saved %"] == "7.0 ± 0.0" and rows["baseline"]["compute saved %"] == "—"
    assert {"1st epoch s", "full epoch s", "own time saved %"} <= set(t1.headers)
    t2 = {r[2]: dict(zip(tables["dfp_table2"].headers, r, strict=True)) for r in tables["dfp_table2"].rows}
    assert "best-3 acc %" in tables["dfp_table2"].headers and t2["baseline"]["paper %"] == "75.15"
    assert t2["dfp"]["paper Δ"] == "-0.43"
    assert [r[2] for r in tables["wus_table3"].rows] == ["wus", "wus_lr"]  # Table 3 has no baseline row
    assert all("not in the paper" in r for r in tables["wus_table3"].rows)  # the WUS paper has no LeNet
    assert "final acc %" in tables["wus_table2"].headers


def noise_rows() -> list[dict]:
    """One-seed summary rows of DFP and its control, each a case of the within-noise rules."""

    def row(model: str, method: str, time: tuple[float, float, float], paper: float | None = None, **more) -> dict:
        figures = dict(zip(("time_saving_pct_mean", "time_saving_pct_lo", "time_saving_pct_hi"), time, strict=True))
        if paper is not None:
            figures |= {"paper_time_saving_pct": paper, "time_saving_vs_paper": time[0] - paper}
        return {"study": "dfp", "dataset": "cifar10", "model": model, "method": method, "seeds": 1,
                "acc_measure": "best3_acc", "acc_mean": 60.0} | figures | more  # fmt: skip

    def own(mean: float, lo: float, hi: float) -> dict:
        return {"own_time_saving_pct_mean": mean, "own_time_saving_pct_lo": lo, "own_time_saving_pct_hi": hi}

    return [
        row("lenet", "dfp", (51.6, 45.0, 58.0), 11.8, compute_saving_pct_mean=12.0),  # far above its bound
        # less work, slower
        row("lenet", "random_prune", (-61.5, -70.0, -50.0), compute_saving_pct_mean=12.0, **own(-3.0, -8.0, 2.0)),
        row("vgg13", "dfp", (12.0, 5.0, 13.0), 7.4, compute_saving_pct_mean=12.0),  # the paper's inside our interval
        # saved time: a finding; its own above the bound, but not wholly by more than 3 points
        row("vgg13", "random_prune", (10.0, 8.0, 12.0), compute_saving_pct_mean=12.0, **own(16.0, 13.0, 18.0)),
        row("vgg16", "dfp", (2.0, 1.5, 2.5), 7.56, compute_saving_pct_mean=12.0),  # a mismatch
        row("vgg16", "random_prune", (2.0, -1.0, 5.0), compute_saving_pct_mean=12.0),  # 0 inside the interval
        row("resnet18", "random_prune", (-20.0, -25.0, -15.0), sample_saving_pct_mean=12.0),  # no FLOPs: samples
        row("resnet34", "dfp", (14.0, 10.0, 18.0), 13.43, compute_saving_pct_mean=20.0),  # within 3 points: a match
        # both more than 3 points above the bound, the paper silent
        row("alexnet", "random_prune", (42.3, 32.4, 46.2), compute_saving_pct_mean=23.7, **own(30.0, 27.0, 33.0)),
    ]


def test_time_savings_within_noise_are_marked_and_never_called_findings_or_mismatches():
    rows = noise_rows()
    lines = {(r["model"], r["method"]): line for r, line in
             zip(rows, findings(rows, {"acc_points": 0.5, "saving_points": 3.0}), strict=True)}  # fmt: skip
    above = "vs the paper's +11.80%: above the compute saved (12.00%), its bound: noise, not a finding"
    assert f"time saved +51.60% [+45.00, +58.00] {above}" in lines["lenet", "dfp"]
    assert "compute saved +12.00% (the bound for the time saved)" in lines["lenet", "dfp"]
    assert "time saved -61.50% [-70.00, -50.00]: within noise (not in the paper)" in lines["lenet", "random_prune"]
    assert "own full epochs -3.00% [-8.00, +2.00]: within noise" in lines["lenet", "random_prune"]
    assert "vs the paper's +7.40%: within noise (neither a match nor a mismatch)" in lines["vgg13", "dfp"]
    assert "within noise" not in lines["vgg13", "random_prune"]
    assert "own full epochs +16.00% [+13.00, +18.00]" in lines["vgg13", "random_prune"]
    assert "above the compute saved" not in lines["vgg13", "random_prune"]  # its interval starts 1 point above it
    bound = "above the compute saved (23.70%), its bound: noise, not a finding"  # more than 3 above, the paper silent
    assert f"time saved +42.30% [+32.40, +46.20]: {bound} (not in the paper)" in lines["alexnet", "random_prune"]
    assert f"own full epochs +30.00% [+27.00, +33.00]: {bound}" in lines["alexnet", "random_prune"]
    assert "does NOT match (-5.56, beyond ±3.00 and outside our interval)" in lines["vgg16", "dfp"]
    assert "within noise" not in lines["vgg16", "dfp"] and "does NOT match" not in lines["lenet", "dfp"]
    assert "time saved +2.00% [-1.00, +5.00]: within noise" in lines["vgg16", "random_prune"]
    assert "time saved -20.00% [-25.00, -15.00]: within noise" in lines["resnet18", "random_prune"]
    assert "vs the paper's +13.43%: matches" in lines["resnet34", "dfp"]  # inside our interval too, but close

    table = next(t for t in paper_tables(rows) if t.slug == "dfp_table1")
    cells = {(r[1], r[2]): dict(zip(table.headers, r, strict=True)) for r in table.rows}
    assert cells["lenet", "random_prune"]["time saved %"] == "-61.5 [-70.0, -50.0] within noise"
    assert cells["lenet", "random_prune"]["own time saved %"] == "-3.0 [-8.0, 2.0] within noise"
    assert cells["resnet18", "random_prune"]["time saved %"] == "-20.0 [-25.0, -15.0] within noise"
    assert cells["vgg13", "dfp"]["time saved %"] == "12.0 [5.0, 13.0]"  # 0 is outside; the paper's 7.4 inside
    assert cells["vgg13", "dfp"]["diff"] == "+4.6 within noise"
    assert cells["vgg16", "dfp"]["diff"] == "-5.6" and cells["lenet", "dfp"]["compute saved %"] == "12.0"
    negative = [c["time saved %"] for c in cells.values() if c["time saved %"].startswith("-")]
    assert negative and all(c.endswith("within noise") for c in negative)

    (ax,) = [a for a in saving_figure(rows).axes if a.get_visible()]
    marked = [t.get_position()[0] for t in ax.texts if t.get_text() == "noise"]
    time_bar = -0.1  # offset of the time bars; own time bars at +0.1
    assert sorted(marked) == pytest.approx([1 + time_bar, 1 + 0.1, 5 + time_bar, 6 + time_bar])


def test_a_method_slower_than_its_own_full_epochs_is_not_within_noise():
    """Against the baseline's run, a method that did less work yet lost time is within noise (a machine busier during
    one run); against its own full epochs, both sides from one run, the loss is its own overhead: a figure."""
    row = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": "random_prune", "seeds": 1,
           "acc_measure": "best3_acc", "acc_mean": 60.0, "acc_delta_mean": -0.5, "compute_saving_pct_mean": 12.0,
           "time_saving_pct_mean": -20.0, "time_saving_pct_lo": -25.0, "time_saving_pct_hi": -15.0,
           "own_time_saving_pct_mean": -4.0, "own_time_saving_pct_lo": -6.0,
           "own_time_saving_pct_hi": -2.0}  # fmt: skip
    (line,) = findings([row], {"acc_points": 0.5, "saving_points": 3.0})
    assert "time saved -20.00% [-25.00, -15.00]: within noise (not in the paper)" in line
    assert line.endswith("; time saved vs its own full epochs -4.00% [-6.00, -2.00].")
    assert line.count("within noise") == 1
    table = next(t for t in paper_tables([row]) if t.slug == "dfp_table1")
    cells = dict(zip(table.headers, table.rows[0], strict=True))
    assert cells["time saved %"] == "-20.0 [-25.0, -15.0] within noise"
    assert cells["own time saved %"] == "-4.0 [-6.0, -2.0]"
    (ax,) = [a for a in saving_figure([row]).axes if a.get_visible()]
    assert [t.get_position()[0] for t in ax.texts if t.get_text() == "noise"] == pytest.approx([-0.1])  # time's alone


def test_a_method_whose_baseline_trained_elsewhere_still_shows_its_compute_and_own_time_saved():
    """Without a time saving paired with its baseline (other machine), a method's other two bars stay drawn."""
    row = {"study": "wus", "dataset": "cifar10", "model": "alexnet", "method": "wus", "seeds": 12,
           "compute_saving_pct_mean": 50.5, "time_saving_pct_mean": None, "own_time_saving_pct_mean": 52.4,
           "own_time_saving_pct_lo": 50.2, "own_time_saving_pct_hi": 54.7}  # fmt: skip
    (ax,) = [a for a in saving_figure([row]).axes if a.get_visible()]
    heights = sorted(round(p.get_height(), 1) for p in ax.patches)
    assert heights == [50.5, 52.4] and not any("No method" in t.get_text() for t in ax.texts)


def test_report_says_where_the_setting_differs_from_the_papers(tmp_path):
    params = synthetic_grid(tmp_path, seeds=(0,))
    runs = collect(params, tmp_path)
    published = {k[:3] for k in load_published(PUBLISHED)}
    diffs = setting_differences(runs, {r.mlflow_run_id: "cpu: Test CPU x2" for r in runs}, published, MEASURES)
    assert "epochs 10 (paper: 200)" in diffs["dfp"] and "lr 0.02 (paper: 0.1)" in diffs["dfp"]
    assert "lenet on cifar10 is not in the paper" in diffs["wus"]
    assert "lenet on cifar10 is not in the paper" not in diffs["dfp"]  # DFP Table 1 has LeNet
    assert "1 seed(s) per configuration (paper: mean of 15 runs)" in diffs["wus"]
    assert "trained on cpu: Test CPU x2 (paper: GPU: NVIDIA GTX 1080 Ti)" in diffs["dfp"]


def test_missing_and_malformed_runs_are_clear_errors(tmp_path):
    params = synthetic_grid(tmp_path, seeds=(0,))
    shutil.rmtree(tmp_path / "wus" / "cifar10-lenet-wus-s0")
    (tmp_path / "dfp" / "cifar10-lenet-dfp-s0" / "metrics.json").unlink()
    with pytest.raises(UserError, match=r"2 run\(s\) of the grid have not finished") as info:
        collect(params, tmp_path)
    assert "cifar10-lenet-wus-s0" in str(info.value) and "cifar10-lenet-dfp-s0" in str(info.value)
    synthetic_run(tmp_path, "wus", "cifar10", "lenet", "wus", 0)
    shutil.rmtree(tmp_path / "dfp" / "cifar10-lenet-dfp-s0")
    synthetic_run(tmp_path, "dfp", "cifar10", "lenet", "dfp", 0)
    metrics = tmp_path / "dfp" / "cifar10-lenet-dfp-s0" / "metrics.json"
    metrics.write_text(json.dumps({"final_acc": 60}))
    with pytest.raises(UserError, match="missing or not a finite number: best_acc, best3_acc"):
        collect(params, tmp_path)
    metrics.write_text("{not json")
    with pytest.raises(UserError, match="malformed"):
        collect(params, tmp_path)


def test_files_that_are_not_text_are_clear_errors(tmp_path):
    """A binary file where a run's JSON or CSV, the papers' figures or a summary belongs: a UserError naming it."""
    params = synthetic_grid(tmp_path / "runs", seeds=(0,))
    binary = b"\x89PNG\r\n\x1a\n\xff\xfe"
    folder = tmp_path / "runs" / "dfp" / "cifar10-lenet-dfp-s0"
    for name in ("metrics.json", "history.csv"):
        original = (folder / name).read_bytes()
        (folder / name).write_bytes(binary)
        with pytest.raises(UserError, match=f"{name} cannot be read as a text file"):
            collect(params, tmp_path / "runs")
        (folder / name).write_bytes(original)
    (tmp_path / "binary.csv").write_bytes(binary)
    for read in (load_published, read_summary):
        with pytest.raises(UserError, match=r"binary\.csv cannot be read as a text file"):
            read(tmp_path / "binary.csv")


def test_the_accuracy_measure_covers_the_papers_studies_without_a_grid_and_a_misspelt_study_is_an_error():
    """--ledger-only empties the grid; the ledger's runs are of the papers' studies and take the measure chosen."""
    chosen = {"aggregate": {"accuracy": {"dfp": "final_acc"}}}
    assert accuracy_measures(chosen | {"grid": {}}) == {"dfp": "final_acc", "wus": "final_acc"}
    with pytest.raises(UserError, match=r"aggregate\.accuracy: dpf is not a study; accepted: dfp, wus"):
        accuracy_measures({"grid": {}, "aggregate": {"accuracy": {"dpf": "best3_acc"}}})


def test_dvc_yaml_declares_every_figure_the_aggregate_stage_writes():
    """The report embeds them all (the ledger's claims figure too): `dvc plots show` must list them."""
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["aggregate"]["plots"]
    declared = {next(iter(p)) if isinstance(p, dict) else p for p in plots}
    assert {f"results/figures/{f}" for f in (*FIGURES, *LEDGER_FIGURES)} <= declared


def test_published_csv_is_validated(tmp_path):
    bad = tmp_path / "published.csv"
    bad.write_text("paper,model,value\ndfp,lenet,1\n")
    with pytest.raises(UserError, match="columns must be"):
        load_published(bad)
    with pytest.raises(UserError, match="not found"):
        load_published(tmp_path / "nope.csv")


def test_summary_csv_round_trips_with_fixed_columns(tmp_path):
    params = synthetic_grid(tmp_path, seeds=(0, 1))
    summary = summarize(collect(params, tmp_path), MEASURES)
    path = tmp_path / "summary.csv"
    path.write_text(summary_csv(summary))
    with open(path) as f:
        assert tuple(next(csv.reader(f))) == SUMMARY_COLUMNS
    back = by_key(read_summary(path))
    assert back[("dfp", "cifar10", "lenet", "dfp")]["acc_delta_mean"] == pytest.approx(-0.3, abs=1e-4)
    assert "acc_delta_ci95" not in back[("dfp", "cifar10", "lenet", "dfp")]  # 2 seeds: sd, no interval
    path.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not a summary"):
        read_summary(path)


# ---------------------------------------------------------------------------------------------------- equal cost


def cost_row(method: str, compute: float, delta: float, ci95: float | None = None, **more) -> dict:
    """A summary row of the DFP study on cifar10/resnet18: 3 seeds with a t-interval, 2 (an sd) without `ci95`."""
    row = {"study": "dfp", "dataset": "cifar10", "model": "resnet18", "method": method, "seeds": 2,
           "acc_measure": "best3_acc", "acc_mean": 95.0 + delta, "acc_delta_mean": delta, "acc_delta_std": 0.3,
           "compute_saving_pct_mean": compute, "time_saving_pct_mean": compute - 2,
           "time_saving_pct_lo": compute - 4, "time_saving_pct_hi": compute}  # fmt: skip
    if ci95 is not None:
        row |= {"seeds": 3, "acc_delta_ci95": ci95}
    return row | more


COST_ROWS = [
    {"study": "dfp", "dataset": "cifar10", "model": "resnet18", "method": "baseline", "seeds": 3,
     "acc_measure": "best3_acc", "acc_mean": 95.0},
    cost_row("dfp", 12.8, -0.4, 0.2, paper_time_saving_pct=12.76, paper_acc_delta=-0.1),
    cost_row("random_prune", 12.8, -1.0, 0.3),
    cost_row("infobatch_r30", 14.0, -0.3, 0.5),
    cost_row("dfp_p50", 21.3, -1.2, 0.2),
    cost_row("random_prune_p50", 21.3, -2.0, 0.2),
    cost_row("infobatch", 36.0, -0.5, 0.2),
]  # fmt: skip
IMPLEMENTS = {
    ("dfp", "cifar10", "resnet18", name, ""): implemented
    for name, implemented in (("infobatch_r30", "infobatch"), ("dfp_p50", "dfp"), ("random_prune_p50", "random_prune"))
}


def test_the_cost_table_compares_the_methods_at_equal_cost_and_says_whether_the_lead_beats_the_intervals():
    table = cost_table(COST_ROWS, IMPLEMENTS, within=3.0)
    assert table.slug == "accuracy_vs_cost" and table.title == "Accuracy against cost"
    rows = [dict(zip(table.headers, r, strict=True)) for r in table.rows]
    assert [(r["budget: compute saved"], r["method"], r["implements"]) for r in rows] == [
        ("12.8–14.0%", "infobatch_r30", "infobatch"),
        ("12.8–14.0%", "dfp", "dfp"),
        ("12.8–14.0%", "random_prune", "random_prune"),
        ("21.3%", "dfp_p50", "dfp"),
        ("21.3%", "random_prune_p50", "random_prune"),
        ("36.0%", "infobatch", "infobatch"),
    ]  # no baseline row; best first within a budget
    assert rows[1]["Δ vs baseline"] == "-0.40 ± 0.20" and rows[1]["compute saved %"] == "12.8"
    assert rows[1]["time saved % [95%]"] == "10.8 [8.8, 12.8]"
    assert rows[1]["paper time saved %"] == "12.76" and rows[1]["paper Δ"] == "-0.10"
    assert rows[3]["paper time saved %"] == "not in the paper"  # the paper's point is dfp's own setting only
    verdicts = [line for line in table.note.splitlines() if line.startswith("- ")]
    assert verdicts == [
        "- DFP cifar10/resnet18, compute saved 12.8–14.0%: best infobatch_r30 (infobatch): Δ -0.30 [-0.80, +0.20] "
        "points at 14.0% compute saved; 0.10 points ahead of dfp: Δ -0.40 [-0.60, -0.20] points at 12.8% compute "
        "saved; the lead is within the 95% intervals (they overlap): not a finding. It is also 0.70 points ahead of "
        "random_prune: Δ -1.00 [-1.30, -0.70] points at 12.8% compute saved; the lead is within the 95% intervals "
        "(they overlap): not a finding. Of the others, dfp is 0.60 points ahead of random_prune; the lead is larger "
        "than the 95% intervals (they do not overlap).",
        "- DFP cifar10/resnet18, compute saved 21.3%: best dfp_p50 (dfp): Δ -1.20 [-1.40, -1.00] points at 21.3% "
        "compute saved; 0.80 points ahead of random_prune_p50 (random_prune): Δ -2.00 [-2.20, -1.80] points at "
        "21.3% compute saved; the lead is larger than the 95% intervals (they do not overlap).",
        "- DFP cifar10/resnet18, compute saved 36.0%: infobatch: Δ -0.50 [-0.70, -0.30] points at 36.0% compute "
        "saved, alone at this cost: nothing to compare with.",
    ]
    narrow = cost_table(COST_ROWS, IMPLEMENTS, within=1.0)  # 14.0 is more than 1 point above 12.8: a budget of its own
    assert [r[2] for r in narrow.rows][:3] == ["12.8%", "12.8%", "14.0%"]
    two_seeds = [cost_row("dfp", 12.8, -0.4), cost_row("random_prune", 12.8, -1.0)]
    (verdict,) = [line for line in cost_table(two_seeds, {}, 3.0).note.splitlines() if line.startswith("- ")]
    assert verdict.endswith("0.60 points ahead of random_prune: Δ -1.00 points at 12.8% compute saved; under 3 "
                            "seeds: no 95% interval to weigh the lead against.")  # fmt: skip
    assert cost_table(COST_ROWS[:1], {}, 3.0).rows == []


def test_the_cost_table_names_the_configurations_it_cannot_place_and_why():
    """A method trained before its seeds' baselines (or over baselines that ended at chance) has no Δ and no compute
    saved: the note names it, where it would otherwise leave the table without a word."""
    waiting = {"study": "dfp", "dataset": "cifar10", "model": "alexnet", "seeds": 2, "acc_measure": "best3_acc"}
    rows = [
        *COST_ROWS,
        waiting | {"method": "dfp", "unpaired_seeds": "0 1"},
        waiting | {"method": "random_prune", "seeds": 1, "baseline_collapsed_seeds": "0"},
        waiting | {"method": "baseline", "seeds": 1},
    ]
    table = cost_table(rows, IMPLEMENTS, within=3.0)
    assert len(table.rows) == len(COST_ROWS) - 1  # placed as before, the baseline as ever at no budget
    assert table.note.splitlines()[-1] == (
        "- At no budget: DFP cifar10/alexnet dfp (no baseline of seeds 0, 1 yet); DFP cifar10/alexnet "
        "random_prune (the baseline of seed 0 ended at chance)."
    )
    alone = cost_table(rows[-3:], {}, 3.0)
    assert alone.rows == [] and alone.note.startswith("No method with a compute saving and a paired baseline")
    assert alone.note.splitlines()[-1].startswith("- At no budget: DFP cifar10/alexnet dfp (no baseline of seeds")
    assert not any("At no budget" in line for line in cost_table(COST_ROWS, IMPLEMENTS, 3.0).note.splitlines())


def test_a_lead_is_weighed_seed_by_seed_where_the_two_configurations_share_three_seeds():
    """Overlapping intervals, yet the best wins on every seed: paired, its lead is a finding; a lead that varies in
    sign is not; under 3 shared seeds the intervals decide."""
    rows = [cost_row("dfp", 12.8, -0.4, 0.6), cost_row("random_prune", 12.8, -1.0, 0.6)]
    key = {method: ("dfp", "cifar10", "resnet18", method, "") for method in ("dfp", "random_prune")}

    def verdict(dfp: list[float], random_prune: list[float]) -> str:
        accuracies = {key["dfp"]: dict(enumerate(dfp)), key["random_prune"]: dict(enumerate(random_prune))}
        (line,) = [v for v in cost_table(rows, {}, 3.0, accuracies=accuracies).note.splitlines() if v.startswith("- ")]
        return line.split("compute saved; ")[-1]

    assert verdict([94.6, 94.0, 95.2], [94.0, 93.4, 94.6]) == (
        "seed by seed (ahead on 3 of 3 seeds) the lead is +0.60 [+0.60, +0.60] points; it excludes 0: a finding."
    )
    assert verdict([95.6, 94.0, 94.0], [94.0, 94.6, 93.2]) == (
        "seed by seed (ahead on 2 of 3 seeds) the lead is +0.60 [-2.17, +3.37] points; it includes 0: not a finding."
    )
    assert verdict([95.6, 94.0, 94.0, 94.5], [94.0, 94.6, 93.2, 94.5]).startswith(
        "seed by seed (ahead on 2 of 4 seeds, level on 1) the lead is +0.45"
    )
    assert verdict([94.0, 94.0], [93.0, 93.0]) == "the lead is within the 95% intervals (they overlap): not a finding."


def test_a_lead_read_at_every_seed_count_is_a_finding_only_where_its_widened_interval_excludes_0():
    """5 seeds: the comparison may have been read at 3, 4 and 5 seeds, so its 95% interval is widened for 3 looks
    (Bonferroni, a 98.33% t-interval, as benchmarks/looks.py widens it): a lead clear at one look but not over three
    is not a finding; a steady one is. The random control's sentence follows the same rule."""
    rows = [cost_row("dfp", 12.8, -0.4, 0.6), cost_row("random_prune", 12.8, -1.0, 0.6)]
    key = {method: ("dfp", "cifar10", "resnet18", method, "") for method in ("dfp", "random_prune")}
    base = [94.0] * 5
    unsteady = {key["dfp"]: dict(enumerate(b + d for b, d in zip(base, [1.0, 0.2, 2.0, 0.5, 1.5], strict=True))),
                key["random_prune"]: dict(enumerate(base))}  # fmt: skip
    steady = {key["dfp"]: dict(enumerate(b + d for b, d in zip(base, [1.0, 1.1, 0.9, 1.0, 1.2], strict=True))),
              key["random_prune"]: dict(enumerate(base))}  # fmt: skip

    def verdict(accuracies) -> str:
        (line,) = [v for v in cost_table(rows, {}, 3.0, accuracies=accuracies).note.splitlines() if v.startswith("- ")]
        return line.split("compute saved; ")[-1]

    assert verdict(unsteady) == (
        "seed by seed (ahead on 5 of 5 seeds) the lead is +1.04 [+0.13, +1.95] points; it excludes 0 at one look but "
        "not widened for its 3 looks (one per seed count from 3), [-0.25, +2.33]: not a finding."
    )
    assert verdict(steady) == (
        "seed by seed (ahead on 5 of 5 seeds) the lead is +1.04 [+0.90, +1.18] points; it excludes 0, as it does "
        "widened for its 3 looks (one per seed count from 3), [+0.84, +1.24]: a finding."
    )
    agree = {"acc_points": 0.5, "saving_points": 3.0}
    control = findings(rows, agree, unsteady)[1].split("DFP's selection against this random control: ")[1]
    assert control.startswith(
        "+1.04 [+0.13, +1.95] points of accuracy seed by seed (DFP ahead on 5 of 5 seeds: within noise once widened "
        "for its 3 looks (one per seed count from 3), [-0.25, +2.33])"
    )
    assert "(DFP ahead on 5 of 5 seeds: a finding)" in findings(rows, agree, steady)[1]
    differences = [1.0, 0.2, 2.0, 0.5, 1.5]
    assert Paired.of(differences).looks == 3
    assert Paired.of(differences[:3]).widened == Paired.of(differences[:3]).ci  # 3 seeds: one look, the 95% interval


def test_a_lead_the_other_way_is_weighed_for_its_looks_as_a_lead_this_way():
    """Behind seed by seed on 8 seeds: the other configuration leads, and whether that is a finding is weighed for
    the looks it may have had, as a lead of this one is."""
    first, second = cost_row("dfp", 29.8, -0.3, 0.6), cost_row("infobatch", 29.8, -0.4, 0.6)
    differences = [-0.9, -0.2, -0.6, -0.1, -1.0, 0.1, -0.7, -0.5]
    key = {m: ("dfp", "cifar10", "resnet18", m, "") for m in ("dfp", "infobatch")}
    accuracies = {key["dfp"]: {s: 90.0 + d for s, d in enumerate(differences)},
                  key["infobatch"]: dict.fromkeys(range(8), 90.0)}  # fmt: skip
    paired = Paired.of(differences)
    assert paired.excludes_zero() and not paired.excludes_zero(widened=True)
    assert paired_lead(first, second, accuracies) == (
        "seed by seed (ahead on 1 of 8 seeds) the lead is -0.49 [-0.81, -0.16] points; infobatch leads on the seeds "
        "they share; it excludes 0 at one look but not widened for its 6 looks (one per seed count from 3), [-0.99, "
        "+0.01]: not a finding"
    )


def test_the_best_at_a_budget_is_weighed_against_each_other_configuration_there():
    """Three configurations at one cost: the best's lead over the runner-up, then over the third, then the
    runner-up's over the third, each seed by seed; a configuration that wins on the seeds it shares with another is
    named as leading there."""
    rows = [cost_row("random_prune_p70", 29.8, -0.3, 0.6), cost_row("dfp_p70", 29.8, -1.4, 0.6),
            cost_row("infobatch", 27.6, -3.8, 1.2)]  # fmt: skip
    key = {m: ("dfp", "cifar10", "resnet18", m, "") for m in ("random_prune_p70", "dfp_p70", "infobatch")}
    accuracies = {key["random_prune_p70"]: {0: 94.0, 1: 94.5, 2: 93.5, 3: 95.0},
                  key["dfp_p70"]: {0: 93.0, 1: 93.6, 2: 92.4},
                  key["infobatch"]: {0: 90.0, 1: 90.5, 2: 89.5}}  # fmt: skip
    (line,) = [v for v in cost_table(rows, {}, 3.0, accuracies=accuracies).note.splitlines() if v.startswith("- ")]
    assert line == (
        "- DFP cifar10/resnet18, compute saved 27.6–29.8%: best random_prune_p70: Δ -0.30 [-0.90, +0.30] points at "
        "29.8% compute saved; 1.10 points ahead of dfp_p70: Δ -1.40 [-2.00, -0.80] points at 29.8% compute saved; "
        "seed by seed (ahead on 3 of 3 seeds) the lead is +1.00 [+0.75, +1.25] points; it excludes 0: a finding. It "
        "is also 3.50 points ahead of infobatch: Δ -3.80 [-5.00, -2.60] points at 27.6% compute saved; seed by seed "
        "(ahead on 3 of 3 seeds) the lead is +4.00 [+4.00, +4.00] points; it excludes 0: a finding. Of the others, "
        "dfp_p70 is 2.40 points ahead of infobatch; seed by seed (ahead on 3 of 3 seeds) the lead is +3.00 [+2.75, "
        "+3.25] points; it excludes 0: a finding."
    )
    accuracies[key["infobatch"]] = {0: 95.0, 1: 95.6, 2: 94.4}  # better than the two others on the seeds they share
    (line,) = [v for v in cost_table(rows, {}, 3.0, accuracies=accuracies).note.splitlines() if v.startswith("- ")]
    assert (
        "(ahead on 0 of 3 seeds) the lead is -1.00 [-1.25, -0.75] points; infobatch leads on the seeds they "
        "share; it excludes 0: a finding. Of the others" in line
    )
    assert line.endswith(
        "the lead is -2.00 [-2.00, -2.00] points; infobatch leads on the seeds they share; it excludes 0: a finding."
    )
    accuracies[key["infobatch"]] = {0: 94.5, 1: 94.0, 2: 94.5}  # ahead on two seeds of three, behind on one
    (line,) = [v for v in cost_table(rows, {}, 3.0, accuracies=accuracies).note.splitlines() if v.startswith("- ")]
    assert (
        "(ahead on 1 of 3 seeds) the lead is -0.33 [-2.23, +1.56] points; it includes 0: not a finding. Of the "
        "others" in line
    )
    assert line.endswith("the lead is -1.33 [-3.48, +0.81] points; it includes 0: not a finding.")


def test_dfps_selection_is_weighed_against_its_random_control_seed_by_seed():
    """The finding "DFP's selection against this random control" pairs the two by seed from 3 seeds in common: a gain
    on every seed is a finding, one that changes sign is within noise; under 3 seeds, the difference of means."""
    rows = [cost_row("dfp", 12.8, -0.4, 0.6), cost_row("random_prune", 12.8, -1.0, 0.6)]
    key = {method: ("dfp", "cifar10", "resnet18", method, "") for method in ("dfp", "random_prune")}
    agree = {"acc_points": 0.5, "saving_points": 3.0}

    def said(dfp: list[float], random_prune: list[float]) -> str:
        accuracies = {key["dfp"]: dict(enumerate(dfp)), key["random_prune"]: dict(enumerate(random_prune))}
        line = findings(rows, agree, accuracies)[1]
        return line.split("DFP's selection against this random control: ")[1]

    assert said([94.6, 94.0, 95.2], [93.5, 94.2, 94.3]) == (
        "+0.60 [-1.14, +2.34] points of accuracy seed by seed (DFP ahead on 2 of 3 seeds: within noise) at 12.8% vs "
        "12.8% compute saved."
    )
    assert said([94.6, 94.0, 95.2, 94.4], [94.0, 93.5, 94.5, 93.8]).startswith(
        "+0.60 [+0.47, +0.73] points of accuracy seed by seed (DFP ahead on 4 of 4 seeds: a finding)"
    )
    assert said([94.6, 94.0], [94.0, 93.4]) == "+0.60 points of accuracy at 12.8% vs 12.8% compute saved."
    assert findings(rows, agree)[1].endswith(": +0.60 points of accuracy at 12.8% vs 12.8% compute saved.")


def test_the_cost_figure_draws_one_line_per_method_through_its_budgets_and_the_papers_point_beside_time():
    compute_ax, time_ax = [a for a in cost_figure(COST_ROWS, IMPLEMENTS).axes if a.get_visible()]
    lines = {c.get_label(): c.lines[0].get_xydata().tolist() for c in compute_ax.containers}
    assert lines == {
        "dfp": [[12.8, -0.4], [21.3, -1.2]],
        "random_prune": [[12.8, -1.0], [21.3, -2.0]],
        "infobatch": [[14.0, -0.3], [36.0, -0.5]],
    }
    timed = {c.get_label(): c.lines[0].get_xydata().tolist() for c in time_ax.containers}
    assert timed["dfp"] == [[10.8, -0.4], [19.3, -1.2]]  # time saved: compute - 2 in these rows
    stars = {line.get_label(): line.get_xydata().tolist() for ax in (compute_ax, time_ax) for line in ax.lines
             if line.get_label().startswith("paper")}  # fmt: skip
    assert stars == {"paper: dfp": [[12.76, -0.1]]}
    assert any(line.get_label() == "paper: dfp" for line in time_ax.lines)
    far = [COST_ROWS[0], cost_row("dfp", 12.8, -0.4, 0.2, paper_time_saving_pct=12.76, paper_acc_delta=-4.0)]
    compute_ax, time_ax = [a for a in cost_figure(far, {}).axes if a.get_visible()]
    assert compute_ax.get_ylim() == time_ax.get_ylim()  # one accuracy scale, the paper's star's too
    assert compute_ax.get_ylim()[0] < -4.0 < 0.0 < compute_ax.get_ylim()[1]
    (empty,) = [a for a in cost_figure(COST_ROWS[:1], {}).axes if a.get_visible() or a.texts]
    assert "No method with a compute saving" in empty.texts[0].get_text()


def test_the_cost_figures_legend_is_one_a_row_beside_its_panels_and_hides_no_point():
    fig = cost_figure(COST_ROWS, IMPLEMENTS)
    fig.draw_without_rendering()
    compute_ax, time_ax = [a for a in fig.axes if a.get_visible()]
    assert compute_ax.get_legend() is None
    legend = time_ax.get_legend()
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["baseline", "dfp", "random_prune", "infobatch", "paper: dfp"]  # the row's, each once
    assert not any(legend.get_window_extent().overlaps(ax.get_window_extent()) for ax in (compute_ax, time_ax))


def test_the_cost_figure_labels_each_budget_inside_its_own_panel():
    """A point's label is its configuration less the line's implementation (dfp_p50 -> p50), drawn toward the middle
    of the panel: a long one by the right edge runs into neither the next panel nor the legend."""
    rows = [*COST_ROWS, cost_row("random_prune_p70", 29.8, -0.2, 0.4)]
    implements = IMPLEMENTS | {("dfp", "cifar10", "resnet18", "random_prune_p70", ""): "random_prune"}
    fig = cost_figure(rows, implements)
    fig.draw_without_rendering()
    compute_ax, time_ax = [a for a in fig.axes if a.get_visible()]
    for ax in (compute_ax, time_ax):
        assert sorted(t.get_text() for t in ax.texts) == sorted(
            ["dfp", "random_prune", "r30", "p50", "p50", "p70", "infobatch"]
        )
        inside = ax.get_window_extent()
        for text in ax.texts:
            box = text.get_window_extent()
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1, text.get_text()


def test_the_phases_figure_shades_each_run_of_skip_epochs_once():
    """Consecutive skip epochs are one shaded span (a 200-epoch run draws a few patches, not one per epoch), from the
    first's left edge to the last's right edge; the legend names the shading once."""
    assert spans([]) == []
    assert spans([3, 4, 5, 8, 10, 11]) == [(3, 5), (8, 8), (10, 11)]
    phases = [0, 0, 1, 1, 1, 0, 1, 0, 1, 1]  # skip epochs 3-5, 7, 9-10
    history = [{"epoch": e, "lr": 0.1 if e <= 6 else 0.01, "test_acc": 50.0 + e, "phase": float(p)}
               for e, p in enumerate(phases, 1)]  # fmt: skip
    run = Run("wus", "cifar10", "lenet", "wus", 0, {}, history)
    (ax,) = [a for a in phases_figure([run]).axes if a.get_visible()]
    shaded = sorted(
        (round(x0, 6), round(x0 + width, 6)) for x0, _, width, _ in (p.get_bbox().bounds for p in ax.patches)
    )
    assert shaded == [(2.5, 5.5), (6.5, 7.5), (8.5, 10.5)]
    assert [t.get_text() for t in ax.get_legend().get_texts()].count("skip epoch") == 1
    assert ax.get_title().endswith("6 skip epochs of 10")


def test_a_panel_of_many_configurations_lays_its_legend_out_in_two_columns():
    """Up to 5 curves: one column; more (the DFP study's LeNet has 10 configurations): two, smaller, so that the
    legend does not cover the curves."""
    history = [{"epoch": e, "test_acc": 50.0 + e, "epoch_train_s": 1.0} for e in range(1, 4)]

    def legend_of(methods: list[str]):
        runs = [Run("dfp", "cifar10", "lenet", m, 0, {}, history) for m in methods]
        (ax,) = [a for a in curve_figure(runs, "epoch", "epoch", "t").axes if a.get_visible()]
        return ax.get_legend()

    few, many = legend_of(["baseline", "dfp"]), legend_of(["baseline", *(f"dfp_p{p}" for p in range(10, 70, 10))])
    assert len(few.get_texts()) == 2 and {t.get_fontsize() for t in few.get_texts()} == {9}
    assert len(many.get_texts()) == 7 and {t.get_fontsize() for t in many.get_texts()} == {7}
    many.figure.draw_without_rendering()  # lays the legend out
    positions = {round(t.get_window_extent().x0) for t in many.get_texts()}
    assert len(positions) == 2  # two columns


def test_the_cumulative_pruning_figure_ends_at_each_runs_sample_saving_and_keeps_a_shared_schedule_visible():
    """Cumulative: by each epoch, the share of the sample-passes a full run would have trained that were left out,
    ending at the run's sample saving. DFP and its random control share one schedule, so their curves coincide: the
    second is drawn thin and dotted over the first and says whose it is; another schedule keeps its own style."""

    def run(method: str, pruned: dict[int, int]) -> Run:
        history = [{"epoch": e, "pruned_samples": pruned.get(e, 0), "trained_samples": 1000 - pruned.get(e, 0),
                    "test_acc": 50.0, "epoch_train_s": 1.0} for e in range(1, 5)]  # fmt: skip
        return Run("dfp", "cifar10", "lenet", method, 0, {}, history)

    schedule = {2: 200, 4: 200}  # 400 of 4000 sample-passes
    runs = [run("dfp", schedule), run("random_prune", schedule), run("infobatch", {1: 500, 2: 300})]
    (ax,) = [a for a in pruned_figure(runs, cumulative=True).axes if a.get_visible()]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["dfp (400 in all)", "infobatch (800 in all)", "random_prune (400 in all), as dfp"]
    assert lines["dfp (400 in all)"].get_ydata().tolist() == pytest.approx([0, 10, 200 / 30, 10])
    assert lines["infobatch (800 in all)"].get_ydata().tolist() == pytest.approx([50, 40, 800 / 30, 20])
    dfp, control = lines["dfp (400 in all)"], lines["random_prune (400 in all), as dfp"]
    assert control.get_ydata().tolist() == dfp.get_ydata().tolist()
    assert (control.get_linestyle(), control.get_linewidth()) == (":", 1.0)
    assert (dfp.get_linestyle(), lines["infobatch (800 in all)"].get_linestyle()) == ("-", "-")
    # per epoch (the grid's short runs), the same runs draw their counts as steps
    (ax,) = [a for a in pruned_figure(runs).axes if a.get_visible()]
    counts = {line.get_label(): line.get_ydata().tolist() for line in ax.get_lines()}
    assert counts["dfp (400 in all)"] == [0, 200, 0, 200]


def test_a_named_configuration_is_drawn_as_the_method_it_implements(tmp_path):
    """run.json's config.method_args `method` names the implementation; a run without it implements its own name."""
    params = synthetic_grid(tmp_path, seeds=(0, 1, 2))
    params["grid"]["dfp"]["methods"].append("dfp_p50")
    for seed in (0, 1, 2):
        folder = tmp_path / "dfp" / f"cifar10-lenet-dfp_p50-s{seed}"
        shutil.copytree(tmp_path / "dfp" / f"cifar10-lenet-dfp-s{seed}", folder)
        info = json.loads((folder / "run.json").read_text())
        info["config"]["method_args"] = {"method": "dfp", "prune_num": 0.5}
        (folder / "run.json").write_text(json.dumps(info))
    runs = collect(params, tmp_path)
    implements = implementation_of(runs)
    assert {key[3]: name for key, name in implements.items() if key[0] == "dfp"} == {
        "baseline": "baseline", "dfp": "dfp", "random_prune": "random_prune", "dfp_p50": "dfp",
    }  # fmt: skip
    summary = summarize(runs, MEASURES)
    table = cost_table(summary, implements, 3.0)
    shown = {(r[0], r[3]): r[4] for r in table.rows}
    assert shown[("cifar10", "dfp_p50")] == "dfp" and shown[("cifar10", "wus_lr")] == "wus_lr"
    axes = [a for a in cost_figure(summary, implements).axes if a.get_visible()]
    dfp_line = next(c for c in axes[0].containers if c.get_label() == "dfp")
    assert len(dfp_line.lines[0].get_xydata()) == 2  # dfp and dfp_p50 on one line


def test_the_stage_writes_every_output_and_an_mlflow_run(tmp_path):
    runs = tmp_path / "runs"
    params = synthetic_grid(runs)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params | {"aggregate": {"accuracy": MEASURES}}))
    out = tmp_path / "results"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": store, "DVC_ROOT": str(tmp_path)}
    cmd = [sys.executable, str(REPO / "stages" / "aggregate.py"), "--params", str(tmp_path / "params.yaml"),
           "--runs", str(runs), "--published", str(PUBLISHED), "--out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(env))
    assert result.returncode == 0, result.stderr
    assert {p.name for p in (out / "figures").iterdir()} == {*FIGURES, *LEDGER_FIGURES}
    assert len(list((out / "curves").glob("*.csv"))) == 6
    report = (out / "report.md").read_text()
    assert "### DFP Table 1: training time" in report and "### WUS Table 3" in report
    assert "This is not the papers' setting" in report
    random_control = "+0.50 [+0.50, +0.50] points of accuracy seed by seed (DFP ahead on 3 of 3 seeds: a finding)"
    assert f"DFP's selection against this random control: {random_control}" in report
    assert "## Accuracy against cost" in report and "![Accuracy Δ against compute and time saved" in report
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dfp"]["cifar10-lenet-dfp"]["acc_delta"] == pytest.approx(-0.3)

    from mlflow import MlflowClient

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("aggregate")
    (run,) = client.search_runs([experiment.experiment_id])
    artifacts = {a.path for folder in ("", "tables", "figures") for a in client.list_artifacts(run.info.run_id, folder)}
    assert {"tables/summary.json", "tables/dfp_table1.json", "tables/runs.json", "figures/test_acc.png",
            "tables/accuracy_vs_cost.json", "figures/acc_vs_cost.png", "report.md",
            "summary.csv"} <= artifacts  # fmt: skip
    logged = Path(client.download_artifacts(run.info.run_id, "figures/acc_vs_cost.png", str(tmp_path)))
    assert logged.read_bytes() == (out / "figures" / "acc_vs_cost.png").read_bytes()  # the figure written, logged
    assert run.data.metrics["dfp/cifar10-lenet-dfp/acc_delta"] == pytest.approx(-0.3)

    bad = subprocess.run([*cmd[:-2], "--out", str(tmp_path / "x"), "--runs", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=tmp_path, env=_env(env))  # fmt: skip
    assert bad.returncode == 2 and "have not finished" in bad.stderr and "Traceback" not in bad.stderr


def _env(extra: dict[str, str]) -> dict[str, str]:
    import os

    return os.environ | {"PYTHONPATH": str(REPO / "src")} | extra


# ---------------------------------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_quick_results_exist_and_are_declared_in_dvc(quick, tmp_path):
    results = quick / "results"
    rows = [r for r in read_csv(results / "summary.csv") if r["source"] != "ledger"]  # the ledger's rows are its own
    assert {(r["study"], r["method"]) for r in rows} == {(s, n.split("-")[2]) for s, n, _ in grid(quick)}
    for f in (*FIGURES, *LEDGER_FIGURES):
        assert (results / "figures" / f).stat().st_size > 10_000, f
    report = (results / "report.md").read_text()
    assert "This is not the papers' setting" in report and "epochs 10 (paper: 200)" in report
    assert "lenet on cifar10 is not in the paper" in report  # WUS has no LeNet
    assert "| dfp | cifar10-lenet-baseline-s0 |" in report
    metrics = json.loads(run_in(quick, "dvc", "metrics", "show", "--json").stdout)
    shown = json.dumps(metrics)
    assert "results/metrics.json" in shown and "results/check.json" in shown
    plots = run_in(quick, "dvc", "plots", "show", "--json", "-o", str(tmp_path / "plots")).stdout
    assert "results/figures/test_acc.png" in plots and "results/curves" in plots
    lock = yaml.safe_load((quick / "dvc.lock").read_text())["stages"]
    assert {"aggregate", "check"} <= set(lock)
    ignored = (results / ".gitignore").read_text() if (results / ".gitignore").exists() else ""
    assert "summary.csv" not in ignored and "report.md" not in ignored  # cache: false, so git tracks them


@pytest.mark.e2e
def test_quick_aggregate_mlflow_run_has_tables_figures_and_run_links(quick):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{quick / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("aggregate")
    assert experiment.artifact_location == (quick / "mlartifacts" / "aggregate").as_uri()
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["dvc_stage"] == "aggregate" and len(run.data.tags["git_commit"]) == 40
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "tables")}
    assert {"tables/summary.json", "tables/runs.json", "tables/dfp_table1.json", "tables/wus_table2.json"} <= tables
    figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {f"figures/{f}" for f in (*FIGURES, *LEDGER_FIGURES)}
    linked = json.loads(Path(client.download_artifacts(run.info.run_id, "tables/runs.json")).read_text())
    ids = {row[linked["columns"].index("mlflow_run_id")] for row in linked["data"]}
    trained = {
        json.loads((quick / "runs" / s / n / "run.json").read_text())["mlflow_run_id"] for s, n, _ in grid(quick)
    }
    assert ids == trained


@pytest.mark.e2e
def test_quick_gate_stage_ran_and_passed(quick):
    from mlflow import MlflowClient

    assert "Running stage 'check'" in (quick / "quick.log").read_text()
    outcome = json.loads((quick / "results" / "check.json").read_text())
    client = MlflowClient(f"sqlite:///{quick / 'mlflow.db'}")
    # the experiment's own gate: test_check's failing gate logs more check runs to this store, later
    run, *_ = client.search_runs(
        [client.get_experiment_by_name("check").experiment_id], order_by=["attributes.start_time ASC"]
    )
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, "checks.json")).read_text())
    checks = [dict(zip(logged["columns"], row, strict=True)) for row in logged["data"]]  # every check, as printed
    skipped = [c for c in checks if c["status"] == "skip"]
    counts = {"checks": len(checks) - len(skipped), "violations": 0, "not_checked": len(skipped)}
    assert outcome == {"passed": True} | counts
    # the reference comparison ran and passed for every configuration of the grid: a stale reference (another
    # recipe, epochs or accuracy measure) makes each a skip, which the counts above would not show
    configs = {f"{study} {'/'.join(name.split('-')[:3])}" for study, name, _ in grid(quick)}
    against_reference = {c["config"]: c["status"] for c in checks if "the reference's" in c["check"]}
    assert against_reference == dict.fromkeys(configs, "pass")
    # not checked: the wall-clock thresholds (check.wall_clock: report) and the ledger's own rows, nothing else
    wall_clock = {f"{key}: {NOT_GATED}" for key in WALL_CLOCK_GATES}
    assert {c["check"] for c in skipped} - {LEDGER_ONLY} == wall_clock
