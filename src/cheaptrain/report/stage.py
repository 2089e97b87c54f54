"""The aggregate stage: read the grid's runs and the results ledger, write report.md, summary.csv, metrics.json,
the figures and curves under results/, and log one MLflow run with the tables and figures."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from cheaptrain import UserError, atomic_write, is_number
from cheaptrain.aggregate import (
    BASELINE,
    Run,
    accuracy_measures,
    add_published,
    collapsed,
    collect,
    config_key,
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
from cheaptrain.report.cells import MEASURE_LABEL, Table
from cheaptrain.report.claims import paper_scale
from cheaptrain.report.equal_cost import cost_table, implementation_of, seed_accuracies
from cheaptrain.report.figures import FIGURES, configurations, curves_csv, figures, png
from cheaptrain.report.tables import findings, paper_tables, setting_differences

MLFLOW_EXPERIMENT = "aggregate"


def report_markdown(
    summary: list[dict[str, Any]],
    runs: list[Run],
    devices: dict[str, str],
    published: set[tuple[str, str, str]],
    agree: dict[str, float],
    tables: list[Table],
    paper_scale_section: str,
    cost: Table,
    accuracies: dict[tuple[str, ...], dict[int, float]],
) -> str:
    """results/report.md: readable on its own (the papers' scale; then the grid's setup, differences from the papers,
    tables, findings, figures). `summary` and `runs`: the grid's configurations (grid_part); `accuracies`: their
    seeds' (seed_accuracies)."""
    measures = {r["study"]: r["acc_measure"] for r in summary}
    differences = setting_differences(runs, devices, published, measures)
    intro = (
        f"{len(runs)} runs of the grid, summarised over seeds by the `aggregate` stage, beside the figures the papers "
        "publish (`data/published_results.csv`), and the results ledger's runs at the papers' scale. Regenerate "
        "with `dvc repro`; the numbers are in `results/summary.csv`, the headline figures in `results/metrics.json`; "
        "the regression gate (stage `check`, README) reads the summary and writes `results/check.json`."
        if runs
        else "No runs in the grid (params `grid`): this report holds the results ledger's runs at the papers' scale "
        "alone, beside the figures the papers publish (`data/published_results.csv`). Regenerate with `dvc repro`, or "
        "from the ledger alone with `python stages/aggregate.py --ledger-only` (seconds; into `results/ledger-only/`)."
    )
    lines = ["# Results: cheaper CIFAR training, reproduced", "", intro, "", paper_scale_section]
    if not runs:
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
        "than the tolerance from it); so is a negative time saved against the baseline's run by a method that did "
        "less work (a machine busier during one run than the other), not one against the run's own full epochs: "
        "both sides from one run, that loss is the method's own overhead. The compute saved is what an ideal "
        "implementation saves on any hardware: the bound for the time saved; a time saving whose interval lies "
        f"wholly more than {agree['saving_points']:g} points above it is noise, not a finding, whether or not the "
        "paper has a figure to compare with.",
        "",
    ]
    lines += [f"- {line}" for line in findings(summary, agree, accuracies)]
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


def run_devices(runs: list[Run]) -> dict[str, str]:
    """For runs whose run.json names no device (older runs): the `device` tag of their MLflow run."""
    from mlflow.exceptions import MlflowException

    from cheaptrain.tracking import store_client

    unnamed = [r for r in runs if not r.device]
    if not unnamed:  # the store is not opened where no run needs it
        return {}
    client, devices = store_client(), {}
    for run in unnamed:
        try:
            devices[run.mlflow_run_id] = client.get_run(run.mlflow_run_id).data.tags.get("device", "")
        except MlflowException:
            continue
    return devices


def log_to_mlflow(
    summary: list[dict[str, Any]],
    runs: list[Run],
    tables: list[Table],
    metrics: dict[str, Any],
    files: list[Path],
    figure_files: list[Path],
) -> str:
    """One MLflow run in the experiment `aggregate`: the tables, the figures (the PNG files written, not drawn
    again), the outputs, links to the runs."""
    import mlflow

    from cheaptrain.tracking import ensure_experiment, flatten, metric_key, stage_tags, tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    experiment_id = ensure_experiment(MLFLOW_EXPERIMENT)
    tags = stage_tags() | {"runs": str(len(runs)), "studies": ",".join(sorted({r.study for r in runs}))}
    name = f"aggregate-{tags['dvc_exp']}" if tags["dvc_exp"] else "aggregate"
    with mlflow.start_run(experiment_id=experiment_id, run_name=name, tags=tags) as active:
        logged = flatten(metrics).items()  # a configuration whose every seed ended at chance has none: {}
        mlflow.log_metrics({metric_key(k.replace(".", "/")): v for k, v in logged if is_number(v)})
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
        for path in files:
            mlflow.log_artifact(str(path))
        for path in figure_files:
            mlflow.log_artifact(str(path), "figures")
        return active.info.run_id


def agreement(params: dict[str, Any]) -> dict[str, float]:
    """Params `aggregate.agree_within`: how close to the paper's figure counts as matching, in points."""
    given = (params.get("aggregate") or {}).get("agree_within") or {}
    agree = {"acc_points": 0.5, "saving_points": 3.0, "cost_points": 3.0}  # cost: a budget's width
    unknown = [k for k in given if k not in agree]
    bad = [k for k, v in given.items() if k in agree and not (is_number(v) and v >= 0)]
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
    accuracies = seed_accuracies(rows, runs)
    cost = cost_table(rows, implementation_of(runs), agree["cost_points"], accuracies=accuracies)
    networks = {k[:3] for k in published}
    report = report_markdown(rows, runs, run_devices(runs), networks, agree, tables, scale, cost, accuracies)
    learned = [run for run in runs if not collapsed(run)]  # a run at chance is left out of every figure
    figs = figures(rows, learned) | scale_figures
    metrics = headline(summary)
    files: dict[str, str | bytes] = {
        "summary.csv": summary_csv(summary),
        "report.md": report,
        "metrics.json": json.dumps(metrics, indent=2) + "\n",
    }
    files |= {f"figures/{name}": png(fig) for name, fig in figs.items()}
    files |= {f"curves/{'-'.join(key)}.csv": curves_csv(group) for key, group in configurations(learned).items()}
    for stale in (out / "curves").glob("*.csv"):  # configurations no longer in the grid
        if f"curves/{stale.name}" not in files:
            stale.unlink()
    for name, data in files.items():
        atomic_write(out / name, data)
    run_id = log_to_mlflow(
        summary,
        runs,
        [*tables, cost, *scale_tables],
        metrics,
        [out / f for f in ("summary.csv", "report.md", "metrics.json")],
        [out / "figures" / name for name in figs],
    )
    return summary, run_id
