"""Collect every run of the grid and summarise it: one row a run, means over seeds."""

from __future__ import annotations

import csv
import itertools
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cheaptrain import UserError

KEY = ("study", "dataset", "model", "method")


def grid_runs(params: dict[str, Any]) -> Iterator[tuple[str, str, str, str, int]]:
    """(study, dataset, model, method, seed) of every run the DVC grid trains."""
    for study, grid in (params.get("grid") or {}).items():
        yield from (
            (study, *combo)
            for combo in itertools.product(grid["datasets"], grid["models"], grid["methods"], grid["seeds"])
        )


def collect(params: dict[str, Any], runs_root: Path = Path("runs")) -> list[dict[str, Any]]:
    rows = []
    for study, dataset, model, method, seed in grid_runs(params):
        path = runs_root / study / f"{dataset}-{model}-{method}-s{seed}" / "metrics.json"
        if not path.is_file():
            raise UserError(f"{path} is missing: that run has not finished (run `dvc repro` to train it)")
        metrics = json.loads(path.read_text())
        rows.append({"study": study, "dataset": dataset, "model": model, "method": method, "seed": seed} | metrics)
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean of every metric over seeds, per (study, dataset, model, method)."""
    summary = []
    for key, group in itertools.groupby(
        sorted(rows, key=lambda r: [r[k] for k in KEY]), key=lambda r: [r[k] for k in KEY]
    ):
        group = list(group)
        metrics = [k for k in group[0] if k not in (*KEY, "seed")]
        summary.append(
            dict(zip(KEY, key, strict=True))
            | {"seeds": len(group)}
            | {m: statistics.fmean(r[m] for r in group) for m in metrics}
        )
    return summary


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def report_markdown(summary: list[dict[str, Any]]) -> str:
    lines = [
        "# Results",
        "",
        "Mean over seeds of each configuration of the grid.",
        "",
        "| study | dataset | model | method | seeds | final acc % | best-3 acc % | train time s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        lines.append(
            f"| {r['study']} | {r['dataset']} | {r['model']} | {r['method']} | {r['seeds']} | "
            f"{r['final_acc']:.2f} | {r['best3_acc']:.2f} | {r['train_time_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"
