"""Collect every run of the grid and of the results ledger, and summarise them per configuration, over seeds, beside
the papers.

A configuration is (study, dataset, model, method, recipe). Its runs come from the grid (`runs/`, `collect`) and from
the results ledger (`ledger/`, `ledger_runs`: runs at a paper's setting kept in the repository); a run in both is
counted once, the grid's. Each row says where its runs came from (`source`: runs, ledger or runs+ledger) and the
devices they trained on.

Each method run is paired by seed with the baseline of its configuration (same recipe, same seed): accuracy delta,
compute saved (training FLOPs), time saved and sample-passes saved are computed per pair, then averaged over the
seeds whose baseline has run (`paired_seeds` of `seeds`; the others: `unpaired_seeds`); the time saved only where
both runs of each pair trained on one machine: the same device, CPU threads and, on a CPU, vector instructions (else
`time_unpaired` says which pair did not). A run that ended at chance accuracy (`collapsed`: the network stopped
learning) is left out of every figure (`collapsed_seeds`), and a method's run whose baseline did so out of the paired
ones (`baseline_collapsed_seeds`): a failed baseline is no reference for a method.
Every statistic has a mean, a standard deviation (2+ seeds) and the half-width of a 95% t-interval (3+ seeds): columns
`<name>_mean`, `<name>_std`, `<name>_ci95`. Wall-clock figures come from each run's robust training time
(`cheaptrain.timing`: each epoch at the run's typical machine speed, read from its evaluation passes; a few slow epochs
do not move it), and the two time savings also have a 95% interval, `<name>_lo` and `<name>_hi`: the bootstrap of
each run's epochs, widened to the t-interval over seeds from 2 seeds on (`timing.seed_interval`).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cheaptrain import UserError, is_number
from cheaptrain.config import DATASETS
from cheaptrain.ledger import entries, grid_runs
from cheaptrain.timing import paired_saving, run_time, seed_interval
from cheaptrain.tracking import machines_text

KEY = ("study", "dataset", "model", "method")
SOURCES = ("runs", "ledger")  # where a configuration's runs were read from: the grid's folder, the results ledger
BASELINE = "baseline"
REQUIRED_METRICS = ("final_acc", "best_acc", "best3_acc", "train_time_s", "total_trained_samples", "epochs")
PAPER_MEASURE = {"dfp": "best3_acc", "wus": "final_acc"}  # the accuracy each paper reports (methods.md)
MEASURES = ("final_acc", "best3_acc")
CHANCE_MARGIN = 1.0  # points above chance (100 / classes) a run's final accuracy must exceed to count as trained

# t_{0.975, df} for df = 1..30; beyond that the Cornish-Fisher expansion (t975)
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

STATS = (  # statistics with mean, sd and interval; the paired ones only on method rows
    "acc", "final_acc", "best3_acc", "train_time_s", "robust_train_time_s", "first_epoch_s", "full_epoch_s",
    "acc_delta", "compute_saving_pct", "time_saving_pct", "own_time_saving_pct", "sample_saving_pct",
    "planned_saving_pct", "updated_params_reduction_pct", "cheap_time_share", "cheap_work_share",
)  # fmt: skip
INTERVALS = ("time_saving_pct", "own_time_saving_pct")  # wall-clock savings: 95% interval, `_lo` and `_hi`
MEANS = ("overhead_s", "pruning_epochs", "pruned_samples_total", "skip_epochs", "normal_epochs", "wall_time_s")
PUBLISHED = (  # the paper's figure beside ours, and ours minus the paper's
    "paper_acc", "acc_vs_paper", "paper_acc_delta", "acc_delta_vs_paper", "paper_train_time_s", "paper_overhead_s",
    "paper_time_saving_pct", "time_saving_vs_paper", "paper_updated_params_reduction_pct",
    "updated_params_reduction_vs_paper",
)  # fmt: skip
SUMMARY_COLUMNS = (
    *KEY,
    "seeds",
    "epochs",
    "recipe",
    "source",
    "devices",
    "acc_measure",
    "work_measure",
    *(f"{s}_{part}" for s in STATS for part in ("mean", "std", "ci95")),
    *(f"{s}_{end}" for s in INTERVALS for end in ("lo", "hi")),
    *(f"{m}_mean" for m in MEANS),
    *PUBLISHED,
    "paired_seeds",  # of a method's seeds, how many the paired figures (accuracy Δ, savings) are over
    "unpaired_seeds",  # of a method's seeds, those without a baseline run of the same recipe yet
    "baseline_collapsed_seeds",  # of a method's seeds, those whose baseline ended at chance: left out of paired figures
    "collapsed_seeds",  # the configuration's seeds that ended at chance: left out of every figure and of `seeds`
    "time_unpaired",  # why the time saved against the baseline is not given: pairs that trained on other machines
    "mlflow_run_ids",
)
TEXT_COLUMNS = (
    *KEY, "recipe", "source", "devices", "acc_measure", "work_measure", "unpaired_seeds", "baseline_collapsed_seeds",
    "collapsed_seeds", "time_unpaired", "mlflow_run_ids",
)  # fmt: skip
PUBLISHED_COLUMNS = ("paper", "table", "dataset", "model", "method", "metric", "value", "unit", "note")


@dataclass
class Run:
    study: str
    dataset: str
    model: str
    method: str
    seed: int
    metrics: dict[str, float]
    history: list[dict[str, float]]  # one row per epoch, every column as a number
    config: dict[str, Any] = field(default_factory=dict)  # the resolved configuration from run.json
    mlflow_run_id: str = ""
    device: str = ""  # run.json's readable device name; empty for runs that predate it
    source: str = "runs"  # runs | ledger
    # run.json's cpu_capability (AVX2, AVX512): two CPUs of one name can differ in it, and a run's speed with them
    cpu_kernels: str = ""
    gpu_uuid: str = ""  # run.json's, on a GPU: two GPUs of one name (two rented machines) can differ in speed
    finished_at: str = ""  # run.json's, UTC (2026-11-29T08:40:03Z); empty for runs that predate it
    trained_on: str = ""  # the machines of a run resumed on another (`machines_text`); empty for one machine
    data_digest: str = ""  # run.json's: the prepared data it trained on

    @property
    def name(self) -> str:
        return f"{self.dataset}-{self.model}-{self.method}-s{self.seed}"


def read_text(path: Path) -> str:
    """A text file's contents, line ends as written (for csv); a UserError where it is unreadable or not UTF-8."""
    try:
        return path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path} cannot be read as a text file: {e}") from e


