"""The reader's view of the summary: the papers' tables with our figures beside theirs, findings, figures, MLflow.

Outputs under results/ (the aggregate stage): report.md, figures/*.png, curves/<study>-<dataset>-<model>-<method>.csv
(per-epoch means over seeds, for `dvc plots`), and one MLflow run in the experiment `aggregate`.

report.md opens with "Reproduced at the papers' scale": every claim the papers publish about a method, against our
runs at the paper's setting (from the grid or the results ledger), with a verdict and one coverage line. The rest is
the grid's: its setting, the papers' tables with its figures, findings, figures and curves (a ledger run joins them
only as a seed of one of the grid's configurations); summary.csv and metrics.json hold every configuration.

"Accuracy against cost" compares the methods at equal cost: each method across its budgets (named configurations,
`methods.<name>.method`), grouped by compute saved, the best at each budget named and its lead weighed seed by seed
against its 95% interval (`cost_table`, `cost_figure`: results/figures/acc_vs_cost.png).

Wall-clock savings are shown with their 95% interval and beside the compute saved, their bound (`cheaptrain.timing`).
A time saving is "within noise" of a figure, 0 or the paper's, when its interval contains it; a time saving below 0
of a method that did less work is within noise too, since the interval cannot see a machine that was busier during
one run than during the other. Such a figure is neither called a finding nor a mismatch; against the paper's figure,
one within `aggregate.agree_within` points of it matches (time_kind), unless it lies above the compute saved.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.figure import Figure

from cheaptrain import UserError, atomic_write
from cheaptrain.aggregate import (
    BASELINE,
    KEY,
    PAPER_MEASURE,
    Run,
    accuracy_measures,
    add_published,
    collect,
    config_key,
    describe,
    headline,
    ledger_runs,
    load_published,
    row_key,
    summarize,
    summary_csv,
    with_ledger,
)
from cheaptrain.ledger import ledger_root
from cheaptrain.papers import PAPERS
from cheaptrain.papers import paper_setting as paper_setting_of

MLFLOW_EXPERIMENT = "aggregate"
MEASURE_LABEL = {"best3_acc": "mean of the best three test accuracies", "final_acc": "final-epoch test accuracy"}
MEASURE_SHORT = {"best3_acc": "best-3 acc %", "final_acc": "final acc %"}
COLORS = {"baseline": "0.25", "dfp": "tab:blue", "random_prune": "tab:orange", "wus": "tab:green", "wus_lr": "tab:red",
          "infobatch": "tab:purple"}  # fmt: skip
FIGURES = (
    "test_acc.png", "acc_vs_time.png", "pruned_samples.png", "wus_phases.png", "time_saving.png", "acc_vs_cost.png",
)  # fmt: skip
LEDGER_FIGURES = {  # the runs at the papers' setting (grid or ledger): file -> what it shows
    "ledger_test_acc.png": "Test accuracy per epoch at the papers' setting",
    "ledger_acc_vs_cost.png": "Accuracy Δ against compute saved and time saved at the papers' setting",
    "ledger_wus_phases.png": "WUS phases over the papers' 200 epochs",
}
NOT_IN_PAPER = "not in the paper"


# ---------------------------------------------------------------------------------------------------- numbers


def _fmt(value: float | None, digits: int = 2, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def stat(row: dict[str, Any], name: str, digits: int = 2, sign: bool = False) -> str:
    """'mean ± ci95' with 3+ seeds, 'mean (sd x)' with 2, 'mean' with 1, '—' when the figure does not apply."""
    mean = row.get(f"{name}_mean")
    if mean is None:
        return "—"
    text = _fmt(mean, digits, sign)
    if row.get(f"{name}_ci95") is not None:
        return f"{text} ± {row[f'{name}_ci95']:.{digits}f}"
    if row.get(f"{name}_std") is not None:
        return f"{text} (sd {row[f'{name}_std']:.{digits}f})"
    return text


def paper(row: dict[str, Any], name: str, digits: int = 2, sign: bool = False) -> str:
    """The paper's figure; '—' where it cannot apply (a baseline's saving or delta), else 'not in the paper'."""
    if row.get(name) is not None:
        return _fmt(row[name], digits, sign)
    if row["method"] == BASELINE and name not in ("paper_acc", "paper_train_time_s"):
        return "—"
    return NOT_IN_PAPER


def interval_text(row: dict[str, Any], name: str, digits: int = 1) -> str:
    """'mean [lo, hi]' with the figure's 95% interval; stat() where the summary has none."""
    if row.get(f"{name}_lo") is None or row.get(f"{name}_mean") is None:
        return stat(row, name, digits)
    return f"{row[f'{name}_mean']:.{digits}f} [{row[f'{name}_lo']:.{digits}f}, {row[f'{name}_hi']:.{digits}f}]"


def less_work(row: dict[str, Any]) -> bool:
    """Whether the method did less work than its baseline: fewer FLOPs, or (runs without FLOPs) fewer samples."""
    saved = row.get("compute_saving_pct_mean", row.get("sample_saving_pct_mean"))
    return saved is not None and saved > 0


def within_noise(row: dict[str, Any], name: str, compared: float) -> bool:
    """Whether the wall-clock saving `name` cannot be told from `compared` (module docstring)."""
    mean, lo, hi = (row.get(f"{name}_{part}") for part in ("mean", "lo", "hi"))
    if row["method"] == BASELINE or mean is None:
        return False
    return (lo is not None and lo <= compared <= hi) or (mean < 0 and less_work(row))


def saving_cell(row: dict[str, Any], name: str) -> str:
    """A wall-clock saving with its interval, marked when it is within noise of 0."""
    text = interval_text(row, name)
    return f"{text} within noise" if within_noise(row, name, 0.0) else text


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


# ---------------------------------------------------------------------------------------------------- tables


@dataclass
class Table:
    slug: str  # file name in MLflow: tables/<slug>.json
    title: str
    note: str
    headers: list[str]
    rows: list[list[str]]

    def markdown(self) -> str:
        table = md_table(self.headers, self.rows) + "\n\n" if self.rows else ""
        return f"### {self.title}\n\n{table}{self.note}\n"

    def columns(self) -> dict[str, list[str]]:
        return {h: [r[i] for r in self.rows] for i, h in enumerate(self.headers)}


Column = tuple[str, Callable[[dict[str, Any]], str]]
ID: list[Column] = [
    ("dataset", lambda r: r["dataset"]),
    ("model", lambda r: r["model"]),
    ("method", lambda r: r["method"]),
    ("seeds", lambda r: str(int(r["seeds"]))),
]
TIME_NOTE = (
    "Times in seconds are this machine's, the paper's come from other hardware and 200 epochs: compare the savings, "
    "not the seconds. Train time: the sum of the epochs; 1st epoch: epoch 1 alone (one-off costs); full epoch: the "
    "median of the later epochs that train everything. Compute saved = 100·(1 − training FLOPs / the baseline's), "
    "paired by seed: what an ideal implementation saves on any hardware, the bound for the time saved. Time saved = "
    "100·(1 − robust time / the baseline's), paired by seed; own time saved: against the run's own full epochs (no "
    "drift between runs). The robust time weighs each kind of epoch by its median seconds per unit of work, so a few "
    "slow epochs do not move it (`src/cheaptrain/timing.py`); [lo, hi] is the 95% interval; within noise: the "
    "interval contains 0, or the method lost time while doing less work. "
)


def accuracy_columns(measure: str) -> list[Column]:
    return [
        (MEASURE_SHORT[measure], lambda r: stat(r, "acc")),
        ("paper %", lambda r: paper(r, "paper_acc")),
        ("acc diff", lambda r: _fmt(r.get("acc_vs_paper"), sign=True)),
        ("Δ vs baseline", lambda r: stat(r, "acc_delta", sign=True)),
        ("paper Δ", lambda r: paper(r, "paper_acc_delta", sign=True)),
        ("Δ diff", lambda r: _fmt(r.get("acc_delta_vs_paper"), sign=True)),
    ]


def time_columns(with_pruning: bool) -> list[Column]:
    columns: list[Column] = [
        ("train time s", lambda r: stat(r, "train_time_s", 1)),
        ("1st epoch s", lambda r: stat(r, "first_epoch_s", 2)),
        ("full epoch s", lambda r: stat(r, "full_epoch_s", 2)),
        ("paper s", lambda r: paper(r, "paper_train_time_s", 0)),
    ]
    if with_pruning:
        columns += [
            ("overhead s", lambda r: _fmt(r.get("overhead_s_mean"), 1)),
            ("paper overhead s", lambda r: paper(r, "paper_overhead_s")),
            ("planned saving %", lambda r: stat(r, "planned_saving_pct", 1)),
            ("samples saved %", lambda r: stat(r, "sample_saving_pct", 1)),
        ]
    return [
        *columns,
        ("compute saved %", lambda r: stat(r, "compute_saving_pct", 1)),
        ("time saved %", lambda r: saving_cell(r, "time_saving_pct")),
        ("own time saved %", lambda r: saving_cell(r, "own_time_saving_pct")),
        ("paper %", lambda r: paper(r, "paper_time_saving_pct")),
        ("diff", paper_time_diff),
    ]


