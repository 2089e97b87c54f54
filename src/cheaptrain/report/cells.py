"""A summary figure as a table cell ('mean ± ci95', the paper's figure, a saving within noise), and the Table that
every section of the report builds (markdown in report.md, a JSON table in MLflow)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cheaptrain.aggregate import BASELINE

MEASURE_LABEL = {"best3_acc": "mean of the best three test accuracies", "final_acc": "final-epoch test accuracy"}
MEASURE_SHORT = {"best3_acc": "best-3 acc %", "final_acc": "final acc %"}
NOT_IN_PAPER = "not in the paper"


def fmt(value: float | None, digits: int = 2, sign: bool = False) -> str:
    """A number with `digits` decimals (and its sign), '—' where there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def stat(row: dict[str, Any], name: str, digits: int = 2, sign: bool = False, note: bool = True) -> str:
    """'mean ± ci95' with 3+ seeds, 'mean (sd x)' with 2, 'mean' with 1, '—' when the figure does not apply; a
    paired figure over fewer seeds than its row's says over how many (paired_note) unless `note` is False."""
    mean = row.get(f"{name}_mean")
    if mean is None:
        return "—"
    text = fmt(mean, digits, sign)
    if row.get(f"{name}_ci95") is not None:
        text = f"{text} ± {row[f'{name}_ci95']:.{digits}f}"
    elif row.get(f"{name}_std") is not None:
        text = f"{text} (sd {row[f'{name}_std']:.{digits}f})"
    return text + paired_note(row, name) if note else text


PAIRED = ("acc_delta", "sample_saving_pct", "compute_saving_pct", "time_saving_pct")  # method run minus its baseline's


def paired_seeds(row: dict[str, Any], name: str) -> int:
    """How many seeds the figure `name` is over: a paired one, those whose baseline has run (and learned); any other,
    all."""
    return int(row.get("paired_seeds", row["seeds"])) if name in PAIRED else int(row["seeds"])


def paired_note(row: dict[str, Any], name: str) -> str:
    """' (2 of 3 seeds)' where the paired figure `name` is over fewer seeds than its row (some baselines still to
    run, or ended at chance); '' otherwise."""
    over, seeds = paired_seeds(row, name), int(row["seeds"])
    return f" ({over} of {seeds} seeds)" if over < seeds else ""


def seed_count(row: dict[str, Any], shown: str | None = None) -> str:
    """A seeds cell: `shown` (else the row's seed count), and the seeds that ended at chance, which no figure counts:
    '3 (+ seed 2 at chance)', so that a method that collapses on some seeds says so where it is compared. Where
    every seed did, its figures say so (missing_figure)."""
    text = str(int(row["seeds"])) if shown is None else shown
    failed = seeds_text(row.get("collapsed_seeds"))
    return f"{text} (+ {failed} at chance)" if failed and int(row["seeds"]) else text


def seeds_text(seeds: str | None) -> str:
    """'seed 3' or 'seeds 0, 1' from a summary's space-separated seeds; '' for none."""
    listed = str(seeds or "").split()
    return f"seed{'s' * (len(listed) > 1)} {', '.join(listed)}" if listed else ""


def missing_figure(row: dict[str, Any], name: str) -> str:
    """Why a row lacks the figure `name`: its own seeds all ended at chance; for a figure against the baseline
    (PAIRED), no baseline of its seeds yet, one that ended at chance, or a pair trained on different machines; else
    what its runs did not record. The report and the gate (cheaptrain.check) both give it."""
    if not row.get("seeds") and (own := seeds_text(row.get("collapsed_seeds"))):
        return f"its {own} ended at chance" if own.startswith("seed ") else f"its {own} all ended at chance"
    if name in PAIRED and row.get("acc_delta_mean") is None:
        if failed := seeds_text(row.get("baseline_collapsed_seeds")):
            return f"the baseline of {failed} ended at chance"
        if waiting := seeds_text(row.get("unpaired_seeds")):
            return f"no baseline of {waiting} yet"
        return "no baseline at this setting"
    if name == "time_saving_pct" and row.get("time_unpaired"):
        return f"it and its baseline trained on different machines ({row['time_unpaired']})"
    if name == "compute_saving_pct":
        return "no train_flops in its runs or its baseline's (trained before FLOPs were counted)"
    if name == "time_saving_pct":
        return "no per-epoch times in its runs or its baseline's"
    if name == "own_time_saving_pct":
        return "no per-epoch times in its runs"
    return "not in its runs' metrics"


CHEAP_EPOCH_NOTE = (
    "Cheaper epoch: the later epochs that do less than a full epoch's work (DFP's pruned, WUS's skip epochs), their "
    "median seconds and their median work (FLOPs), each as a share of the run's full epoch's; the two are equal where "
    "leaving work out saves its time exactly."
)


def cheap_epoch_cell(row: dict[str, Any]) -> str:
    """The cheaper epochs' median time (with its spread over seeds, `stat`) and work as shares of a full epoch's,
    '0.31 / 0.33'; '—' without them."""
    work = row.get("cheap_work_share_mean")
    return "—" if work is None else f"{stat(row, 'cheap_time_share')} / {work:.2f}"


def paper(row: dict[str, Any], name: str, digits: int = 2, sign: bool = False) -> str:
    """The paper's figure; '—' where it cannot apply (a baseline's saving or delta), else 'not in the paper'."""
    if row.get(name) is not None:
        return fmt(row[name], digits, sign)
    if row["method"] == BASELINE and name not in ("paper_acc", "paper_train_time_s"):
        return "—"
    return NOT_IN_PAPER


def interval_text(row: dict[str, Any], name: str, digits: int = 1) -> str:
    """'mean [lo, hi]' with the figure's 95% interval; stat() where the summary has none."""
    if row.get(f"{name}_lo") is None or row.get(f"{name}_mean") is None:
        return stat(row, name, digits)
    lo, hi = row[f"{name}_lo"], row[f"{name}_hi"]
    return f"{row[f'{name}_mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]{paired_note(row, name)}"


def less_work(row: dict[str, Any]) -> bool:
    """Whether the method did less work than its baseline: fewer FLOPs, or (runs without FLOPs) fewer samples."""
    saved = row.get("compute_saving_pct_mean", row.get("sample_saving_pct_mean"))
    return saved is not None and saved > 0


def within_noise(row: dict[str, Any], name: str, compared: float) -> bool:
    """Whether the wall-clock saving `name` cannot be told from `compared` (the docstring of cheaptrain.report): its
    interval contains it, or, against the baseline's run alone, a method that did less work lost time."""
    mean, lo, hi = (row.get(f"{name}_{part}") for part in ("mean", "lo", "hi"))
    if row["method"] == BASELINE or mean is None:
        return False
    busier = name == "time_saving_pct" and mean < 0 and less_work(row)  # one run's machine busier than the other's
    return (lo is not None and lo <= compared <= hi) or busier


def saving_cell(row: dict[str, Any], name: str) -> str:
    """A wall-clock saving with its interval, marked when it is within noise of 0."""
    if name == "time_saving_pct" and row.get("time_unpaired"):
        return "— (other machine)"
    text = interval_text(row, name)
    return f"{text} within noise" if within_noise(row, name, 0.0) else text


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


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