def read_run(folder: Path, study: str, dataset: str, model: str, method: str, seed: int) -> Run:
    """One finished run; a UserError names the file and what is wrong with it."""
    try:
        metrics = json.loads(read_text(folder / "metrics.json"))
        info = json.loads(read_text(folder / "run.json"))
    except json.JSONDecodeError as e:
        raise UserError(f"{folder}: a JSON file is malformed ({e}); rerun the run with `dvc repro`") from e
    if not isinstance(metrics, dict) or not isinstance(info, dict):
        raise UserError(f"{folder}: metrics.json and run.json must each hold a JSON object")
    bad = [k for k in REQUIRED_METRICS if not is_number(metrics.get(k))]
    if bad:
        raise UserError(f"{folder}/metrics.json: missing or not a finite number: {', '.join(bad)}")
    rows = list(csv.DictReader(io.StringIO(read_text(folder / "history.csv"), newline="")))
    if not rows or "epoch" not in rows[0] or "test_acc" not in rows[0]:
        raise UserError(f"{folder}/history.csv: needs a header with epoch and test_acc and one row per epoch")
    history = []
    for i, row in enumerate(rows, 2):
        try:
            history.append({k: float(v) for k, v in row.items() if v not in ("", None)})
        except ValueError as e:
            raise UserError(f"{folder}/history.csv line {i}: {e}") from e
    numbers = {k: v for k, v in metrics.items() if is_number(v)}
    return Run(study, dataset, model, method, seed, numbers, history, info.get("config") or {}, **provenance(info))


def provenance(info: dict[str, Any]) -> dict[str, str]:
    """The Run fields that a run.json gives beside the configuration: its MLflow run, and where and when it trained
    (empty where an older run.json lacks one)."""
    return {
        "mlflow_run_id": info.get("mlflow_run_id") or "",
        "device": info.get("device") or "",
        "cpu_kernels": info.get("cpu_capability") or "",
        "gpu_uuid": info.get("gpu_uuid") or "",
        "finished_at": info.get("finished_at") or "",
        "trained_on": machines_text(info.get("machines")),
        "data_digest": info.get("data_digest") or "",
    }