def paper_time_diff(row: dict[str, Any]) -> str:
    """Our time saved minus the paper's, marked when the paper's figure is within our noise."""
    text = _fmt(row.get("time_saving_vs_paper"), 1, sign=True)
    published = row.get("paper_time_saving_pct")
    noisy = published is not None and within_noise(row, "time_saving_pct", published)
    return f"{text} within noise" if noisy else text


ACC_NOTE = (
    "Accuracy in %, mean over seeds; ± is the 95% t-interval over seeds (3+ seeds), (sd) the standard deviation (2 "
    "seeds). Δ: method minus the baseline of the same recipe and seed, in points; diff: ours minus the paper's."
)
PRUNING_NOTE = "Planned saving: the sample-passes the pruning schedule leaves out; samples saved: the measured ones."
PARAMS_COLUMNS: list[Column] = [
    ("skip epochs", lambda r: _fmt(r.get("skip_epochs_mean"), 1)),
    ("normal epochs", lambda r: _fmt(r.get("normal_epochs_mean"), 1)),
    ("reduction %", lambda r: stat(r, "updated_params_reduction_pct", 1)),
    ("paper %", lambda r: paper(r, "paper_updated_params_reduction_pct", 0)),
    ("diff", lambda r: _fmt(r.get("updated_params_reduction_vs_paper"), 1, sign=True)),
]
PARAMS_NOTE = "N = E_skip·b + E_normal·(b + w), against a baseline that updates every parameter every epoch."


def paper_tables(summary: list[dict[str, Any]]) -> list[Table]:
    """The papers' tables (DFP 1-2, WUS 1-3) with our figure, the published one and the difference in each."""
    tables = []
    for study, rows in itertools.groupby(summary, key=lambda r: r["study"]):
        rows = list(rows)
        accuracy = f"accuracy ({MEASURE_LABEL[rows[0]['acc_measure']]})"
        acc_columns = accuracy_columns(rows[0]["acc_measure"])
        specs = {  # (file name, title, columns, note)
            "dfp": [
                ("table1", "DFP Table 1: training time", time_columns(True), TIME_NOTE + PRUNING_NOTE),
                ("table2", f"DFP Table 2: {accuracy}", acc_columns, ACC_NOTE),
            ],
            "wus": [
                ("table1", "WUS Table 1: training time", time_columns(False), TIME_NOTE),
                ("table2", f"WUS Table 2: {accuracy}", acc_columns, ACC_NOTE),
                ("table3", "WUS Table 3: reduction of updated parameters (Eq. 1)", PARAMS_COLUMNS, PARAMS_NOTE),
            ],
        }.get(study) or [  # a study from neither paper
            ("time", f"{study}: training time", time_columns(False), TIME_NOTE),
            ("accuracy", f"{study}: {accuracy}", acc_columns, ACC_NOTE),
        ]
        for slug, title, columns, note in specs:
            shown = [r for r in rows if r["method"] != BASELINE] if columns is PARAMS_COLUMNS else rows
            if not shown:
                note = f"No method runs of this study in the grid yet. {note}"
            cells = [[f(r) for _, f in ID + columns] for r in shown]
            tables.append(Table(f"{study}_{slug}", title, note, [h for h, _ in ID + columns], cells))
    return tables


# ---------------------------------------------------------------------------------------------------- findings


def setting_differences(
    runs: list[Run], devices: dict[str, str], published: set[tuple[str, str, str]], measures: dict[str, str]
) -> dict[str, list[str]]:
    """Per study, every way this setting differs from the paper's: recipe, models, seeds, hardware, accuracy measure.
    `published`: the (study, dataset, model) that the papers' tables have."""
    out: dict[str, list[str]] = {}
    for study, group in itertools.groupby(sorted(runs, key=lambda r: r.study), key=lambda r: r.study):
        group = list(group)
        the_paper = PAPERS.get(study)
        if the_paper is None:
            out[study] = [f"study {study!r} is from neither paper: nothing published to compare with"]
            continue
        diffs = []
        recipe = group[0].config.get("recipe") or {}
        for key, theirs in the_paper["recipe"].items():
            ours = list(recipe[key]) if isinstance(recipe.get(key), tuple | list) else recipe.get(key)
            irrelevant = (
                key in ("milestones", "step_size") and recipe.get("schedule") != the_paper["recipe"]["schedule"]
            )
            if key in recipe and ours != theirs and not irrelevant:
                diffs.append(f"{key} {ours} (paper: {theirs})")
        extra = sorted({(r.dataset, r.model) for r in group if (study, r.dataset, r.model) not in published})
        diffs += [f"{model} on {dataset} is {NOT_IN_PAPER}" for dataset, model in extra]
        seeds = len({r.seed for r in group})
        if isinstance(the_paper["runs"], int) and seeds != the_paper["runs"]:
            diffs.append(f"{seeds} seed(s) per configuration (paper: mean of {the_paper['runs']} runs)")
        hardware = sorted({r.device or devices.get(r.mlflow_run_id) or "an unknown device" for r in group})
        diffs.append(f"trained on {', '.join(hardware)} (paper: {the_paper['hardware']})")
        if measures.get(study, PAPER_MEASURE[study]) != PAPER_MEASURE[study]:
            diffs.append(f"accuracy measure: not the paper's ({MEASURE_LABEL[PAPER_MEASURE[study]]})")
        out[study] = diffs
    return out


def findings(summary: list[dict[str, Any]], agree: dict[str, float]) -> list[str]:
    """What matches the papers and what does not, one line per configuration, plus DFP against its random control."""
    lines = []
    rows = {tuple(r[k] for k in KEY): r for r in summary}
    for row in summary:
        where = f"{row['study'].upper()} {row['dataset']}/{row['model']}/{row['method']}"
        if row["method"] == BASELINE:
            if row.get("paper_acc") is not None:
                lines.append(
                    f"{where}: {stat(row, 'acc')}% against the paper's {row['paper_acc']:.2f}% "
                    f"({row['acc_vs_paper']:+.2f} points)."
                )
            else:
                lines.append(f"{where}: {stat(row, 'acc')}%; this configuration is {NOT_IN_PAPER}.")
            continue
        parts = [compare(row, "acc_delta", "paper_acc_delta", "accuracy Δ", agree["acc_points"], " points")]
        parts += time_findings(row, agree["saving_points"])
        parts.append(
            compare(
                row,
                "updated_params_reduction_pct",
                "paper_updated_params_reduction_pct",
                "updated-parameter reduction",
                agree["saving_points"],
                "%",
            )
        )
        parts = [p for p in parts if p]
        dfp = rows.get((row["study"], row["dataset"], row["model"], "dfp"), {})
        if row["method"] == "random_prune" and None not in (dfp.get("acc_delta_mean"), row.get("acc_delta_mean")):
            gain = dfp["acc_delta_mean"] - row["acc_delta_mean"]
            both = "compute_saving_pct_mean" in dfp and "compute_saving_pct_mean" in row  # else runs without FLOPs
            name, what = ("compute_saving_pct", "compute") if both else ("sample_saving_pct", "samples")
            parts.append(
                f"DFP's selection against this random control: {gain:+.2f} points of accuracy at "
                f"{_fmt(dfp.get(f'{name}_mean'), 1)}% vs {_fmt(row.get(f'{name}_mean'), 1)}% {what} saved"
            )
        lines.append(f"{where}: " + ("; ".join(parts) if parts else "no baseline to compare with") + ".")
    return lines


def compare(row: dict[str, Any], ours: str, theirs: str, what: str, tol: float, unit: str) -> str | None:
    """Our figure against the paper's: a match within `tol` points or within our 95% t-interval when that is wider."""
    value, published = row.get(f"{ours}_mean"), row.get(theirs)
    if value is None:
        return None
    if published is None:
        return f"{what} {value:+.2f}{unit} ({NOT_IN_PAPER})"
    margin = max(tol, row.get(f"{ours}_ci95") or 0)
    gap = value - published
    verdict = "matches" if abs(gap) <= margin else f"does NOT match ({gap:+.2f}, beyond ±{margin:.2f})"
    return f"{what} {value:+.2f}{unit} vs the paper's {published:+.2f}{unit}: {verdict}"


