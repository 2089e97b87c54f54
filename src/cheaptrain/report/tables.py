"""The papers' tables (DFP 1-2, WUS 1-3) with our figures beside theirs, and the findings: per configuration, what
matches the paper and what does not, time savings weighed against their noise (the docstring of cheaptrain.report)."""

from __future__ import annotations

import itertools
from typing import Any

from cheaptrain.aggregate import BASELINE, KEY, PAPER_MEASURE, Run
from cheaptrain.papers import PAPERS
from cheaptrain.report.cells import (
    CHEAP_EPOCH_NOTE,
    MEASURE_LABEL,
    MEASURE_SHORT,
    NOT_IN_PAPER,
    Column,
    Table,
    cheap_epoch_cell,
    fmt,
    missing_figure,
    paired_note,
    paper,
    saving_cell,
    seed_count,
    stat,
    within_noise,
)
from cheaptrain.report.equal_cost import paired_difference

ID: list[Column] = [
    ("dataset", lambda r: r["dataset"]),
    ("model", lambda r: r["model"]),
    ("method", lambda r: r["method"]),
    ("seeds", seed_count),
]
TIME_NOTE = (
    "Times in seconds are this machine's, the paper's come from other hardware and 200 epochs: compare the savings, "
    "not the seconds. Train time: the sum of the epochs; 1st epoch: epoch 1 alone (one-off costs); full epoch: the "
    "median of the later epochs that train everything, each at the run's typical machine speed (below). Compute "
    "saved = 100·(1 − training FLOPs / the baseline's), paired by seed: what an ideal implementation saves on any "
    "hardware, the bound for the time saved. Time saved = 100·(1 − robust time / the baseline's), paired by seed "
    "where both runs trained on one machine (the same device and CPU threads; else: other machine, the findings say "
    "which seed), the run's put at the baseline's typical speed; own time saved: against the run's own full epochs. "
    "The robust time puts each epoch at the run's typical machine speed, read from its evaluation passes (the same "
    "work every epoch), and weighs each kind of epoch by its median seconds per unit of work, so neither drift nor a "
    "few slow epochs move it (`src/cheaptrain/timing.py`); [lo, hi] is the 95% interval; within noise: the interval "
    "contains 0, or (time saved) the method lost time while doing less work. " + CHEAP_EPOCH_NOTE + " "
)


def accuracy_columns(measure: str) -> list[Column]:
    return [
        (MEASURE_SHORT[measure], lambda r: stat(r, "acc")),
        ("paper %", lambda r: paper(r, "paper_acc")),
        ("acc diff", lambda r: fmt(r.get("acc_vs_paper"), sign=True)),
        ("Δ vs baseline", lambda r: stat(r, "acc_delta", sign=True)),
        ("paper Δ", lambda r: paper(r, "paper_acc_delta", sign=True)),
        ("Δ diff", lambda r: fmt(r.get("acc_delta_vs_paper"), sign=True)),
    ]