def run_folder(runs_root: Path, study: str, dataset: str, model: str, method: str, seed: int) -> Path:
    return runs_root / study / f"{dataset}-{model}-{method}-s{seed}"


def finished(folder: Path) -> bool:
    """The folder holds what a run writes when it finishes."""
    return all((folder / f).is_file() for f in ("metrics.json", "history.csv", "run.json"))


def collect(params: dict[str, Any], runs_root: Path = Path("runs")) -> list[Run]:
    """Every run of the grid (none for an empty grid); a UserError lists every run that has not finished."""
    found, missing = [], []
    for study, dataset, model, method, seed in grid_runs(params):
        folder = run_folder(runs_root, study, dataset, model, method, seed)
        if finished(folder):
            found.append((folder, study, dataset, model, method, seed))
        else:
            missing.append(str(folder))
    if missing:
        raise UserError(
            f"{len(missing)} run(s) of the grid have not finished (no metrics.json, history.csv and run.json): "
            f"{', '.join(missing)}. Train them with `dvc repro`."
        )
    return [read_run(*args) for args in found]


def ledger_runs(root: Path | None = None) -> list[Run]:
    """Every entry of the results ledger (`cheaptrain.ledger`) as a Run; a UserError names an entry that is not one."""
    runs = []
    for entry in entries(root):
        config = entry.info["config"]
        needed = ("study", "dataset", "model", "method", "seed")
        problems = [f"run.json config lacks {k}" for k in needed if k not in config]
        problems += [f"metrics.json: {k} missing or not a finite number" for k in REQUIRED_METRICS
                     if not is_number(entry.metrics.get(k))]  # fmt: skip
        if "epoch" not in entry.history[0] or "test_acc" not in entry.history[0]:
            problems.append("history.csv needs the columns epoch and test_acc")
        if problems:
            raise UserError(f"ledger entry {entry.path}: {'; '.join(problems)}; restore it from git")
        numbers = {k: v for k, v in entry.metrics.items() if is_number(v)}
        key = (config["study"], config["dataset"], config["model"], config["method"], int(config["seed"]))
        runs.append(Run(*key, numbers, entry.history, config, source="ledger", **provenance(entry.info)))
    return runs


def with_ledger(grid: list[Run], ledger: list[Run]) -> list[Run]:
    """The grid's runs and the ledger's; a run in both (the same study, name and recipe) is counted once: the grid's,
    unless it is an earlier version of the entry (superseded), which the entry replaces, with a warning."""
    entries = {run_identity(r): r for r in ledger}
    kept = []
    for run in grid:
        if superseded(run, entry := entries.get(run_identity(run))):
            print(
                f"warning: {run.study}/{run.name}: the grid's run (finished {run.finished_at}) is an earlier version "
                f"of its ledger entry (finished {entry.finished_at}); the report counts the entry (`dvc repro --force "
                f"--single-item train_{run.study}@{run.dataset}-{run.model}-{run.method}-{run.seed}` copies it into "
                "runs/)",
                file=sys.stderr,
            )
        else:
            kept.append(run)
    trained = {run_identity(r) for r in kept}
    return kept + [r for r in ledger if run_identity(r) not in trained]


def superseded(run: Run, entry: Run | None) -> bool:
    """Whether a grid run is an earlier version of its ledger `entry`: trained in ledger mode record or retrain on the
    same prepared data, it recorded or reused the entry as it was then, and the entry has been replaced since (say
    retrained on a GPU and committed from there), which `dvc repro` sees no change in its train stage's deps for."""
    return (
        entry is not None
        and run.config.get("ledger") in ("record", "retrain")
        and run.data_digest == entry.data_digest
        and run.finished_at != entry.finished_at
    )


def run_identity(run: Run) -> tuple[str, str, str]:
    return run.study, run.name, recipe_id(run.config.get("recipe"))


def config_key(run: Run) -> tuple[str, ...]:
    """The configuration of a run: (study, dataset, model, method, recipe fingerprint), as a summary row's."""
    return run.study, run.dataset, run.model, run.method, recipe_id(run.config.get("recipe"))


def pair_key(run: Run) -> tuple:
    """What pairs a run with its baseline: study, dataset, model, recipe fingerprint and seed."""
    key = config_key(run)
    return (*key[:3], key[4], run.seed)