def time_findings(row: dict[str, Any], tol: float) -> list[str]:
    """Compute saved, time saved against the baseline (beside the paper's figure) and against the run's own full
    epochs, each time with its 95% interval and marked within noise where it is (module docstring)."""
    parts = []
    compute = row.get("compute_saving_pct_mean")
    if compute is not None:
        parts.append(f"compute saved {compute:+.2f}% (the bound for the time saved)")
    elif row.get("work_measure") == "samples":
        parts.append("compute saved unknown (runs without train_flops: epochs weighed by trained samples)")
    if row.get("time_saving_pct_mean") is not None:
        shown = f"time saved {signed_interval(row, 'time_saving_pct')}"
        published = row.get("paper_time_saving_pct")
        if published is not None:
            parts.append(f"{shown} vs the paper's {published:+.2f}%: {time_verdict(row, published, tol)}")
        elif within_noise(row, "time_saving_pct", 0.0):
            parts.append(f"{shown}: within noise ({NOT_IN_PAPER})")
        else:
            parts.append(f"{shown} ({NOT_IN_PAPER})")
    if row.get("own_time_saving_pct_mean") is not None:
        shown = f"time saved vs its own full epochs {signed_interval(row, 'own_time_saving_pct')}"
        parts.append(f"{shown}: within noise" if within_noise(row, "own_time_saving_pct", 0.0) else shown)
    return parts


def signed_interval(row: dict[str, Any], name: str) -> str:
    """'+m% [+lo, +hi]', or '+m%' without an interval."""
    text = f"{row[f'{name}_mean']:+.2f}%"
    if row.get(f"{name}_lo") is not None:
        text += f" [{row[f'{name}_lo']:+.2f}, {row[f'{name}_hi']:+.2f}]"
    return text


def time_kind(row: dict[str, Any], published: float, tol: float, name: str = "time_saving_pct") -> str:
    """Our time saved (`name`) against the paper's: 'above bound' (above the compute saved, its bound: noise),
    'match' (within `tol` points), 'noise' (else within noise: module docstring) or 'mismatch'."""
    value, lo = row[f"{name}_mean"], row.get(f"{name}_lo", row[f"{name}_mean"])
    compute = row.get("compute_saving_pct_mean")
    if compute is not None and lo > compute + tol:
        return "above bound"
    if abs(value - published) <= tol:
        return "match"
    return "noise" if within_noise(row, name, published) else "mismatch"


def time_verdict(row: dict[str, Any], published: float, tol: float) -> str:
    """Our time saved against the paper's, in words (time_kind)."""
    kind, compute = time_kind(row, published, tol), row.get("compute_saving_pct_mean")
    if kind == "noise":
        return "within noise (neither a match nor a mismatch)"
    if kind == "above bound":
        return f"above the compute saved ({compute:.2f}%), its bound: noise, not a finding"
    if kind == "match":
        return "matches"
    gap = row["time_saving_pct_mean"] - published
    verdict = f"does NOT match ({gap:+.2f}, beyond ±{tol:.2f} and outside our interval)"
    if compute is not None and published > compute + tol:
        verdict += f"; the paper's figure is above this setting's compute saved ({compute:.2f}%), the bound"
    return verdict


# ---------------------------------------------------------------------------------------------------- the papers' scale

CLAIMS = {  # a published metric of a method: (our statistic, what it is, digits)
    "accuracy_best3": ("acc_delta", "accuracy Δ (points)", 2),  # DFP Table 2, against the paper's own baseline
    "accuracy": ("acc_delta", "accuracy Δ (points)", 2),  # WUS Table 2
    # DFP Table 1, WUS Table 1: ours against the run's own full epochs, which the drift of a shared machine between
    # the method's run and its baseline's (hours apart) does not enter; the tables above show the paired saving too
    "time_saving": ("own_time_saving_pct", "time saved % (vs its own full epochs)", 1),
    "updated_params_reduction": ("updated_params_reduction_pct", "updated-parameter reduction %", 1),  # WUS Table 3
}
WITHIN, OUTSIDE, NOISE, NOT_RUN = "within tolerance", "outside tolerance", "within noise", "not yet run"
UNAVAILABLE = {  # datasets these machines cannot obtain: (verdict, why)
    "cifar100": (
        "CIFAR-100 unavailable",
        "CIFAR-100 cannot be obtained on these machines: they reach no download site, and `../shared/datasets/` "
        "holds CIFAR-10 only",
    ),
}
JPEG_NOTE = (
    "CIFAR-10 here is the shared archive's JPEG re-encoding of the official images (`../shared/datasets/README.md`): "
    "accuracies on it run a little below those on the official data, so an accuracy a little below the paper's is "
    "expected; a Δ compares two runs on the same data."
)


@dataclass(frozen=True)
class Claim:
    """One figure a paper publishes about a method: its accuracy Δ against the paper's baseline, its time saved, or
    (WUS) its reduction of updated parameters."""

    study: str
    dataset: str
    model: str
    method: str
    figure: str  # the summary's statistic: acc_delta | time_saving_pct | updated_params_reduction_pct
    what: str
    digits: int
    published: float


def published_claims(published: dict[tuple, float]) -> list[Claim]:
    """Every claim of the papers' tables about a method, in the order of the tables' networks."""
    order: dict[tuple, int] = {}
    for key in published:
        order.setdefault(key[:3], len(order))
    figures = list(dict.fromkeys(figure for figure, _, _ in CLAIMS.values()))
    claims = []
    for (study, dataset, model, method, metric), value in published.items():
        if method == BASELINE or metric not in CLAIMS:
            continue
        figure, what, digits = CLAIMS[metric]
        if figure == "acc_delta":
            baseline = published.get((study, dataset, model, BASELINE, metric))
            if baseline is None:
                continue
            value -= baseline
        claims.append(Claim(study, dataset, model, method, figure, what, digits, value))
    return sorted(claims, key=lambda c: (order[c.study, c.dataset, c.model], c.method, figures.index(c.figure)))


def paper_setting(run: Run) -> tuple[bool, list[str]]:
    """Whether a run counts as trained at its paper's setting (papers.paper_setting), with its model arguments named
    as a deviation."""
    counted, notes = paper_setting_of(run.study, run.config.get("recipe") or {}, run.model)
    if counted and run.config.get("model_args"):
        notes.append(f"model arguments {run.config['model_args']}")
    return counted, notes


def first_runs(runs: list[Run]) -> dict[tuple[str, ...], Run]:
    """One run per configuration (its runs share the recipe), by configuration key."""
    first: dict[tuple[str, ...], Run] = {}
    for run in runs:
        first.setdefault(config_key(run), run)
    return first


def paper_scale_rows(summary: list[dict[str, Any]], runs: list[Run]) -> dict[tuple, tuple[dict[str, Any], list[str]]]:
    """Per (study, dataset, model, method): the summary row at the paper's setting and its deviations; of several,
    the one with the fewest deviations, then the most seeds."""
    first = first_runs(runs)
    chosen: dict[tuple, tuple[dict[str, Any], list[str]]] = {}
    for row in summary:
        counted, notes = paper_setting(first[row_key(row)])
        if not counted:
            continue
        theirs = PAPER_MEASURE[row["study"]]
        if row["acc_measure"] != theirs:
            notes = [*notes, f"accuracy: {MEASURE_LABEL[row['acc_measure']]} (paper: {MEASURE_LABEL[theirs]})"]
        key = tuple(row[k] for k in KEY)
        if key not in chosen or (len(notes), -row["seeds"]) < (len(chosen[key][1]), -chosen[key][0]["seeds"]):
            chosen[key] = (row, notes)
    return chosen


def claim_verdict(claim: Claim, row: dict[str, Any] | None, agree: dict[str, float]) -> str:
    """Within tolerance (`agree_within` points, or the paper's figure inside our 95% t-interval), outside it, within
    noise (a time saving: time_kind), not yet run, or the dataset unavailable here."""
    if row is None:
        return UNAVAILABLE[claim.dataset][0] if claim.dataset in UNAVAILABLE else NOT_RUN
    value = row.get(f"{claim.figure}_mean")
    if value is None:
        return NOT_RUN
    if claim.figure == "own_time_saving_pct":
        kind = time_kind(row, claim.published, agree["saving_points"], claim.figure)
        return {"match": WITHIN, "mismatch": OUTSIDE}.get(kind, NOISE)
    tol = agree["acc_points"] if claim.figure == "acc_delta" else agree["saving_points"]
    return WITHIN if abs(value - claim.published) <= max(tol, row.get(f"{claim.figure}_ci95") or 0) else OUTSIDE