def time_columns(with_pruning: bool) -> list[Column]:
    columns: list[Column] = [
        ("train time s", lambda r: stat(r, "train_time_s", 1)),
        ("1st epoch s", lambda r: stat(r, "first_epoch_s", 2)),
        ("full epoch s", lambda r: stat(r, "full_epoch_s", 2)),
        ("cheaper epoch: time / work", cheap_epoch_cell),
        ("paper s", lambda r: paper(r, "paper_train_time_s", 0)),
    ]
    if with_pruning:
        columns += [
            ("overhead s", lambda r: fmt(r.get("overhead_s_mean"), 1)),
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
    text = fmt(row.get("time_saving_vs_paper"), 1, sign=True)
    published = row.get("paper_time_saving_pct")
    noisy = published is not None and within_noise(row, "time_saving_pct", published)
    return f"{text} within noise" if noisy else text


ACC_NOTE = (
    "Accuracy in %, mean over seeds; ± is the 95% t-interval over seeds (3+ seeds), (sd) the standard deviation (2 "
    "seeds). Δ: method minus the baseline of the same recipe and seed, in points; diff: ours minus the paper's."
)
PRUNING_NOTE = "Planned saving: the sample-passes the pruning schedule leaves out; samples saved: the measured ones."
PARAMS_COLUMNS: list[Column] = [
    ("skip epochs", lambda r: fmt(r.get("skip_epochs_mean"), 1)),
    ("normal epochs", lambda r: fmt(r.get("normal_epochs_mean"), 1)),
    ("reduction %", lambda r: stat(r, "updated_params_reduction_pct", 1)),
    ("paper %", lambda r: paper(r, "paper_updated_params_reduction_pct", 0)),
    ("diff", lambda r: fmt(r.get("updated_params_reduction_vs_paper"), 1, sign=True)),
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


def findings(
    summary: list[dict[str, Any]],
    agree: dict[str, float],
    accuracies: dict[tuple[str, ...], dict[int, float]] | None = None,
) -> list[str]:
    """What matches the papers and what does not, one line per configuration, plus DFP against its random control:
    seed by seed where `accuracies` (seed_accuracies) pairs 3 or more seeds of both, else the difference of means."""
    lines = []
    rows = {tuple(r[k] for k in KEY): r for r in summary}
    for row in summary:
        where = f"{row['study'].upper()} {row['dataset']}/{row['model']}/{row['method']}"
        if row.get("acc_mean") is None:  # every seed ended at chance: the row has no figure
            lines.append(f"{where}: {missing_figure(row, 'acc')}.")
            continue
        if row["method"] == BASELINE:
            if row.get("paper_acc") is not None:
                lines.append(
                    f"{where}: {stat(row, 'acc')}% against the paper's {row['paper_acc']:.2f}% "
                    f"({row['acc_vs_paper']:+.2f} points)."
                )
            else:
                lines.append(f"{where}: {stat(row, 'acc')}%; this configuration is {NOT_IN_PAPER}.")
            continue
        delta = compare(row, "acc_delta", "paper_acc_delta", "accuracy Δ", agree["acc_points"], " points")
        parts = [delta or f"no accuracy Δ ({missing_figure(row, 'acc_delta')})"]
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
            gain = f"{dfp['acc_delta_mean'] - row['acc_delta_mean']:+.2f} points of accuracy"
            if paired := paired_difference(dfp, row, accuracies or {}):
                if paired.excludes_zero(widened=True):  # equal_cost.Paired: read at every seed count from 3
                    said = "a finding"
                elif paired.excludes_zero():
                    said = f"within noise once {paired.looks_text()}"
                else:
                    said = "within noise"
                gain = f"{paired.interval_text()} points of accuracy seed by seed (DFP {paired.seeds_text()}: {said})"
            both = "compute_saving_pct_mean" in dfp and "compute_saving_pct_mean" in row  # else runs without FLOPs
            name, what = ("compute_saving_pct", "compute") if both else ("sample_saving_pct", "samples")
            parts.append(
                f"DFP's selection against this random control: {gain} at "
                f"{fmt(dfp.get(f'{name}_mean'), 1)}% vs {fmt(row.get(f'{name}_mean'), 1)}% {what} saved"
            )
        lines.append(f"{where}: {'; '.join(parts)}.")
    return lines


def compare(row: dict[str, Any], ours: str, theirs: str, what: str, tol: float, unit: str) -> str | None:
    """Our figure against the paper's: a match within `tol` points or within our 95% t-interval when that is wider."""
    value, published = row.get(f"{ours}_mean"), row.get(theirs)
    if value is None:
        return None
    shown = f"{what} {value:+.2f}{unit}{paired_note(row, ours)}"
    if published is None:
        return f"{shown} ({NOT_IN_PAPER})"
    margin = max(tol, row.get(f"{ours}_ci95") or 0)
    gap = value - published
    verdict = "matches" if abs(gap) <= margin else f"does NOT match ({gap:+.2f}, beyond ±{margin:.2f})"
    return f"{shown} vs the paper's {published:+.2f}{unit}: {verdict}"


def time_findings(row: dict[str, Any], tol: float) -> list[str]:
    """Compute saved, time saved against the baseline (beside the paper's figure) and against the run's own full
    epochs, each time with its 95% interval and marked within noise where it is (the docstring of cheaptrain.report)."""
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
        elif above_bound(row, "time_saving_pct", tol):
            parts.append(f"{shown}: {ABOVE_BOUND.format(compute)} ({NOT_IN_PAPER})")
        elif within_noise(row, "time_saving_pct", 0.0):
            parts.append(f"{shown}: within noise ({NOT_IN_PAPER})")
        else:
            parts.append(f"{shown} ({NOT_IN_PAPER})")
    elif row.get("time_unpaired"):
        parts.append(f"time saved not compared with the baseline's ({row['time_unpaired']})")
    if row.get("own_time_saving_pct_mean") is not None:
        shown = f"time saved vs its own full epochs {signed_interval(row, 'own_time_saving_pct')}"
        if above_bound(row, "own_time_saving_pct", tol):
            parts.append(f"{shown}: {ABOVE_BOUND.format(compute)}")
        elif within_noise(row, "own_time_saving_pct", 0.0):
            parts.append(f"{shown}: within noise")
        else:
            parts.append(shown)
    if row.get("cheap_time_share_mean") is not None and row.get("cheap_work_share_mean") is not None:
        parts.append(
            f"a cheaper epoch takes {row['cheap_time_share_mean']:.2f} of a full epoch's time for "
            f"{row['cheap_work_share_mean']:.2f} of its work"
        )
    return parts


def signed_interval(row: dict[str, Any], name: str) -> str:
    """'+m% [+lo, +hi]', or '+m%' without an interval."""
    text = f"{row[f'{name}_mean']:+.2f}%"
    if row.get(f"{name}_lo") is not None:
        text += f" [{row[f'{name}_lo']:+.2f}, {row[f'{name}_hi']:+.2f}]"
    return text + paired_note(row, name)


ABOVE_BOUND = "above the compute saved ({:.2f}%), its bound: noise, not a finding"


def above_bound(row: dict[str, Any], name: str, tol: float) -> bool:
    """Whether the time saving `name` lies, its whole interval, more than `tol` points above the compute saved: the
    work the method leaves out cannot save that much, so the machine's speed moved (cheaptrain.report)."""
    compute, lo = row.get("compute_saving_pct_mean"), row.get(f"{name}_lo")
    return compute is not None and (row[f"{name}_mean"] if lo is None else lo) > compute + tol


def time_kind(row: dict[str, Any], published: float, tol: float, name: str = "time_saving_pct") -> str:
    """Our time saved (`name`) against the paper's: 'above bound' (above the compute saved, its bound: noise),
    'match' (within `tol` points), 'noise' (else within noise: cheaptrain.report) or 'mismatch'."""
    value = row[f"{name}_mean"]
    if above_bound(row, name, tol):
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
        return ABOVE_BOUND.format(compute)
    if kind == "match":
        return "matches"
    gap = row["time_saving_pct_mean"] - published
    verdict = f"does NOT match ({gap:+.2f}, beyond ±{tol:.2f} and outside our interval)"
    if compute is not None and published > compute + tol:
        verdict += f"; the paper's figure is above this setting's compute saved ({compute:.2f}%), the bound"
    return verdict