def row_key(row: dict[str, Any]) -> tuple[str, ...]:
    return (*(row[k] for k in KEY), row.get("recipe", ""))


def t975(n: int) -> float:
    """The 97.5% quantile of Student's t with n-1 degrees of freedom: the table to 30, beyond it the Cornish-Fisher
    expansion around the normal's quantile (within 1e-5 of the exact one from 30 on)."""
    return T975[n - 2] if n - 1 <= len(T975) else cornish_fisher_t975(n - 1)


def cornish_fisher_t975(df: int) -> float:
    z = 1.959964  # the normal's 97.5% quantile
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


@functools.cache  # tens of milliseconds a call; a report asks for a few (p, df) pairs many times
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for upper-tail probability `p` (0 < p < 0.5): the CDF integrated by Simpson's rule,
    inverted by bisection; scipy's to 1e-9 for df >= 2."""
    scale = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def upper_tail(x: float, steps: int = 2000) -> float:  # P(T > x) = 0.5 - ∫_0^x pdf
        h = x / steps
        pdf = [scale * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
        return 0.5 - h / 3 * (pdf[0] + pdf[-1] + 4 * sum(pdf[1:-1:2]) + 2 * sum(pdf[2:-1:2]))

    low, high = 0.0, 1.0
    while upper_tail(high) > p:
        low, high = high, 2 * high
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if upper_tail(mid) > p else (low, mid)
    return (low + high) / 2


def half_width(values: list[float], looks: int = 1) -> float | None:
    """The half-width t*sd/sqrt(n) of the 95% t-interval of the mean of 2+ values, or, for a mean read `looks` times
    as values came in, of the interval widened for all of them (Bonferroni: a 1 - 0.05 / looks t-interval); None for
    fewer than 2 values."""
    n = len(values)
    if n < 2:
        return None
    t = t975(n) if looks == 1 else t_quantile(0.025 / looks, n - 1)
    return t * statistics.stdev(values) / math.sqrt(n)


def describe(values: list[float]) -> tuple[float, float | None, float | None]:
    """Mean, sample standard deviation (2+ values) and 95% interval half-width t*sd/sqrt(n) (3+ values; half_width
    gives it from 2)."""
    n = len(values)
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if n >= 2 else None
    return mean, sd, half_width(values) if n >= 3 else None


def accuracy_measures(params: dict[str, Any]) -> dict[str, str]:
    """Params `aggregate.accuracy`: per study, the measure its tables and the gate use (default: the paper's)."""
    chosen = (params.get("aggregate") or {}).get("accuracy") or {}
    if not isinstance(chosen, dict):
        raise UserError(f"aggregate.accuracy: must map study to one of {', '.join(MEASURES)}")
    bad = [f"aggregate.accuracy.{s}: {m!r}" for s, m in chosen.items() if m not in MEASURES]
    if bad:
        raise UserError(f"{'; '.join(bad)} is not accepted; accepted: {' | '.join(MEASURES)}")
    studies = list(dict.fromkeys([*PAPER_MEASURE, *(params.get("grid") or {})]))  # the ledger's: the papers'
    if unknown := [str(s) for s in chosen if s not in studies]:
        raise UserError(f"aggregate.accuracy: {', '.join(unknown)} is not a study; accepted: {', '.join(studies)}")
    return {study: chosen.get(study, PAPER_MEASURE.get(study, "final_acc")) for study in studies}


def collapsed(run: Run) -> bool:
    """Whether the run ended at chance accuracy, within CHANCE_MARGIN points of 100 / classes: its network stopped
    learning (every unit dead after its loss diverged, say), which no figure of a method is compared with. A run whose
    loss became NaN (`diverged_epoch`, kept by the runner at a paper's setting) did, whatever its last epoch before."""
    line = chance_line(run.dataset)
    return "diverged_epoch" in run.metrics or (line is not None and run.metrics["final_acc"] <= line)


def chance_line(dataset: str) -> float | None:
    """The accuracy (%) at or below which a run of `dataset` is at chance: 100 / classes + CHANCE_MARGIN; None for a
    dataset of unknown classes."""
    classes = DATASETS.get(dataset)
    return None if classes is None else 100 / classes + CHANCE_MARGIN


def seed_list(runs: list[Run]) -> str:
    return " ".join(str(r.seed) for r in runs)


def summarize(runs: list[Run], measures: dict[str, str]) -> list[dict[str, Any]]:
    """One row per configuration (study, dataset, model, method, recipe): statistics over seeds, methods paired by seed
    with the baseline of the same recipe; wall-clock savings only where both runs of every pair trained on one
    machine (device and CPU threads); runs that ended at chance (`collapsed`) left out, and named."""

    baselines = {pair_key(r): r for r in runs if r.method == BASELINE and not collapsed(r)}
    failed_baselines = {pair_key(r) for r in runs if r.method == BASELINE and collapsed(r)}
    times = {run_identity(r): run_time(r.history, f"{r.study}/{r.name}") for r in runs}
    summary = []
    for key, every in itertools.groupby(sorted(runs, key=_order), key=config_key):
        every = list(every)
        group = [r for r in every if not collapsed(r)]
        study, method = key[0], key[3]
        measure = measures.get(study, PAPER_MEASURE.get(study, "final_acc"))
        sources = {r.source for r in every}  # where its runs came from, those at chance too
        row: dict[str, Any] = dict(zip(KEY, key[:4], strict=True)) | {
            "seeds": len(group),
            "epochs": int(max(r.metrics["epochs"] for r in every)),  # a run that diverged stopped short of them
            "recipe": key[4],
            "source": "+".join(s for s in SOURCES if s in sources),
            "devices": ", ".join(sorted({r.device for r in group if r.device})),
            "acc_measure": measure,
        }
        if len(group) < len(every):
            row["collapsed_seeds"] = seed_list([r for r in every if collapsed(r)])
        values = {name: [r.metrics.get(name) for r in group] for name in ("final_acc", "best3_acc", "train_time_s")}
        values["acc"] = [r.metrics[measure] for r in group]
        for name in ("planned_saving_pct", "updated_params_reduction_pct"):
            values[name] = [r.metrics.get(name) for r in group]
        replicates: dict[str, list[list[float]]] = {}  # per seed, a wall-clock saving's bootstrap replicates
        timed = [times[run_identity(r)] for r in group]
        if group and all(timed):
            row["work_measure"] = ",".join(sorted({t.work_measure for t in timed}))
            values["robust_train_time_s"] = [t.robust_time_s for t in timed]
            values["first_epoch_s"] = [t.first_epoch_s for t in timed]
            values["full_epoch_s"] = [t.full_epoch_s for t in timed]
            values["own_time_saving_pct"] = [t.own_saving_pct for t in timed]
            values["cheap_time_share"] = [t.cheap_time_share for t in timed]
            values["cheap_work_share"] = [t.cheap_work_share for t in timed]
            replicates["own_time_saving_pct"] = [t.own_saving_replicates for t in timed]
        partners = [baselines.get(pair_key(r)) for r in group]
        pairs = [(r, b) for r, b in zip(group, partners, strict=True) if b is not None]
        alone = [r for r, b in zip(group, partners, strict=True) if b is None]
        if method != BASELINE:  # paired figures are over the seeds whose baseline has run, and say how many
            row["paired_seeds"] = len(pairs)
            if waiting := [r for r in alone if pair_key(r) not in failed_baselines]:
                row["unpaired_seeds"] = seed_list(waiting)
            if failed := [r for r in alone if pair_key(r) in failed_baselines]:
                row["baseline_collapsed_seeds"] = seed_list(failed)
        if method != BASELINE and pairs:
            values["acc_delta"] = [r.metrics[measure] - b.metrics[measure] for r, b in pairs]
            values["sample_saving_pct"] = [_saving(r, b, "total_trained_samples") for r, b in pairs]
            if all("total_train_flops" in r.metrics and "total_train_flops" in b.metrics for r, b in pairs):
                values["compute_saving_pct"] = [_saving(r, b, "total_train_flops") for r, b in pairs]
            timed_pairs = [(times[run_identity(r)], times[run_identity(b)]) for r, b in pairs]
            if elsewhere := [d for r, b in pairs if (d := machine_difference(r, b))]:
                row["time_unpaired"] = "; ".join(elsewhere)
            elif all(t and bt for t, bt in timed_pairs):
                savings = [paired_saving(t, bt) for t, bt in timed_pairs]
                values["time_saving_pct"] = [saving for saving, _ in savings]
                replicates["time_saving_pct"] = [spread for _, spread in savings]
        for name, vals in values.items():
            if vals and all(v is not None for v in vals):
                for part, value in zip(("mean", "std", "ci95"), describe(vals), strict=True):
                    row[f"{name}_{part}"] = value
        for name, per_seed in replicates.items():  # widened by the spread over seeds from 2 seeds on
            spread = half_width(values[name])
            row[f"{name}_lo"], row[f"{name}_hi"] = seed_interval(per_seed, row[f"{name}_mean"], spread)
        for name in MEANS:
            if group and all(name in r.metrics for r in group):
                row[f"{name}_mean"] = statistics.fmean(r.metrics[name] for r in group)
        row["mlflow_run_ids"] = " ".join(r.mlflow_run_id for r in group)
        summary.append(row)
    return summary


def recipe_id(recipe: dict[str, Any] | None) -> str:
    """A short fingerprint of the training recipe: results of different recipes are not compared with each other."""
    return hashlib.sha256(json.dumps(recipe or {}, sort_keys=True).encode()).hexdigest()[:10] if recipe else ""


def _order(run: Run) -> tuple:
    key = config_key(run)
    return (*key[:3], key[4], run.method != BASELINE, run.method, run.seed)  # baseline first


def machine_difference(run: Run, baseline: Run) -> str:
    """How a run and its baseline trained on different machines (device, CPU threads, a CPU's vector instructions, a
    GPU's UUID), whose wall-clock times therefore do not compare; '' where they trained alike or a run does not say. A
    run resumed on another machine compares with none."""
    for whose, one in (("", run), ("'s baseline", baseline)):
        if one.trained_on:
            return f"seed {run.seed}{whose} trained on several machines ({one.trained_on})"
    if run.device and baseline.device and run.device != baseline.device:
        return f"seed {run.seed} on {run.device}, its baseline on {baseline.device}"
    if run.gpu_uuid and baseline.gpu_uuid and run.gpu_uuid != baseline.gpu_uuid:
        return (f"seed {run.seed} on {run.device} {run.gpu_uuid[:12]}, its baseline on another {baseline.device}, "
                f"{baseline.gpu_uuid[:12]}")  # fmt: skip
    on_cpu = run.device.startswith("cpu") and baseline.device.startswith("cpu")
    if on_cpu and run.cpu_kernels and baseline.cpu_kernels and run.cpu_kernels != baseline.cpu_kernels:
        return (f"seed {run.seed} on {run.device} with {run.cpu_kernels}, its baseline on {baseline.device} with "
                f"{baseline.cpu_kernels}")  # fmt: skip
    ours, theirs = run_threads(run), run_threads(baseline)
    if ours and theirs and ours != theirs:
        return f"seed {run.seed} on {threads_text(ours)}, its baseline on {threads_text(theirs)}"
    return ""


def run_threads(run: Run) -> list[int]:
    """The CPU threads a run trained with, from its history (every epoch records them)."""
    return sorted({int(row["threads"]) for row in run.history if row.get("threads")})


def threads_text(threads: list[int]) -> str:
    return f"{'/'.join(map(str, threads))} CPU thread{'s' * (threads != [1])}"


def _saving(run: Run, baseline: Run, metric: str) -> float:
    return 100 * (1 - run.metrics[metric] / baseline.metrics[metric]) if baseline.metrics[metric] else math.nan


def load_published(path: Path) -> dict[tuple[str, str, str, str, str], float]:
    """Every cell of the papers' tables: (paper, dataset, model, method, metric) -> value."""
    if not path.is_file():
        raise UserError(f"{path} not found: the papers' published figures (copy of ../shared/papers/)")
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    if tuple(reader.fieldnames or ()) != PUBLISHED_COLUMNS:
        raise UserError(f"{path}: columns must be {','.join(PUBLISHED_COLUMNS)}, got {reader.fieldnames}")
    cells = {}
    for i, row in enumerate(reader, 2):
        try:
            value = float(row["value"])
        except ValueError as e:
            raise UserError(f"{path} line {i}: value {row['value']!r} is not a number") from e
        cells[(row["paper"], row["dataset"], row["model"], row["method"], row["metric"])] = value
    return cells


def add_published(summary: list[dict[str, Any]], published: dict[tuple, float]) -> list[dict[str, Any]]:
    """Beside each row, the paper's figure for the same study, dataset, model and method, and the difference."""
    out = []
    for row in summary:

        def cell(method: str, *metrics: str, row: dict[str, Any] = row) -> float | None:
            found = [published.get((row["study"], row["dataset"], row["model"], method, m)) for m in metrics]
            return next((v for v in found if v is not None), None)

        accuracy = ("accuracy_best3", "accuracy")  # DFP Table 2, WUS Table 2
        paper = {
            "paper_acc": cell(row["method"], *accuracy),
            "paper_train_time_s": cell(row["method"], "train_time"),
            "paper_overhead_s": cell(row["method"], "overhead"),
            "paper_time_saving_pct": cell(row["method"], "time_saving"),
            "paper_updated_params_reduction_pct": cell(row["method"], "updated_params_reduction"),
        }
        paper_baseline = cell(BASELINE, *accuracy)
        if row["method"] != BASELINE and paper["paper_acc"] is not None and paper_baseline is not None:
            paper["paper_acc_delta"] = paper["paper_acc"] - paper_baseline
        for ours, theirs, diff in (
            ("acc_mean", "paper_acc", "acc_vs_paper"),
            ("acc_delta_mean", "paper_acc_delta", "acc_delta_vs_paper"),
            ("time_saving_pct_mean", "paper_time_saving_pct", "time_saving_vs_paper"),
            (
                "updated_params_reduction_pct_mean",
                "paper_updated_params_reduction_pct",
                "updated_params_reduction_vs_paper",
            ),
        ):
            if row.get(ours) is not None and paper.get(theirs) is not None:
                paper[diff] = row[ours] - paper[theirs]
        out.append(row | {k: v for k, v in paper.items() if v is not None})
    return out


def summary_csv(summary: list[dict[str, Any]]) -> str:
    """The summary as CSV with a fixed set of columns (empty where a figure does not apply), 4 decimals."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=SUMMARY_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in summary:
        writer.writerow({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if v is not None})
    return out.getvalue()


def read_summary(path: Path) -> list[dict[str, Any]]:
    """A summary.csv back as rows: numbers as floats, empty cells left out; a UserError if it is not a summary."""
    if not path.is_file():
        raise UserError(f"{path} not found: run the aggregate stage first (`dvc repro aggregate`)")
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    missing = [c for c in (*KEY, "seeds", "acc_measure", "acc_mean") if c not in (reader.fieldnames or ())]
    if missing:
        raise UserError(f"{path} is not a summary written by the aggregate stage: no column {', '.join(missing)}")
    rows = []
    for i, raw in enumerate(reader, 2):
        row: dict[str, Any] = {}
        for k, v in raw.items():
            if v in ("", None):
                continue
            if k in TEXT_COLUMNS:
                row[k] = v
                continue
            try:
                row[k] = float(v)
            except ValueError as e:
                raise UserError(f"{path} line {i}: column {k}: {v!r} is not a number") from e
        if any(k not in row for k in KEY) or ("acc_mean" not in row and "collapsed_seeds" not in row):
            raise UserError(f"{path} line {i}: a row needs {', '.join(KEY)} and acc_mean (or collapsed_seeds)")
        rows.append(row)
    return rows


def headline(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """results/metrics.json for `dvc metrics show`: per study and configuration, the figures a reader compares, and
    how many of its seeds ended at chance where some did (a configuration whose every seed did has no other figure).
    The configurations of the ledger alone sit under `ledger`, so that the grid's keep their names; of two with one
    name (another recipe), the second's carries its recipe fingerprint."""
    keep = (
        "acc", "acc_delta", "train_time_s", "compute_saving_pct", "time_saving_pct", "own_time_saving_pct",
        "planned_saving_pct", "updated_params_reduction_pct",
    )  # fmt: skip
    metrics: dict[str, Any] = {}
    for row in summary:
        section = metrics.setdefault("ledger", {}) if row.get("source") == "ledger" else metrics
        names = section.setdefault(row["study"], {})
        name = f"{row['dataset']}-{row['model']}-{row['method']}"
        name = f"{name} recipe {row.get('recipe', '')}" if name in names else name  # characters MLflow accepts
        names[name] = {k: round(row[f"{k}_mean"], 4) for k in keep if row.get(f"{k}_mean") is not None}
        if collapsed := str(row.get("collapsed_seeds") or "").split():
            names[name]["collapsed_seeds"] = len(collapsed)
    return metrics