def claim_figure(row: dict[str, Any] | None, claim: Claim) -> str:
    """Our figure: 'mean [lo, hi]' with its 95% interval; stat() under 3 seeds; why it is missing."""
    if row is None:
        return "—"
    name, digits = claim.figure, claim.digits
    mean = row.get(f"{name}_mean")
    if mean is None:
        return f"— ({missing_figure(row, name)})"
    if row.get(f"{name}_lo") is not None:
        lo, hi = row[f"{name}_lo"], row[f"{name}_hi"]
    elif row.get(f"{name}_ci95") is not None:
        lo, hi = mean - row[f"{name}_ci95"], mean + row[f"{name}_ci95"]
    else:
        return stat(row, name, digits, sign=True)
    return f"{mean:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def missing_figure(row: dict[str, Any], name: str) -> str:
    if row.get("acc_delta_mean") is None:
        return "no baseline at this setting"
    if name == "own_time_saving_pct":
        return "no per-epoch times"
    return "not in its runs' metrics"


CLAIM_HEADERS = [
    "study", "dataset", "model", "method", "claim", "ours [95% interval]", "seeds", "device", "paper", "diff",
    "compute saved % (bound)", "setting", "verdict",
]  # fmt: skip


def claim_cells(claim: Claim, found: tuple[dict[str, Any], list[str]] | None, verdict: str) -> list[str]:
    """One row of the claims table (CLAIM_HEADERS); `found`: the row at the paper's setting and its deviations."""
    row, notes = found or (None, [])
    digits, signed = claim.digits, claim.figure == "acc_delta"
    mean = row.get(f"{claim.figure}_mean") if row else None
    compute = stat(row, "compute_saving_pct", 1) if row and claim.figure == "own_time_saving_pct" else ""
    return [
        claim.study, claim.dataset, claim.model, claim.method, claim.what, claim_figure(row, claim),
        str(int(row["seeds"])) if row else "—", (row.get("devices") or "—") if row else "—",
        _fmt(claim.published, digits, signed), _fmt(None if mean is None else mean - claim.published, digits, True),
        compute, ("; ".join(notes) or "paper's") if row else "—", verdict,
    ]  # fmt: skip


def wus_schedule_table(runs: list[Run], published: dict[tuple, float]) -> Table:
    """Per WUS or WUS+LR run at the paper's setting on a network the paper lacks: its share of skip epochs and its
    Eq. 1 reduction, beside the range of Table 3 on the same dataset."""
    table3: dict[str, list[float]] = {}
    for (study, dataset, _, _, metric), value in published.items():
        if study == "wus" and metric == "updated_params_reduction":
            table3.setdefault(dataset, []).append(value)
    networks = {k[:3] for k in published}
    rows = []
    for run in sorted(runs, key=lambda r: (r.dataset, r.model, r.method, r.seed)):
        if run.study != "wus" or run.method == BASELINE or (run.study, run.dataset, run.model) in networks:
            continue
        counted, notes = paper_setting(run)
        skip, normal = run.metrics.get("skip_epochs"), run.metrics.get("normal_epochs")
        if not counted or skip is None or normal is None:
            continue
        theirs = table3.get(run.dataset)
        rows.append([
            run.name, run.device or "—", f"{run.metrics['epochs']:.0f}", f"{skip:.0f}",
            _fmt(100 * skip / (skip + normal) if skip + normal else None, 1),
            _fmt(run.metrics.get("updated_params_reduction_pct"), 1),
            f"{min(theirs):.0f}–{max(theirs):.0f}" if theirs else NOT_IN_PAPER, "; ".join(notes) or "paper's",
        ])  # fmt: skip
    note = (
        "The WUS paper trains none of these networks. Skip epochs: epochs that updated only the last layer's biases; "
        "reduction: Eq. 1, N = E_skip·b + E_normal·(b + w), against a baseline that updates every parameter every "
        "epoch; Table 3: the range of the paper's reductions on the same dataset (its 4 networks, WUS and WUS+LR)."
    )
    if not rows:
        note = f"No WUS or WUS+LR run at the paper's setting on a network the paper lacks yet. {note}"
    headers = ["run", "device", "epochs", "skip epochs", "skip share %", "reduction %", "Table 3 %", "setting"]
    return Table("ledger_wus_schedule", "WUS through its whole schedule, on networks the paper lacks", note, headers,
                 rows)  # fmt: skip


def paper_scale(
    summary: list[dict[str, Any]], runs: list[Run], published: dict[tuple, float], agree: dict[str, float]
) -> tuple[str, list[Table], dict[str, Figure]]:
    """The section "Reproduced at the papers' scale": every published claim against our runs at the paper's setting,
    from the grid or the results ledger, with a verdict and one coverage line; the methods at equal cost at that
    setting (every configuration, not only the papers' networks); WUS on networks the paper lacks; figures of those
    runs. Returns the markdown, its tables (MLflow: tables/ledger.json, ledger_accuracy_vs_cost.json,
    ledger_wus_schedule.json) and its figures (LEDGER_FIGURES)."""
    claims = published_claims(published)
    chosen = paper_scale_rows(summary, runs)
    judged = [(c, chosen.get((c.study, c.dataset, c.model, c.method))) for c in claims]
    verdicts = [claim_verdict(c, found[0] if found else None, agree) for c, found in judged]
    cells = [claim_cells(c, found, v) for (c, found), v in zip(judged, verdicts, strict=True)]
    count = {v: verdicts.count(v) for v in (WITHIN, OUTSIDE, NOISE, NOT_RUN)}
    unavailable = [f"{verdicts.count(label)} {label}" for label, _ in UNAVAILABLE.values() if label in verdicts]
    ran = count[WITHIN] + count[OUTSIDE] + count[NOISE]
    coverage = (
        f"**{ran} of {len(claims)} published claims run, {count[WITHIN]} within tolerance** ({count[NOISE]} within "
        f"noise, {count[OUTSIDE]} outside tolerance, {count[NOT_RUN]} not yet run"
        + "".join(f", {u}" for u in unavailable)
        + ")."
    )
    notes = [
        "Ours: the mean over seeds and its 95% interval (accuracy Δ and reduction: the t-interval over seeds, from 3 "
        "seeds; time saved: the interval of `cheaptrain.timing`, which also sees how epochs scatter within a run); "
        "time saved is the run's against its own full epochs (the saving against its baseline's run, hours apart on "
        "a shared machine, carries that machine's drift: it is in the tables below); "
        "with 2 seeds the standard deviation (sd), with 1 the mean alone. Δ: method minus the baseline of the same "
        "recipe and seed; the paper's: its method minus its baseline. diff: ours minus the paper's.",
        f"Verdict: within tolerance when ours lies within ±{agree['acc_points']:g} points (accuracy Δ) or "
        f"±{agree['saving_points']:g} points (time saved, reduction) of the paper's figure (params "
        "`aggregate.agree_within`) or, for the accuracy Δ and the reduction, the paper's figure lies within our 95% "
        "t-interval. A time saving further from the paper's is within noise, never outside tolerance, when its "
        "interval contains the paper's figure or it is negative for a method that did less work; one above the "
        "compute saved is within noise too. Not yet run: no run at the paper's setting, or none of its baseline.",
        "Compute saved: 100·(1 − training FLOPs / the baseline's), paired by seed: what an ideal implementation "
        "saves, so it bounds the time saving on any hardware; a paper's time saving above it cannot come from the "
        "work the method leaves out alone.",
        *(f"{why}." for _, why in UNAVAILABLE.values()),
        JPEG_NOTE,
    ]
    excluded, first = [], first_runs(runs)
    for row in summary:
        counted, differences = paper_setting(first[row_key(row)])
        if "ledger" in row.get("source", "") and not counted:
            excluded.append(
                f"{row['study']} {row['dataset']}/{row['model']}/{row['method']} ({'; '.join(differences)})"
            )
    if excluded:
        notes.append("Ledger runs not at the paper's setting, not counted: " + ", ".join(excluded) + ".")
    claims_table = Table("ledger", "Every published claim", coverage, CLAIM_HEADERS, cells)
    wus = wus_schedule_table(runs, published)
    at_scale = [row for row, _ in chosen.values()]
    keys = {row_key(row) for row in at_scale}
    at_scale_runs = [run for run in runs if config_key(run) in keys]
    implements = implementation_of(runs)
    cost = replace(
        cost_table(
            at_scale,
            implements,
            agree["cost_points"],
            "own_time_saving_pct",
            seed_accuracies(at_scale, runs),
        ),
        slug="ledger_accuracy_vs_cost",
        title="Accuracy against cost at the papers' setting",
    )
    where = "At the papers' setting"
    figs = {
        "ledger_test_acc.png": curve_figure(
            at_scale_runs, "epoch", "epoch", f"{where}: test accuracy per epoch (mean over seeds, ±1 sd)"
        ),
        "ledger_acc_vs_cost.png": cost_figure(
            at_scale, implements, "own_time_saving_pct", f"{where}: accuracy against cost (95% intervals)"
        ),
        "ledger_wus_phases.png": phases_figure(at_scale_runs, f"{where}: WUS phases (skip epochs shaded)"),
    }
    lines = [
        "## Reproduced at the papers' scale",
        "",
        coverage,
        "",
        "Every figure the papers publish about a method (`data/published_results.csv`: DFP Tables 1 and 2, WUS "
        "Tables 1 to 3), against our runs at the paper's setting: 200 epochs and the study's paper recipe, on any "
        "device, from the grid (`runs/`) or the results ledger (`ledger/`, runs kept in the repository). A setting "
        "of one network in `recipes.<study>.per_model` is a documented deviation: its runs count, and the column "
        "setting names it.",
        "",
        md_table(CLAIM_HEADERS, cells),
        "",
        *(f"- {note}" for note in notes),
        "",
        cost.markdown(),
        wus.markdown(),
        *(f"![{what}](figures/{name})\n" for name, what in LEDGER_FIGURES.items()),
    ]
    return "\n".join(lines), [claims_table, cost, wus], figs


# ---------------------------------------------------------------------------------------------------- equal cost

COST_NOTE = (
    "Each method at each of its budgets (its named configurations, `methods.<name>.method`), paired by seed with "
    "the baseline. A budget holds the configurations whose compute saved lies within {within:g} points of the least "
    "in it (params `aggregate.agree_within.cost_points`): they cost the same. Δ: accuracy minus the baseline's, in "
    "points, ± the 95% t-interval over seeds (3+ seeds; (sd) with 2). Compute saved: 100·(1 − training FLOPs / the "
    "baseline's), exact; time saved: {time}, the robust estimate with its 95% interval (`src/cheaptrain/timing.py`). "
    "The best at a budget has the highest Δ. Its lead over the runner-up is weighed seed by seed where the two share "
    "3 or more seeds (the 95% t-interval of their accuracy differences: a finding when it excludes 0), else by "
    "whether their 95% intervals overlap. The paper's figures stand beside the configuration of the paper's own "
    "method and setting (its name, e.g. `dfp`); the papers publish time saved, not compute."
)


def implementation_of(runs: list[Run]) -> dict[tuple[str, ...], str]:
    """Per configuration (config_key), the registered method its runs trained: a named configuration's run.json
    holds it as config.method_args `method` (as cheaptrain.methods.implementation reads it, without torch)."""
    return {config_key(r): (r.config.get("method_args") or {}).get("method", r.method) for r in runs}


def panel(row: dict[str, Any]) -> tuple[str, ...]:
    """The rows one comparison holds: one study, dataset, model and recipe."""
    return row["study"], row["dataset"], row["model"], row.get("recipe", "")


def cost_points(summary: list[dict[str, Any]], implementations: dict[tuple[str, ...], str]) -> list[dict[str, Any]]:
    """The method rows with a compute saving and an accuracy Δ, each with its `implementation`; by panel, then by
    compute saved."""
    points = [
        row | {"implementation": implementations.get(row_key(row), row["method"])}
        for row in summary
        if row["method"] != BASELINE and None not in (row.get("compute_saving_pct_mean"), row.get("acc_delta_mean"))
    ]
    return sorted(points, key=lambda r: (panel(r), r["compute_saving_pct_mean"], r["method"]))


def budgets(points: list[dict[str, Any]], within: float) -> list[list[dict[str, Any]]]:
    """cost_points grouped by equal cost: within a panel, each point joins the last budget while its compute saved is
    within `within` points of that budget's least."""
    groups: list[list[dict[str, Any]]] = []
    for point in points:
        last = groups[-1][0] if groups else None
        saved = point["compute_saving_pct_mean"]
        if last and panel(last) == panel(point) and saved - last["compute_saving_pct_mean"] <= within:
            groups[-1].append(point)
        else:
            groups.append([point])
    return [sorted(g, key=lambda r: -r["acc_delta_mean"]) for g in groups]  # best first


def budget_label(group: list[dict[str, Any]]) -> str:
    low, high = (f"{f(r['compute_saving_pct_mean'] for r in group):.1f}" for f in (min, max))
    return f"{low}%" if low == high else f"{low}–{high}%"


def acc_interval(row: dict[str, Any]) -> tuple[float, float] | None:
    """The 95% t-interval of the accuracy Δ over seeds; None under 3 seeds."""
    mean, ci = row["acc_delta_mean"], row.get("acc_delta_ci95")
    return None if ci is None else (mean - ci, mean + ci)


def point_text(row: dict[str, Any]) -> str:
    """'dfp_p50 (dfp): Δ -0.40 [-0.60, -0.20] points at 21.3% compute saved'."""
    name = row["method"] if row["method"] == row["implementation"] else f"{row['method']} ({row['implementation']})"
    found = acc_interval(row)
    shown = f"{row['acc_delta_mean']:+.2f}" + (f" [{found[0]:+.2f}, {found[1]:+.2f}]" if found else "")
    return f"{name}: Δ {shown} points at {row['compute_saving_pct_mean']:.1f}% compute saved"


def seed_accuracies(summary: list[dict[str, Any]], runs: list[Run]) -> dict[tuple[str, ...], dict[int, float]]:
    """Per configuration (config_key), each seed's accuracy by its row's measure: two configurations side by side."""
    measures = {row_key(row): row["acc_measure"] for row in summary}
    accuracies: dict[tuple[str, ...], dict[int, float]] = {}
    for run in runs:
        if (key := config_key(run)) in measures:
            accuracies.setdefault(key, {})[run.seed] = run.metrics[measures[key]]
    return accuracies


def paired_lead(
    first: dict[str, Any], second: dict[str, Any], accuracies: dict[tuple[str, ...], dict[int, float]]
) -> str | None:
    """The lead of `first` over `second` seed by seed (their seeds in common, 3 or more) with its 95% t-interval and
    what it says; None with fewer seeds in common."""
    ours, theirs = accuracies.get(row_key(first), {}), accuracies.get(row_key(second), {})
    seeds = sorted(ours.keys() & theirs.keys())
    if len(seeds) < 3:
        return None
    mean, _, ci = describe([ours[s] - theirs[s] for s in seeds])
    assert ci is not None  # 3 or more values
    said = "it excludes 0: a finding"
    if mean + ci < 0:
        said = "the runner-up leads on the seeds they share"
    elif mean - ci <= 0:
        said = "it includes 0: not a finding"
    return (
        f"seed by seed ({len(seeds)} seeds) the lead is {mean:+.2f} [{mean - ci:+.2f}, {mean + ci:+.2f}] points; {said}"
    )


def budget_verdict(
    group: list[dict[str, Any]], accuracies: dict[tuple[str, ...], dict[int, float]] | None = None
) -> str:
    """Which configuration of a budget (best first) keeps the most accuracy, and whether its lead over the runner-up
    is larger than its 95% interval: seed by seed where `accuracies` (seed_accuracies) pairs them, else whether
    their intervals overlap."""
    first = group[0]
    where = f"{first['study'].upper()} {first['dataset']}/{first['model']}, compute saved {budget_label(group)}"
    if len(group) == 1:
        return f"{where}: {point_text(first)}, alone at this cost: nothing to compare with."
    second = group[1]
    lead = f"best {point_text(first)}; {first['acc_delta_mean'] - second['acc_delta_mean']:.2f} points ahead of "
    ours, theirs = acc_interval(first), acc_interval(second)
    if paired := paired_lead(first, second, accuracies or {}):
        verdict = paired
    elif ours is None or theirs is None:
        verdict = "under 3 seeds: no 95% interval to weigh the lead against"
    elif ours[0] > theirs[1]:
        verdict = "the lead is larger than the 95% intervals (they do not overlap)"
    else:
        verdict = "the lead is within the 95% intervals (they overlap): not a finding"
    return f"{where}: {lead}{point_text(second)}; {verdict}."


class TimeSaved(NamedTuple):
    """How a time figure of the cost table and figure is shown."""

    header: str  # the table's column
    axis: str  # the figure's x axis
    against: str  # what it is measured against, for the table's note


TIME_SAVED = {  # the cost table's time figure: against the baseline's run, or against the run's own full epochs
    "time_saving_pct": TimeSaved("time saved % [95%]", "time saved (%, 95% interval)", "against the baseline's run"),
    "own_time_saving_pct": TimeSaved(
        "own time saved % [95%]",
        "time saved vs own full epochs (%, 95% interval)",
        "against the run's own full epochs (runs hours apart on a shared machine carry its drift between them; this "
        "figure does not)",
    ),
}


def cost_columns(time_figure: str) -> list[Column]:
    """The columns of the cost table, its time saving `time_figure` (TIME_SAVED)."""
    return [
        ("dataset", lambda r: r["dataset"]),
        ("model", lambda r: r["model"]),
        ("budget: compute saved", lambda r: r["budget"]),
        ("method", lambda r: r["method"]),
        ("implements", lambda r: r["implementation"]),
        ("seeds", lambda r: str(int(r["seeds"]))),
        ("compute saved %", lambda r: stat(r, "compute_saving_pct", 1)),
        (TIME_SAVED[time_figure].header, lambda r: saving_cell(r, time_figure)),
        ("Δ vs baseline", lambda r: stat(r, "acc_delta", sign=True)),
        ("paper time saved %", lambda r: paper(r, "paper_time_saving_pct")),
        ("paper Δ", lambda r: paper(r, "paper_acc_delta", sign=True)),
    ]


def cost_table(
    summary: list[dict[str, Any]],
    implementations: dict[tuple[str, ...], str],
    within: float,
    time_figure: str = "time_saving_pct",
    accuracies: dict[tuple[str, ...], dict[int, float]] | None = None,
) -> Table:
    """The table "accuracy against cost": every method configuration by budget, best first, and in its note one
    verdict per budget (budget_verdict, seed by seed with `accuracies`); its time saving is `time_figure`
    (TIME_SAVED)."""
    groups = budgets(cost_points(summary, implementations), within)
    columns = cost_columns(time_figure)
    rows = [[f(r | {"budget": budget_label(g)}) for _, f in columns] for g in groups for r in g]
    note = COST_NOTE.format(within=within, time=TIME_SAVED[time_figure].against)
    if groups:
        note += "\n\n" + "\n".join(f"- {budget_verdict(g, accuracies)}" for g in groups)
    else:
        note = f"No method with a compute saving and a paired baseline here yet. {note}"
    return Table("accuracy_vs_cost", "Accuracy against cost", note, [h for h, _ in columns], rows)


# ---------------------------------------------------------------------------------------------------- markdown


def report_markdown(
    summary: list[dict[str, Any]],
    runs: list[Run],
    devices: dict[str, str],
    published: set[tuple[str, str, str]],
    agree: dict[str, float],
    tables: list[Table],
    paper_scale_section: str,
    cost: Table,
) -> str:
    """results/report.md: readable on its own (the papers' scale; then the grid's setup, differences from the papers,
    tables, findings, figures). `summary` and `runs`: the grid's configurations (grid_part)."""
    measures = {r["study"]: r["acc_measure"] for r in summary}
    differences = setting_differences(runs, devices, published, measures)
    lines = [
        "# Results: cheaper CIFAR training, reproduced",
        "",
        f"{len(runs)} runs of the grid, summarised over seeds by the `aggregate` stage, beside the figures the papers "
        "publish (`data/published_results.csv`), and the results ledger's runs at the papers' scale. Regenerate "
        "with `dvc repro`; the numbers are in `results/summary.csv`, the headline figures in `results/metrics.json`; "
        "the regression gate (stage `check`, README) reads the summary and writes `results/check.json`.",
        "",
        paper_scale_section,
    ]
    if not runs:
        lines.append("No runs in the grid (params `grid`): this report holds the ledger's runs alone.")
        return "\n".join(lines) + "\n"
    lines += [
        "## Setup",
        "",
        "| study | paper | datasets | models | methods | seeds | epochs | accuracy measure |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for study, group in itertools.groupby(sorted(runs, key=lambda r: r.study), key=lambda r: r.study):
        group = list(group)
        measure = next(r["acc_measure"] for r in summary if r["study"] == study)
        names = {a: ", ".join(dict.fromkeys(getattr(r, a) for r in group)) for a in ("dataset", "model", "method")}
        lines.append(
            f"| {study} | {PAPERS.get(study, {}).get('title', '—')} | {names['dataset']} | {names['model']} | "
            f"{names['method']} | {len({r.seed for r in group})} | {int(group[0].metrics['epochs'])} | "
            f"{MEASURE_LABEL[measure]} |"
        )
    lines += ["", "### Where this setting differs from the papers'", ""]
    for study, diffs in differences.items():
        lines.append(f"- **{study}**: " + ("; ".join(diffs) if diffs else "the paper's setting") + ".")
    beyond_hardware = any(not d.startswith("trained on") for diffs in differences.values() for d in diffs)
    lines += [
        "",
        "**This is not the papers' setting** (above): differences from the published figures are expected; they say "
        "how far this run is from the paper, not whether the paper holds."
        if beyond_hardware
        else "The papers' recipes and models; only the hardware differs, so compare savings in percent.",
    ]
    lines += ["", "## The papers' tables, with ours", ""]
    lines += [t.markdown() for t in tables]
    lines += ["## Accuracy against cost", "", cost.markdown()]
    lines += [
        "## What matches the papers and what does not",
        "",
        f"A figure matches when it lies within ±{agree['acc_points']:g} points (accuracy Δ) or "
        f"±{agree['saving_points']:g} points (savings) of the paper's, or within our 95% interval when that is "
        "wider (params `aggregate.agree_within`). A time saving is within noise, neither a finding nor a mismatch, "
        "when its 95% interval contains the figure it is compared with (0, or the paper's when ours lies further "
        "than the tolerance from it), or when it is negative for a method that did less work. The compute saved is "
        "what an ideal implementation saves on any hardware: the bound for the time saved; a time saving well above "
        "it is noise, not a finding.",
        "",
    ]
    lines += [f"- {line}" for line in findings(summary, agree)]
    if all(r["method"] == BASELINE for r in summary):
        lines.append("- Only baselines in this grid: no method to compare with the papers yet.")
    lines += ["", "## Figures", ""]
    titles = {
        "test_acc.png": "Test accuracy per epoch",
        "acc_vs_time.png": "Test accuracy against cumulative training time",
        "pruned_samples.png": "Samples pruned per epoch (DFP, its random control, InfoBatch)",
        "wus_phases.png": "WUS phases over epochs",
        "time_saving.png": "Compute and time saved per method (95% intervals), beside the paper's",
        "acc_vs_cost.png": "Accuracy Δ against compute and time saved, each method across its budgets",
    }
    lines += [f"![{titles[f]}](figures/{f})\n" for f in FIGURES]
    lines += [
        "## Runs",
        "",
        "| study | run | final acc % | best-3 acc % | train time s | MLflow run | from |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (r.study, r.name)):
        lines.append(
            f"| {r.study} | {r.name} | {r.metrics['final_acc']:.2f} | {r.metrics['best3_acc']:.2f} | "
            f"{r.metrics['train_time_s']:.1f} | `{r.mlflow_run_id or '—'}` | {r.source}/ |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- curves, figures


def configurations(runs: list[Run]) -> dict[tuple[str, str, str, str], list[Run]]:
    """Runs per (study, dataset, model, method), baseline first in each panel, seeds in order."""
    order = sorted(runs, key=lambda r: (r.study, r.dataset, r.model, r.method != BASELINE, r.method, r.seed))
    return {k: list(g) for k, g in itertools.groupby(order, key=lambda r: (r.study, r.dataset, r.model, r.method))}


def mean_curve(group: list[Run]) -> list[dict[str, float]]:
    """Per epoch, the mean over seeds of every history column all the runs have, plus cum_train_s."""
    epochs = min(len(r.history) for r in group)
    columns = [c for c in group[0].history[0] if all(c in r.history[0] for r in group)]
    curve = []
    for i in range(epochs):
        row = {c: statistics.fmean(r.history[i][c] for r in group if c in r.history[i]) for c in columns}
        row["cum_train_s"] = statistics.fmean(sum(h["epoch_train_s"] for h in r.history[: i + 1]) for r in group)
        curve.append(row)
    return curve


def curves_csv(group: list[Run]) -> str:
    curve = mean_curve(group)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(curve[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: round(v, 4) for k, v in row.items()} for row in curve)
    return out.getvalue()


def _panels(n: int, title: str, width: float = 5.2, height: float = 3.8, cols: int = 0) -> tuple[Figure, list]:
    """A figure of n panels, at most 3 a row (2 for 4), with a title; unused panels hidden."""
    n = max(n, 1)
    cols = cols or (2 if n == 4 else min(3, n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=13)
    return fig, axes


def _empty(title: str, text: str) -> Figure:
    fig, (ax,) = _panels(1, title, 6.5, 2.6)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, color="0.3")
    ax.set_axis_off()
    return fig


def _color(method: str) -> str:
    return COLORS.get(method, f"C{5 + sum(map(ord, method)) % 5}")


def curve_figure(runs: list[Run], x: str, xlabel: str, title: str) -> Figure:
    """Test accuracy (mean over seeds, ±1 sd band) against `x`, one panel per study, dataset and model."""
    if not runs:
        return _empty(title, "No runs here yet: no curve to show.")
    configs = configurations(runs)
    panels = sorted({k[:3] for k in configs})
    fig, axes = _panels(len(panels), title)
    for ax, panel in zip(axes, panels, strict=False):
        for key, group in configs.items():
            if key[:3] != panel:
                continue
            curve = mean_curve(group)
            xs = [row[x] for row in curve]
            acc = [row["test_acc"] for row in curve]
            label = f"{key[3]} ({len(group)} seed{'s' * (len(group) > 1)})"
            implements = implementation_of(group)[config_key(group[0])]  # a named configuration: its method's color
            style = {"color": _color(implements), "ls": "-" if implements == key[3] else "--"}
            ax.plot(xs, acc, label=label, lw=1.8, marker="o" if len(xs) <= 20 else None, ms=3, **style)
            if len(group) > 1:
                sd = [statistics.stdev(r.history[i]["test_acc"] for r in group) for i in range(len(curve))]
                ax.fill_between(
                    xs,
                    [a - s for a, s in zip(acc, sd, strict=True)],
                    [a + s for a, s in zip(acc, sd, strict=True)],
                    color=style["color"],
                    alpha=0.15,
                )
        ax.set(title=f"{panel[0]} study · {panel[1]} · {panel[2]}", xlabel=xlabel, ylabel="test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower right")
    return fig


def pruned_figure(runs: list[Run]) -> Figure:
    title = "Samples pruned per epoch (mean over seeds)"
    configs = {k: g for k, g in configurations(runs).items() if all("pruned_samples" in r.history[0] for r in g)}
    if not configs:
        return _empty(title, "No pruning method (dfp, random_prune, infobatch) in this grid yet: nothing to show.")
    panels = sorted({k[:3] for k in configs})
    fig, axes = _panels(len(panels), title)
    for ax, panel in zip(axes, panels, strict=False):
        for key, group in configs.items():
            if key[:3] == panel:
                curve = mean_curve(group)
                total = statistics.fmean(sum(h["pruned_samples"] for h in r.history) for r in group)
                ax.step(
                    [r["epoch"] for r in curve],
                    [r["pruned_samples"] for r in curve],
                    where="mid",
                    color=_color(key[3]),
                    label=f"{key[3]} ({total:,.0f} in all)",
                    lw=1.6,
                )
        ax.set(title=f"{panel[0]} study · {panel[1]} · {panel[2]}", xlabel="epoch", ylabel="samples left out")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    return fig


def phases_figure(
    runs: list[Run], title: str = "WUS phases: skip epochs (shaded) update only the last layer's bias"
) -> Figure:
    """Per WUS run (first seed): test accuracy with the skip epochs shaded, the baseline's and the lr drops."""
    configs = {k: g for k, g in configurations(runs).items() if all("phase" in r.history[0] for r in g)}
    if not configs:
        return _empty(title, "No wus or wus_lr runs here yet: no phases to show.")
    baselines = {(r.study, r.dataset, r.model, r.seed): r for r in runs if r.method == BASELINE}
    fig, axes = _panels(len(configs), title)
    for ax, (key, group) in zip(axes, configs.items(), strict=False):
        run = group[0]
        epochs = [h["epoch"] for h in run.history]
        skip = [h["epoch"] for h in run.history if h["phase"] >= 0.5]
        for i, e in enumerate(skip):
            ax.axvspan(e - 0.5, e + 0.5, color=_color(key[3]), alpha=0.15, lw=0, label="skip epoch" if i == 0 else None)
        drops = [h["epoch"] - 0.5 for prev, h in itertools.pairwise(run.history) if h["lr"] != prev["lr"]]
        for i, e in enumerate(drops):
            ax.axvline(e, color="0.4", ls=":", lw=1.2, label="lr change" if i == 0 else None)
        if base := baselines.get((run.study, run.dataset, run.model, run.seed)):
            ax.plot(
                [h["epoch"] for h in base.history],
                [h["test_acc"] for h in base.history],
                color=_color(BASELINE),
                ls="--",
                lw=1.4,
                label="baseline",
            )
        ax.plot(
            epochs,
            [h["test_acc"] for h in run.history],
            color=_color(key[3]),
            lw=1.8,
            label=key[3],
            marker="o" if len(epochs) <= 20 else None,
            ms=3,
        )
        ax.set(
            title=f"{key[3]} · {key[1]} · {key[2]} · s{run.seed}: {len(skip)} skip epochs of {len(epochs)}",
            xlabel="epoch",
            ylabel="test accuracy (%)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower right")
    return fig


def saving_figure(summary: list[dict[str, Any]]) -> Figure:
    """Per method and configuration: compute saved, time saved against the baseline and against the run's own full
    epochs (95% intervals; 'noise' where within noise of 0), and the paper's time saved (hatched)."""
    title = "Saved against the baseline (same recipe, paired by seed)"
    rows = [r for r in summary if r["method"] != BASELINE and r.get("time_saving_pct_mean") is not None]
    if not rows:
        return _empty(title, "Only baselines in this grid: no method has a saving to show yet.")
    studies = list(dict.fromkeys(r["study"] for r in rows))
    most = max(sum(r["study"] == s for r in rows) for s in studies)
    fig, axes = _panels(len(studies), title, width=max(6.5, 1.8 * most), height=4.4, cols=1)
    bars = (  # (column, offset, label, style)
        ("compute_saving_pct", -0.3, "compute saved (exact: the bound)", {"alpha": 0.45}),
        ("time_saving_pct", -0.1, "time saved (95% interval)", {}),
        ("own_time_saving_pct", 0.1, "time saved vs own full epochs (95% interval)", {"hatch": "..", "alpha": 0.7}),
    )
    for ax, study in zip(axes, studies, strict=False):
        shown = [r for r in rows if r["study"] == study]
        xs = range(len(shown))
        for name, offset, label, style in bars:
            drawn = [(x, r) for x, r in zip(xs, shown, strict=True) if r.get(f"{name}_mean") is not None]
            if not drawn:
                continue
            means = [r[f"{name}_mean"] for _, r in drawn]
            err = None
            if all(f"{name}_lo" in r for _, r in drawn):  # the compute saved is exact: no bar
                err = [[m - r[f"{name}_lo"] for m, (_, r) in zip(means, drawn, strict=True)],
                       [r[f"{name}_hi"] - m for m, (_, r) in zip(means, drawn, strict=True)]]  # fmt: skip
            colors = [_color(r["method"]) for _, r in drawn]
            ax.bar([x + offset for x, _ in drawn], means, 0.2, yerr=err, capsize=3, color=colors, label=label, **style)
            for x, r in drawn:
                if within_noise(r, name, 0.0):
                    top = max(r.get(f"{name}_hi", 0.0), r[f"{name}_mean"], 0.0)
                    ax.text(x + offset, top, "noise", rotation=90, ha="center", va="bottom", fontsize=8)
        theirs = [r.get("paper_time_saving_pct") for r in shown]
        if any(t is not None for t in theirs):
            ax.bar(
                [x + 0.3 for x, t in zip(xs, theirs, strict=True) if t is not None],
                [t for t in theirs if t is not None],
                0.2,
                color="white",
                edgecolor="0.3",
                hatch="//",
                label="paper's time saved",
            )
        for x, t in zip(xs, theirs, strict=True):
            if t is None:
                ax.text(x + 0.3, 0, NOT_IN_PAPER, rotation=90, ha="center", va="bottom", fontsize=8, color="0.4")
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(list(xs), [f"{r['dataset']}\n{r['model']}\n{r['method']}" for r in shown], fontsize=9)
        ax.set_xlim(-0.7, len(shown) - 0.3)
        ax.set(title=f"{study} study", ylabel="saved (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def cost_figure(
    summary: list[dict[str, Any]],
    implementations: dict[tuple[str, ...], str],
    time_figure: str = "time_saving_pct",
    title: str = "Accuracy against cost: each method across its budgets, against the baseline (95% intervals)",
) -> Figure:
    """Per study, dataset and model: accuracy Δ (95% t-interval over seeds) against compute saved (left) and time
    saved (right, `time_figure` of TIME_SAVED, with its 95% interval), one line per method through its budgets; the
    papers' points (stars) beside the time saved, the only cost they publish."""
    points = cost_points(summary, implementations)
    if not points:
        return _empty(title, "No method with a compute saving and a paired baseline here yet.")
    panels = list(dict.fromkeys(panel(p) for p in points))
    fig, axes = _panels(2 * len(panels), title, cols=2)
    axes_x = (("compute_saving_pct", "compute saved (%, exact)"), (time_figure, TIME_SAVED[time_figure].axis))
    for i, key in enumerate(panels):
        shown = [p for p in points if panel(p) == key]
        for ax, (x, xlabel) in zip(axes[2 * i : 2 * i + 2], axes_x, strict=True):
            ax.axhline(0, color="0.2", lw=0.8)
            ax.plot([0], [0], marker="s", color=_color(BASELINE), ls="none", label=BASELINE)
            for name in dict.fromkeys(p["implementation"] for p in shown):
                line = sorted((p for p in shown if p["implementation"] == name and p.get(f"{x}_mean") is not None),
                              key=lambda p: p[f"{x}_mean"])  # fmt: skip
                if not line:
                    continue
                xs, ys = [p[f"{x}_mean"] for p in line], [p["acc_delta_mean"] for p in line]
                yerr = [p.get("acc_delta_ci95") or 0.0 for p in line]
                xerr = None
                if all(p.get(f"{x}_lo") is not None for p in line):
                    xerr = [
                        [p[f"{x}_mean"] - p[f"{x}_lo"] for p in line],
                        [p[f"{x}_hi"] - p[f"{x}_mean"] for p in line],
                    ]
                ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, color=_color(name), marker="o", capsize=3, lw=1.6, label=name)
                for p, px, py in zip(line, xs, ys, strict=True):
                    ax.annotate(p["method"], (px, py), textcoords="offset points", xytext=(4, 4), fontsize=7)
            published = [p for p in shown if None not in (p.get("paper_time_saving_pct"), p.get("paper_acc_delta"))]
            for p in published if x == time_figure else []:
                ax.plot(p["paper_time_saving_pct"], p["paper_acc_delta"], marker="*", ms=13, mfc="white", ls="none",
                        mec=_color(p["implementation"]), label=f"paper: {p['method']}")  # fmt: skip
            ax.set(title=f"{key[0]} study · {key[1]} · {key[2]}", xlabel=xlabel, ylabel="accuracy Δ (points)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return fig


def figures(summary: list[dict[str, Any]], runs: list[Run]) -> dict[str, Figure]:
    return {
        "test_acc.png": curve_figure(runs, "epoch", "epoch", "Test accuracy per epoch (mean over seeds, band: ±1 sd)"),
        "acc_vs_time.png": curve_figure(
            runs, "cum_train_s", "cumulative training time (s, this machine)", "Test accuracy against training time"
        ),
        "pruned_samples.png": pruned_figure(runs),
        "wus_phases.png": phases_figure(runs),
        "time_saving.png": saving_figure(summary),
        "acc_vs_cost.png": cost_figure(summary, implementation_of(runs)),
    }


def png(fig: Figure) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()


# ---------------------------------------------------------------------------------------------------- MLflow


def run_devices(runs: list[Run]) -> dict[str, str]:
    """For runs whose run.json names no device (older runs): the `device` tag of their MLflow run."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from cheaptrain.tracking import tracking_uri

    client, devices = MlflowClient(tracking_uri()), {}
    for run in (r for r in runs if not r.device):
        try:
            devices[run.mlflow_run_id] = client.get_run(run.mlflow_run_id).data.tags.get("device", "")
        except MlflowException:
            continue
    return devices


def log_to_mlflow(
    summary: list[dict[str, Any]],
    runs: list[Run],
    tables: list[Table],
    figs: dict[str, Figure],
    metrics: dict[str, Any],
    files: list[Path],
) -> str:
    """One MLflow run in the experiment `aggregate`: the tables, the figures, the outputs, links to the runs."""
    import mlflow

    from cheaptrain.tracking import ensure_experiment, flatten, git_commit, tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = ensure_experiment(MLFLOW_EXPERIMENT)
    tags = {
        "git_commit": git_commit(),
        "mlflow.source.git.commit": git_commit(),
        "dvc_stage": os.environ.get("DVC_STAGE", ""),
        "dvc_exp": os.environ.get("DVC_EXP_NAME", ""),
        "runs": str(len(runs)),
        "studies": ",".join(sorted({r.study for r in runs})),
    }
    name = f"aggregate-{tags['dvc_exp']}" if tags["dvc_exp"] else "aggregate"
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, tags=tags) as active:
        mlflow.log_metrics({k.replace(".", "/"): v for k, v in flatten(metrics).items()})
        columns = list(dict.fromkeys(k for row in summary for k in row))
        mlflow.log_table({c: [row.get(c) for row in summary] for c in columns}, "tables/summary.json")
        for table in tables:
            mlflow.log_table(table.columns(), f"tables/{table.slug}.json")
        mlflow.log_table(
            {
                "study": [r.study for r in runs],
                "run": [r.name for r in runs],
                "mlflow_run_id": [r.mlflow_run_id for r in runs],
                "source": [r.source for r in runs],
                "device": [r.device for r in runs],
                "final_acc": [r.metrics["final_acc"] for r in runs],
                "best3_acc": [r.metrics["best3_acc"] for r in runs],
                "train_time_s": [r.metrics["train_time_s"] for r in runs],
            },
            "tables/runs.json",
        )
        for file_name, fig in figs.items():
            mlflow.log_figure(fig, f"figures/{file_name}")
        for path in files:
            mlflow.log_artifact(str(path))
        return active.info.run_id


# ---------------------------------------------------------------------------------------------------- the stage


def agreement(params: dict[str, Any]) -> dict[str, float]:
    """Params `aggregate.agree_within`: how close to the paper's figure counts as matching, in points."""
    given = (params.get("aggregate") or {}).get("agree_within") or {}
    agree = {"acc_points": 0.5, "saving_points": 3.0, "cost_points": 3.0}  # cost: a budget's width
    unknown = [k for k in given if k not in agree]
    bad = [k for k, v in given.items() if k in agree and not (isinstance(v, int | float) and v >= 0)]
    if unknown or bad:
        raise UserError(
            f"aggregate.agree_within: {', '.join(unknown + bad)} not accepted; accepted: "
            f"{', '.join(agree)}, each a number >= 0 (points)"
        )
    return agree | {k: float(v) for k, v in given.items()}


def grid_part(summary: list[dict[str, Any]], runs: list[Run]) -> tuple[list[dict[str, Any]], list[Run]]:
    """The grid's configurations (with any seeds of theirs from the ledger): their rows and runs."""
    rows = [row for row in summary if row.get("source") != "ledger"]
    keys = {row_key(row) for row in rows}
    return rows, [run for run in runs if config_key(run) in keys]


def write_results(
    params: dict[str, Any], runs_root: Path, published_path: Path, out: Path, ledger_dir: Path | None = None
) -> tuple[list, str]:
    """The aggregate stage: read the grid's runs and the results ledger (`ledger_dir`, default: the project's), write
    every output under `out` (each atomically), log the MLflow run. Returns the summary and the MLflow run id."""

    measures, agree = accuracy_measures(params), agreement(params)
    ledger_dir = ledger_dir or ledger_root()
    all_runs = with_ledger(collect(params, runs_root), ledger_runs(ledger_dir))
    if not all_runs:
        raise UserError(f"nothing to aggregate: the grid in params.yaml trains no runs and {ledger_dir} has no entries")
    published = load_published(published_path)
    summary = add_published(summarize(all_runs, measures), published)
    rows, runs = grid_part(summary, all_runs)
    tables = paper_tables(rows)
    scale, scale_tables, scale_figures = paper_scale(summary, all_runs, published, agree)
    cost = cost_table(rows, implementation_of(runs), agree["cost_points"], accuracies=seed_accuracies(rows, runs))
    report = report_markdown(rows, runs, run_devices(runs), {k[:3] for k in published}, agree, tables, scale, cost)
    figs = figures(rows, runs) | scale_figures
    metrics = headline(summary)
    files: dict[str, str | bytes] = {
        "summary.csv": summary_csv(summary),
        "report.md": report,
        "metrics.json": json.dumps(metrics, indent=2) + "\n",
    }
    files |= {f"figures/{name}": png(fig) for name, fig in figs.items()}
    files |= {f"curves/{'-'.join(key)}.csv": curves_csv(group) for key, group in configurations(runs).items()}
    for stale in (out / "curves").glob("*.csv"):  # configurations no longer in the grid
        if f"curves/{stale.name}" not in files:
            stale.unlink()
    for name, data in files.items():
        atomic_write(out / name, data)
    run_id = log_to_mlflow(
        summary,
        runs,
        [*tables, cost, *scale_tables],
        figs,
        metrics,
        [out / f for f in ("summary.csv", "report.md", "metrics.json")],
    )
    return summary, run_id
