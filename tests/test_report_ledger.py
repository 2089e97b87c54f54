"""The results ledger in the aggregate: its entries are summarised beside the grid's runs (a run in both counted once),
and report.md's "Reproduced at the papers' scale" judges every published claim against runs at the paper's setting:
within tolerance, outside it, within noise, not yet run, CIFAR-100 unavailable. Synthetic entries, no training."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cheaptrain import UserError
from cheaptrain.aggregate import (
    Run,
    collapsed,
    collect,
    headline,
    ledger_runs,
    read_summary,
    recipe_id,
    summarize,
    summary_csv,
    with_ledger,
)
from cheaptrain.papers import PAPERS, paper_setting
from cheaptrain.report.claims import Claim, claim_verdict, paper_scale
from cheaptrain.report.figures import LEDGER_FIGURES
from cheaptrain.report.stage import agreement, grid_part, log_to_mlflow, run_devices
from cheaptrain.report.tables import findings, paper_tables

from conftest import REPO, read_csv

TIME_CLAIM = "time saved % (vs its own full epochs)"

PUBLISHED = REPO / "data" / "published_results.csv"
AGREE = {"acc_points": 0.5, "saving_points": 3.0, "cost_points": 3.0}
DEVICE = "cpu: Test EPYC x2"
FLOPS_PER_SAMPLE = 1.2e6
SKIP_FLOPS_PER_SAMPLE = 0.4e6


def paper_recipe(study: str, **changes) -> dict:
    """The recipe as run.json records it (RunConfig.to_dict()): the paper's, with `changes`."""
    recipe = PAPERS[study]["recipe"] | {"nesterov": False, "model_args": {}, "per_model": {}}
    recipe |= {"step_size": 0} if study == "dfp" else {"milestones": []}
    return recipe | changes


def pruned(method: str, epoch: int) -> bool:
    return method in ("dfp", "random_prune") and epoch % 5 in (3, 4)  # 80 of 200 epochs leave out 30%


def skipped(method: str, epoch: int) -> bool:
    return method in ("wus", "wus_lr") and epoch > 40 and epoch % 30 not in (1, 2)  # 150 skip epochs


def write_entry(
    root: Path, study: str, model: str, method: str, seed: int, recipe: dict | None = None, epochs: int = 200
) -> Path:
    """One ledger entry as the train stage writes it: run.json, metrics.json, history.csv (`epochs` rows)."""
    recipe = recipe or paper_recipe(study)
    drop = {"dfp": 0.43, "random_prune": 0.9, "wus": 0.7, "wus_lr": 0.5}.get(method, 0.0)
    history = []
    for e in range(1, epochs + 1):
        samples = 35000 if pruned(method, e) else 50000
        skip = skipped(method, e)
        per_sample = SKIP_FLOPS_PER_SAMPLE if skip else FLOPS_PER_SAMPLE
        seconds = (3.0 * samples / 50000) * (1 / 3 if skip else 1) * (1 + 0.02 * math.sin(e)) + 0.01 * seed
        row = {"epoch": e, "lr": 0.1, "threads": 2, "train_loss": 2 / e, "train_acc": 30.0, "trained_samples": samples,
               "epoch_train_s": seconds, "train_flops": samples * per_sample, "test_loss": 1.0,
               "test_acc": 40 + 35 * (1 - math.exp(-e / 30)) + 0.2 * seed - drop, "eval_s": 0.2}  # fmt: skip
        if method in ("dfp", "random_prune"):
            row["pruned_samples"] = 50000 - samples
        if method in ("wus", "wus_lr"):
            row |= {"phase": int(skip), "updated_params": 10 if skip else 62006}
        history.append(row)
    accs = [r["test_acc"] for r in history]
    metrics = {"final_acc": accs[-1], "best_acc": max(accs), "best3_acc": sum(sorted(accs)[-3:]) / 3,
               "train_time_s": sum(r["epoch_train_s"] for r in history), "epochs": epochs,
               "total_trained_samples": sum(r["trained_samples"] for r in history),
               "total_train_flops": sum(r["train_flops"] for r in history)}  # fmt: skip
    if method in ("wus", "wus_lr"):
        skips = sum(r["phase"] for r in history)
        total = skips * 10 + (epochs - skips) * 62006  # Eq. 1
        metrics |= {"skip_epochs": skips, "normal_epochs": epochs - skips,
                    "updated_params_reduction_pct": 100 * (1 - total / (epochs * 62006))}  # fmt: skip
    name = f"cifar10-{model}-{method}-s{seed}"
    folder = root / study / name
    folder.mkdir(parents=True)
    config = {"study": study, "dataset": "cifar10", "model": model, "method": method, "seed": seed,
              "recipe": recipe, "method_args": {}, "model_args": {}, "device": "auto"}  # fmt: skip
    info = {"name": name, "config": config, "mlflow_run_id": f"trained-{name}", "device": DEVICE}
    (folder / "run.json").write_text(json.dumps(info))
    (folder / "metrics.json").write_text(json.dumps(metrics))
    with open(folder / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    return folder


def write_ledger(root: Path) -> None:
    """DFP on LeNet, its paper's setting, 3 seeds; WUS and WUS+LR on LeNet (no WUS paper figure), 1 seed."""
    for method in ("baseline", "dfp", "random_prune"):
        for seed in (0, 1, 2):
            write_entry(root, "dfp", "lenet", method, seed)
    for method in ("baseline", "wus", "wus_lr"):
        write_entry(root, "wus", "lenet", method, 0)


def cells(report: str, *start: str) -> list[list[str]]:
    """The cells of every markdown table row that begins with `start`."""
    prefix = "| " + " | ".join(start) + " |"
    return [[c.strip() for c in line.strip("|").split("|")] for line in report.splitlines() if line.startswith(prefix)]


def test_a_fresh_checkout_with_only_ledger_entries_gets_the_papers_scale_section(tmp_path, empty_store):
    """No runs/ and an empty grid: the aggregate stage still summarises the ledger and reports every claim."""
    write_ledger(tmp_path / "ledger")
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    (tmp_path / "params.yaml").write_text("grid: {}\n")
    out, store = tmp_path / "results", f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = os.environ | {"PYTHONPATH": str(REPO / "src"), "DVC_ROOT": str(tmp_path), "MLFLOW_TRACKING_URI": store}
    cmd = [sys.executable, str(REPO / "stages" / "aggregate.py"), "--params", "params.yaml", "--runs", "runs",
           "--published", str(PUBLISHED), "--out", str(out)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "runs").exists()

    report = (out / "report.md").read_text()
    assert "## Reproduced at the papers' scale" in report
    assert "**2 of 68 published claims run, 2 within tolerance** (0 within noise, 0 outside tolerance, 42 not yet " \
           "run, 24 CIFAR-100 unavailable)." in report  # fmt: skip
    summary = {(r["study"], r["method"]): r for r in read_csv(out / "summary.csv")}
    dfp = summary["dfp", "dfp"]
    assert dfp["source"] == "ledger" and dfp["seeds"] == "3" and dfp["devices"] == DEVICE
    mean, ci = float(dfp["acc_delta_mean"]), float(dfp["acc_delta_ci95"])
    (acc,) = cells(report, "dfp", "cifar10", "lenet", "dfp", "accuracy Δ (points)")
    assert acc[5:] == [f"{mean:+.2f} [{mean - ci:+.2f}, {mean + ci:+.2f}]", "3", DEVICE, "-0.43", f"{mean + 0.43:+.2f}",
                       "", "", "paper's", "within tolerance"]  # fmt: skip
    (time,) = cells(report, "dfp", "cifar10", "lenet", "dfp", TIME_CLAIM)
    lo, hi = float(dfp["own_time_saving_pct_lo"]), float(dfp["own_time_saving_pct_hi"])
    assert time[5] == f"{float(dfp['own_time_saving_pct_mean']):+.1f} [{lo:+.1f}, {hi:+.1f}]" and time[8] == "11.8"
    assert time[10] == "12.0 ± 0.0" and time[-1] == "within tolerance"  # compute saved beside it: 80 epochs x 30%
    # where the time went: a pruned epoch's seconds and work as shares of a full epoch's, both about 0.7 here
    share = float(dfp["cheap_time_share_mean"])
    ci = float(dfp["cheap_time_share_ci95"])
    assert time[11] == f"{share:.2f} ± {ci:.2f} / 0.70" and share == pytest.approx(0.7, abs=0.03)
    assert "the two are equal where leaving work out saves its time exactly" in report
    assert "it bounds the time saving on any hardware" in report
    cifar100 = [c for c in cells(report, "wus", "cifar100")]
    assert len(cifar100) == 24 and {c[-1] for c in cifar100} == {"CIFAR-100 unavailable"}
    assert {c[-1] for c in cells(report, "dfp", "cifar10", "vgg13")} == {"not yet run"}
    assert report.count("JPEG") == 1 and "CIFAR-100 cannot be obtained on these machines" in report

    (wus,) = cells(report, "cifar10-lenet-wus-s0")
    assert wus == ["cifar10-lenet-wus-s0", DEVICE, "200", "150", "75.0", f"{100 * 150 / 200 * (1 - 10 / 62006):.1f}",
                   "71–74", "paper's"]  # fmt: skip
    assert cells(report, "cifar10-lenet-wus_lr-s0") and not cells(report, "cifar10-lenet-baseline-s0")
    assert "No runs in the grid" in report and "stages/aggregate.py --ledger-only" in report
    assert "results/summary.csv" not in report  # the grid's outputs, which a ledger-only report does not write
    for name in LEDGER_FIGURES:  # the runs at the papers' setting drawn, not a placeholder (about 10 KB)
        assert f"(figures/{name})" in report and (out / "figures" / name).stat().st_size > 20_000, name

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["ledger"]["dfp"]["cifar10-lenet-dfp"]["acc_delta"] == pytest.approx(-0.43, abs=1e-3)
    assert set(metrics) == {"ledger"}  # the grid trained nothing

    from mlflow import MlflowClient

    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("aggregate").experiment_id])
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "tables")}
    assert {
        "tables/ledger.json",
        "tables/ledger_accuracy.json",
        "tables/ledger_wus_schedule.json",
        "tables/summary.json",
    } <= tables
    logged = json.loads(Path(client.download_artifacts(run.info.run_id, "tables/ledger.json")).read_text())
    assert len(logged["data"]) == 68


def test_ledger_only_reports_the_ledger_while_the_grid_is_untrained(tmp_path, empty_store):
    """The papers' grid with no run trained: the stage names the missing runs; --ledger-only reports the ledger into
    results/ledger-only/ and leaves the stage's own outputs alone."""
    write_ledger(tmp_path / "ledger")
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "report.md").write_text("the grid's report\n")
    env = os.environ | {"PYTHONPATH": str(REPO / "src"), "DVC_ROOT": str(tmp_path),
                        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # fmt: skip
    cmd = [sys.executable, str(REPO / "stages" / "aggregate.py"), "--published", str(PUBLISHED)]

    grid = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert grid.returncode == 2 and "have not finished" in grid.stderr

    alone = subprocess.run([*cmd, "--ledger-only"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert alone.returncode == 0, alone.stderr
    report = (tmp_path / "results" / "ledger-only" / "report.md").read_text()
    assert "**2 of 68 published claims run, 2 within tolerance**" in report
    assert (tmp_path / "results" / "report.md").read_text() == "the grid's report\n"


def test_the_ledger_and_the_grid_count_a_run_in_both_once(tmp_path):
    """A grid run that is also a ledger entry counts once (the grid's); another seed of the same recipe joins the
    grid's configuration; a run of the same name at another recipe makes a configuration of its own."""
    quick = paper_recipe("dfp", epochs=10, lr=0.02)
    for method in ("baseline", "dfp"):
        for seed in (0, 1):
            write_entry(tmp_path / "runs", "dfp", "lenet", method, seed, quick, epochs=10)
        write_entry(tmp_path / "ledger", "dfp", "lenet", method, 0)  # the paper's setting
        write_entry(tmp_path / "ledger", "dfp", "lenet", method, 1, quick, epochs=10)  # the grid's run
        write_entry(tmp_path / "ledger", "dfp", "lenet", method, 2, quick, epochs=10)  # a third seed
    grid = {"grid": {"dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline", "dfp"],
                             "seeds": [0, 1]}}}  # fmt: skip
    runs = with_ledger(collect(grid, tmp_path / "runs"), ledger_runs(tmp_path / "ledger"))
    assert len(runs) == 4 + 2 + 2
    summary = summarize(runs, {"dfp": "best3_acc"})
    rows = {(r["method"], r["epochs"]): r for r in summary}
    assert len(summary) == 4
    assert rows["dfp", 10]["seeds"] == 3 and rows["dfp", 10]["source"] == "runs+ledger"
    assert rows["dfp", 200]["seeds"] == 1 and rows["dfp", 200]["source"] == "ledger"
    assert rows["dfp", 10]["recipe"] == recipe_id(quick) != rows["dfp", 200]["recipe"]
    assert rows["dfp", 200]["acc_delta_mean"] == pytest.approx(-0.43)  # paired with the baseline of its own recipe
    metrics = headline(summary)
    assert set(metrics["dfp"]) == {"cifar10-lenet-baseline", "cifar10-lenet-dfp"}
    assert set(metrics["ledger"]["dfp"]) == {"cifar10-lenet-baseline", "cifar10-lenet-dfp"}
    grid_rows, grid_runs = grid_part(summary, runs)  # the report's body, figures and curves: the grid's configurations
    assert {r["epochs"] for r in grid_rows} == {10} and len(grid_runs) == 6


@pytest.mark.parametrize("grid_run", ["an earlier version of the entry", "trained otherwise", "the entry"])
def test_a_grid_run_that_is_an_earlier_version_of_its_ledger_entry_gives_way_to_the_entry(tmp_path, capsys, grid_run):
    """An entry replaced since the grid's train stage recorded or reused it (retrained on a GPU, committed from there):
    `dvc repro` sees nothing to train again, and the report counts the entry. A grid run trained otherwise (ledger
    mode ignore, other prepared data) or the entry itself stays the grid's."""

    def provenance(folder: Path, ledger: str, finished: str, digest: str = "d1") -> None:
        info = json.loads((folder / "run.json").read_text())
        info["config"]["ledger"] = ledger
        (folder / "run.json").write_text(json.dumps(info | {"finished_at": finished, "data_digest": digest}))

    ours = write_entry(tmp_path / "runs", "dfp", "lenet", "dfp", 0)
    entry = write_entry(tmp_path / "ledger", "dfp", "lenet", "dfp", 0)
    metrics = json.loads((entry / "metrics.json").read_text())
    (entry / "metrics.json").write_text(json.dumps(metrics | {"best3_acc": 80.0}))
    provenance(entry, "record", "2026-12-06T10:00:00Z")
    provenance(ours, *{
        "an earlier version of the entry": ("record", "2026-12-01T10:00:00Z"),
        "trained otherwise": ("ignore", "2026-12-01T10:00:00Z"),
        "the entry": ("record", "2026-12-06T10:00:00Z"),
    }[grid_run])  # fmt: skip
    grid = {"grid": {"dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["dfp"], "seeds": [0]}}}
    (run,) = with_ledger(collect(grid, tmp_path / "runs"), ledger_runs(tmp_path / "ledger"))
    warned = capsys.readouterr().err
    if grid_run == "an earlier version of the entry":
        assert run.source == "ledger" and run.metrics["best3_acc"] == 80.0
        assert warned == (
            "warning: dfp/cifar10-lenet-dfp-s0: the grid's run (finished 2026-12-01T10:00:00Z) is an earlier version "
            "of its ledger entry (finished 2026-12-06T10:00:00Z); the report counts the entry (`dvc repro --force "
            "--single-item train_dfp@cifar10-lenet-dfp-0` copies it into runs/)\n"
        )
    else:
        assert run.source == "runs" and run.metrics["best3_acc"] != 80.0 and warned == ""


def test_two_ledger_configurations_of_one_name_are_both_logged_to_mlflow(tmp_path, monkeypatch, empty_store):
    """Runs of one name at two recipes: metrics.json keeps both, the second under its recipe, in a name MLflow
    accepts (it refuses '@'); the run's tags are the stage's, the git commit read once."""
    from mlflow import MlflowClient

    from cheaptrain import tracking

    quick = paper_recipe("dfp", epochs=10, lr=0.02)
    for method in ("baseline", "dfp"):
        write_entry(tmp_path / "ledger", "dfp", "lenet", method, 0)
        write_entry(tmp_path / "ledger", "dfp", "lenet", method, 1, quick, epochs=10)
    summary = summarize(ledger_runs(tmp_path / "ledger"), {"dfp": "best3_acc"})
    metrics = headline(summary)
    names = set(metrics["ledger"]["dfp"])
    plain = {"cifar10-lenet-baseline", "cifar10-lenet-dfp"}
    assert len(names) == 4 and {name.split(" recipe ")[0] for name in names} == plain
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    commits = []
    monkeypatch.setattr(tracking, "git_commit", lambda: commits.append(1) or "abc123")
    run = MlflowClient(store).get_run(log_to_mlflow(summary, [], [], metrics, [], []))
    assert {key.split("/")[2] for key in run.data.metrics} == names
    assert run.data.tags["git_commit"] == run.data.tags["mlflow.source.git.commit"] == "abc123" and commits == [1]


def test_devices_of_older_runs_are_read_from_a_checked_store_and_only_when_a_run_lacks_its_own(tmp_path, monkeypatch):
    """A mistyped store folder is one clear error, not a new store there; runs that name their device need none."""
    typo = tmp_path / "typo" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{typo}")
    named = run_of(claim_row("lenet", "dfp"))
    assert run_devices([named]) == {}
    with pytest.raises(UserError, match="is not an existing folder"):
        run_devices([named, replace(named, device="", mlflow_run_id="older")])
    assert not typo.parent.exists()


@pytest.mark.parametrize("value", [True, float("inf"), float("nan"), -1, "1"])
def test_a_tolerance_that_is_not_a_finite_number_is_an_error(value):
    with pytest.raises(UserError, match=r"aggregate\.agree_within: acc_points not accepted"):
        agreement({"aggregate": {"agree_within": {"acc_points": value}}})


def test_params_yaml_lists_every_tolerance_at_its_default():
    """The report cites each by its params key (aggregate.agree_within.cost_points too): each is set there."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert params["aggregate"]["agree_within"] == agreement({})


def test_a_methods_paired_figures_are_over_the_seeds_whose_baseline_has_run_and_say_so(tmp_path):
    """WUS at seeds 0-2, the baseline at seeds 0 and 1 (its seed 2 still training): accuracy Δ and the savings
    against the baseline are over seeds 0 and 1 and every place that shows them says '2 of 3'; a method none of
    whose seeds has its baseline yet says which seed waits. Its own time saved is over all its seeds."""
    from cheaptrain.aggregate import load_published
    from cheaptrain.report.cells import stat

    for method, seeds in (("baseline", (0, 1)), ("wus", (0, 1, 2)), ("wus_lr", (2,))):
        for seed in seeds:
            write_entry(tmp_path, "wus", "alexnet", method, seed)
    runs = ledger_runs(tmp_path)
    summary = summarize(runs, {})
    rows = {r["method"]: r for r in summary}
    wus = rows["wus"]
    assert (wus["seeds"], wus["paired_seeds"], wus["unpaired_seeds"]) == (3, 2, "2")
    assert wus["acc_delta_mean"] == pytest.approx(-0.7) and wus["acc_delta_std"] == pytest.approx(0, abs=1e-9)
    assert wus["acc_delta_ci95"] is None  # 2 paired seeds: no t-interval, though the row has 3
    assert wus["own_time_saving_pct_ci95"] is not None  # not paired: over all 3 seeds
    assert "compute_saving_pct_mean" in wus and "time_saving_pct_mean" in wus
    assert (rows["wus_lr"]["paired_seeds"], rows["wus_lr"]["unpaired_seeds"]) == (0, "2")
    assert "acc_delta_mean" not in rows["wus_lr"] and "paired_seeds" not in rows["baseline"]
    assert stat(wus, "acc_delta", sign=True) == "-0.70 (sd 0.00) (2 of 3 seeds)"
    assert not stat(wus, "own_time_saving_pct", 1).endswith("seeds)")
    (tmp_path / "summary.csv").write_text(summary_csv(summary))
    read = {r["method"]: r for r in read_summary(tmp_path / "summary.csv")}
    assert {m: (r.get("paired_seeds"), r.get("unpaired_seeds")) for m, r in read.items()} == {
        "baseline": (None, None), "wus": (2, "2"), "wus_lr": (0, "2")}  # fmt: skip
    markdown, tables, _ = paper_scale(summary, runs, load_published(PUBLISHED), AGREE)
    table = tables[0]
    claims = {(r[3], r[4]): r for r in table.rows if r[1:3] == ["cifar10", "alexnet"]}
    assert claims["wus", "accuracy Δ (points)"][5:7] == ["-0.70 (sd 0.00)", "2 of 3"]
    assert claims["wus", "accuracy Δ (points)"][-1] == "within tolerance"  # paper: -0.59 on AlexNet
    assert claims["wus", TIME_CLAIM][6] == "3" and claims["wus", TIME_CLAIM][-1] != "not yet run"
    assert claims["wus_lr", "accuracy Δ (points)"][5:7] == ["— (no baseline of seed 2 yet)", "1"]
    assert claims["wus_lr", "accuracy Δ (points)"][-1] == "not yet run"
    assert "wus: Δ -0.70 points (2 of 3 seeds) at" in markdown  # the equal-cost findings


def test_a_time_saving_is_only_paired_on_one_device(tmp_path):
    write_entry(tmp_path, "dfp", "lenet", "baseline", 0)
    info_path = write_entry(tmp_path, "dfp", "lenet", "dfp", 0) / "run.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps(info | {"device": "NVIDIA H100 80GB HBM3"}))
    (row,) = [r for r in summarize(ledger_runs(tmp_path), {}) if r["method"] == "dfp"]
    assert row["compute_saving_pct_mean"] == pytest.approx(12.0) and "acc_delta_mean" in row
    assert "time_saving_pct_mean" not in row  # an H100 run against a CPU baseline says nothing about time
    assert row["time_unpaired"] == f"seed 0 on NVIDIA H100 80GB HBM3, its baseline on {DEVICE}"


def test_a_time_saving_is_only_paired_on_cpus_with_the_same_vector_instructions(tmp_path):
    """Two machines' CPUs of one name (an AMD EPYC with AVX-512, one with AVX2 alone) train at different speeds: a
    pair whose run.json files name different kernels is not paired on time; one that names none, or a GPU's host,
    is."""
    paths = {m: write_entry(tmp_path, "dfp", "lenet", m, 0) / "run.json" for m in ("baseline", "dfp")}

    def dfp_row(baseline: dict, dfp: dict) -> dict:
        for method, extra in (("baseline", baseline), ("dfp", dfp)):
            info = json.loads(paths[method].read_text())
            info.pop("cpu_capability", None)
            paths[method].write_text(json.dumps(info | extra))
        (row,) = [r for r in summarize(ledger_runs(tmp_path), {}) if r["method"] == "dfp"]
        return row

    row = dfp_row({"cpu_capability": "AVX512"}, {"cpu_capability": "AVX2"})
    assert "time_saving_pct_mean" not in row and "acc_delta_mean" in row
    assert row["time_unpaired"] == f"seed 0 on {DEVICE} with AVX2, its baseline on {DEVICE} with AVX512"
    assert "time_saving_pct_mean" in dfp_row({"cpu_capability": "AVX512"}, {"cpu_capability": "AVX512"})
    assert "time_saving_pct_mean" in dfp_row({"cpu_capability": "AVX512"}, {})  # an older entry says nothing
    gpu = {"device": "NVIDIA H200"}
    assert "time_saving_pct_mean" in dfp_row(gpu | {"cpu_capability": "AVX512"}, gpu | {"cpu_capability": "AVX2"})


def test_a_run_resumed_on_another_machine_is_paired_on_time_with_no_baseline(tmp_path):
    """A run that went on after a crash on a CPU with other vector instructions (run.json's `machines`) mixes two
    machines' seconds: neither it nor a run against it as the baseline is paired on time; its accuracy still is."""
    paths = {m: write_entry(tmp_path, "dfp", "lenet", m, 0) / "run.json" for m in ("baseline", "dfp")}
    here = {"device": DEVICE, "cpu_capability": "AVX512"}
    two = [{"from_epoch": 1, **here}, {"from_epoch": 57, "device": DEVICE, "cpu_capability": "AVX2"}]
    text = f"{DEVICE} with AVX512 from epoch 1, {DEVICE} with AVX2 from epoch 57"

    def dfp_row(baseline: list, dfp: list) -> dict:
        for method, machines in (("baseline", baseline), ("dfp", dfp)):
            info = json.loads(paths[method].read_text())
            paths[method].write_text(json.dumps(info | here | {"machines": machines}))
        (row,) = [r for r in summarize(ledger_runs(tmp_path), {}) if r["method"] == "dfp"]
        return row

    row = dfp_row([two[0]], two)
    assert "time_saving_pct_mean" not in row and "acc_delta_mean" in row and "own_time_saving_pct_mean" in row
    assert row["time_unpaired"] == f"seed 0 trained on several machines ({text})"
    row = dfp_row(two, [two[0]])
    assert row["time_unpaired"] == f"seed 0's baseline trained on several machines ({text})"
    assert "time_saving_pct_mean" in dfp_row([two[0]], [two[0]])  # one machine each, the same
    assert "time_saving_pct_mean" in dfp_row([two[0]], [])  # an older run.json says nothing


def test_a_time_saving_is_only_paired_on_the_same_cpu_threads_and_the_report_says_why_not(tmp_path):
    for seed in (0, 1):
        write_entry(tmp_path, "wus", "lenet", "baseline", seed)
        write_entry(tmp_path, "wus", "lenet", "wus", seed)
    history = tmp_path / "wus" / "cifar10-lenet-baseline-s1" / "history.csv"
    rows = read_csv(history)
    with history.open("w", newline="") as f:  # the baseline of seed 1 trained on one thread, its method on two
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(r | {"threads": "1"} for r in rows)
    summary = summarize(ledger_runs(tmp_path), {})
    (row,) = [r for r in summary if r["method"] == "wus"]
    assert "time_saving_pct_mean" not in row
    assert row["own_time_saving_pct_mean"] == pytest.approx(50, abs=1)  # its own epochs still compare
    assert row["time_unpaired"] == "seed 1 on 2 CPU threads, its baseline on 1 CPU thread"
    assert row["acc_delta_mean"] == pytest.approx(-0.7) and row["compute_saving_pct_mean"] > 0  # no clock in these
    (tmp_path / "summary.csv").write_text(summary_csv(summary))
    (read,) = [r for r in read_summary(tmp_path / "summary.csv") if r["method"] == "wus"]
    assert read["time_unpaired"] == row["time_unpaired"]
    (finding,) = [line for line in findings(summary, AGREE) if "/wus:" in line]
    assert "time saved not compared with the baseline's (seed 1 on 2 CPU threads, its baseline on 1" in finding
    (table,) = [t for t in paper_tables(summary) if t.slug == "wus_table1"]
    assert table.columns()["time saved %"][1] == "— (other machine)"


@pytest.mark.parametrize("uuids", [("GPU-aaaa1111", "GPU-aaaa1111"), ("GPU-aaaa1111", "GPU-bbbb2222"), ("", "GPU-b")])
def test_two_gpus_of_one_name_pair_only_where_their_uuids_do_not_differ(tmp_path, uuids):
    """Two rented H200s are two machines: a run and its baseline on GPUs of one name but other UUIDs do not pair; an
    entry that predates the record (no UUID) pairs by the device's name, as before."""
    for method, uuid in zip(("baseline", "wus"), uuids, strict=True):
        path = write_entry(tmp_path, "wus", "lenet", method, 0) / "run.json"
        info = json.loads(path.read_text()) | {"device": "NVIDIA H200"}
        path.write_text(json.dumps(info | ({"gpu_uuid": uuid} if uuid else {})))
    (row,) = [r for r in summarize(ledger_runs(tmp_path), {}) if r["method"] == "wus"]
    if uuids[0] and uuids[0] != uuids[1]:
        assert "time_saving_pct_mean" not in row
        assert (
            row["time_unpaired"]
            == "seed 0 on NVIDIA H200 GPU-bbbb2222, its baseline on another NVIDIA H200, GPU-aaaa1111"
        )
    else:
        assert "time_unpaired" not in row and row["time_saving_pct_mean"] > 0
    assert row["own_time_saving_pct_mean"] == pytest.approx(50, abs=1)  # its own epochs compare either way


def test_a_broken_ledger_entry_is_one_clear_error(tmp_path):
    folder = write_entry(tmp_path, "dfp", "lenet", "baseline", 0)
    (folder / "metrics.json").write_text(json.dumps({"final_acc": 60.0}))
    with pytest.raises(UserError, match=r"ledger entry .*baseline-s0: metrics.json: best_acc missing"):
        ledger_runs(tmp_path)


# ---------------------------------------------------------------------------------------------------- verdicts


def claim_row(model: str, method: str, recipe: dict | None = None, study: str = "dfp", **figures: float) -> dict:
    """A 3-seed summary row of the ledger; `figures`: statistic -> mean, ci95 or (mean, lo, hi)."""
    row = {"study": study, "dataset": "cifar10", "model": model, "method": method, "seeds": 3, "epochs": 200,
           "recipe": recipe_id(recipe or paper_recipe(study)), "source": "ledger", "devices": DEVICE,
           "acc_measure": "best3_acc" if study == "dfp" else "final_acc", "acc_mean": 70.0}  # fmt: skip
    for name, value in figures.items():
        if isinstance(value, tuple) and len(value) == 3:
            row |= dict(zip((f"{name}_mean", f"{name}_lo", f"{name}_hi"), value, strict=True))
        elif isinstance(value, tuple):
            row |= {f"{name}_mean": value[0], f"{name}_ci95": value[1]}
        else:
            row[f"{name}_mean"] = value
    return row


def run_of(row: dict, recipe: dict | None = None) -> Run:
    config = {"recipe": recipe or paper_recipe(row["study"])}
    history = [{"epoch": e, "lr": 0.1, "test_acc": 50.0 + e, "epoch_train_s": 1.0} for e in (1, 2)]
    metrics = {"final_acc": 70.0, "best3_acc": 70.0}
    return Run(
        row["study"], row["dataset"], row["model"], row["method"], 0, metrics, history, config, "", DEVICE, "ledger"
    )


def test_every_claim_gets_a_verdict_and_a_time_saving_within_noise_is_never_outside():
    """Verdicts, coverage, and the setting column: a per_model setting and a network unlike the paper's (WUS's VGGs
    with BatchNorm) count as named deviations; a study recipe unlike the paper's does not count."""
    from cheaptrain.aggregate import load_published

    lower_lr = paper_recipe("dfp", lr=0.05, per_model={"wrn10": {"lr": 0.05}})  # a documented deviation
    everywhere = paper_recipe("dfp", lr=0.05)  # the study's recipe itself: not the paper's setting
    rows_runs = [
        (claim_row("lenet", "dfp", acc_delta=(-0.40, 0.1)), None),  # Δ within 0.5 of the paper's -0.43
        (claim_row("vgg13", "dfp", acc_delta=(-2.0, 0.3), own_time_saving_pct=(12.0, 5.0, 13.0),
                   compute_saving_pct=12.0), None),  # Δ outside; time 4.6 from the paper's 7.4, inside our interval
        (claim_row("vgg16", "dfp", acc_delta=(-0.30, 0.1), own_time_saving_pct=(2.0, 1.5, 2.5),
                   compute_saving_pct=12.0), None),  # time outside: 2.0 against 7.56
        (claim_row("resnet34", "dfp", acc_delta=(0.0, 0.1), own_time_saving_pct=(-5.0, -8.0, -2.0),
                   compute_saving_pct=12.0), None),  # slower than its own full epochs: its overhead, outside
        (claim_row("wrn10", "dfp", lower_lr, acc_delta=(-0.30, 0.1)), lower_lr),  # counts, deviation shown
        (claim_row("vgg19", "dfp", everywhere, acc_delta=(-0.05, 0.1)), everywhere),  # does not count
        (claim_row("vgg11", "wus", study="wus", acc_delta=(-0.70, 0.2), own_time_saving_pct=(57.0, 56.0, 58.0),
                   compute_saving_pct=70.0, updated_params_reduction_pct=(73.0, 2.0)), None),  # all three within
        (claim_row("alexnet", "wus", study="wus", own_time_saving_pct=(57.0, 56.0, 58.0),
                   updated_params_reduction_pct=(73.0, 1.0)), None),  # no baseline: time and reduction alone judged
    ]  # fmt: skip
    summary = [row for row, _ in rows_runs]
    runs = [run_of(row, recipe) for row, recipe in rows_runs]
    text, (table, *_), _ = paper_scale(summary, runs, load_published(PUBLISHED), AGREE)
    verdicts = {(r[2], r[3], r[4]): r[-1] for r in table.rows if r[1] == "cifar10"}  # model, method, claim
    assert verdicts["lenet", "dfp", "accuracy Δ (points)"] == "within tolerance"
    assert verdicts["lenet", "dfp", TIME_CLAIM] == "not yet run"  # its row has no time saving
    assert verdicts["vgg13", "dfp", "accuracy Δ (points)"] == "outside tolerance"
    assert verdicts["vgg13", "dfp", TIME_CLAIM] == "within noise"
    assert verdicts["vgg16", "dfp", TIME_CLAIM] == "outside tolerance"
    assert verdicts["resnet34", "dfp", TIME_CLAIM] == "outside tolerance"  # no busier machine within one run
    assert verdicts["wrn10", "dfp", "accuracy Δ (points)"] == "within tolerance"
    assert verdicts["vgg19", "dfp", "accuracy Δ (points)"] == "not yet run"  # trained, not at the paper's setting
    assert verdicts["resnet18", "dfp", "accuracy Δ (points)"] == "not yet run"
    for claim in ("accuracy Δ (points)", TIME_CLAIM, "updated-parameter reduction %"):
        assert verdicts["vgg11", "wus", claim] == "within tolerance"
    assert (
        verdicts["alexnet", "wus", TIME_CLAIM]
        == verdicts["alexnet", "wus", "updated-parameter reduction %"]
        == ("within tolerance")
    )
    assert verdicts["alexnet", "wus", "accuracy Δ (points)"] == "not yet run"
    alexnet = next(r for r in table.rows if r[2:5] == ["alexnet", "wus", "accuracy Δ (points)"])
    assert alexnet[5] == "— (no baseline at this setting)" and alexnet[6] == "3"
    assert {r[-1] for r in table.rows if r[1] == "cifar100"} == {"CIFAR-100 unavailable"}
    assert len(table.rows) == 68
    wrn10 = next(r for r in table.rows if r[2] == "wrn10" and r[4] == "accuracy Δ (points)")
    assert wrn10[-2] == "lr 0.05 for wrn10 (recipes.dfp.per_model; paper: 0.1)"
    vgg11 = next(r for r in table.rows if r[2:4] == ["vgg11", "wus"] and r[4] == "accuracy Δ (points)")
    assert vgg11[-2] == "vgg11 batch_norm true (paper: false; docs/models.md)"  # counts, its network named
    assert alexnet[-2] == "paper's"
    assert "**13 of 68 published claims run, 9 within tolerance** (1 within noise, 3 outside tolerance, 31 not yet " \
           "run, 24 CIFAR-100 unavailable)." in text  # fmt: skip
    assert "Ledger runs not at the paper's setting, not counted: dfp cifar10/vgg19/dfp (lr 0.05 (paper: 0.1))" in text


def test_a_per_model_setting_is_a_deviation_for_its_own_network_and_never_for_the_epochs():
    """`recipes.<study>.per_model` documents a network's own setting: the run still counts at the paper's setting,
    the deviation named. It does not cover another network, nor the 200 epochs every claim is about."""
    wrn10_lr = paper_recipe("dfp", lr=0.05, per_model={"wrn10": {"lr": 0.05}})
    assert paper_setting("dfp", wrn10_lr, "wrn10") == (True, ["lr 0.05 for wrn10 (recipes.dfp.per_model; paper: 0.1)"])
    assert paper_setting("dfp", wrn10_lr, "vgg16") == (False, ["lr 0.05 (paper: 0.1)"])
    shorter = paper_recipe("dfp", epochs=100, per_model={"wrn10": {"epochs": 100}})
    assert paper_setting("dfp", shorter, "wrn10") == (False, ["epochs 100 (paper: 200)"])
    assert paper_setting("dfp", paper_recipe("dfp"), "wrn10") == (True, [])


def test_an_accuracy_claim_further_than_the_tolerance_agrees_where_the_papers_figure_lies_in_our_interval():
    """Beyond `agree_within`'s 0.5 points, the paper's Δ inside our 95% t-interval still agrees: our seeds cannot tell
    the two apart. The interval widens the tolerance, never narrows it."""
    claim = Claim("dfp", "cifar10", "lenet", "dfp", "acc_delta", "accuracy Δ (points)", 2, -0.43)

    def verdict(mean: float, ci95: float) -> str:
        return claim_verdict(claim, claim_row("lenet", "dfp", acc_delta=(mean, ci95)), AGREE)

    assert verdict(-1.20, 0.80) == "within tolerance"  # 0.77 from the paper's, inside our ±0.80
    assert verdict(-1.20, 0.70) == "outside tolerance"  # the paper's outside both
    assert verdict(-0.80, 0.10) == "within tolerance"  # 0.37 from it: the tolerance alone


def test_a_run_ends_at_chance_within_one_point_of_it():
    """CIFAR-10's chance is 10%: a final accuracy up to 11.0 counts as collapsed, one above it as trained; CIFAR-100's
    is 1%."""
    run = run_of(claim_row("alexnet", "baseline", study="wus"))
    assert not collapsed(run)
    assert collapsed(replace(run, metrics={**run.metrics, "final_acc": 11.0}))
    assert not collapsed(replace(run, metrics={**run.metrics, "final_acc": 11.1}))
    assert collapsed(replace(run, dataset="cifar100", metrics={**run.metrics, "final_acc": 2.0}))  # chance 1%
    assert not collapsed(replace(run, dataset="cifar100", metrics={**run.metrics, "final_acc": 2.1}))


def test_the_papers_networks_record_our_models_defaults_as_models_py_declares_them():
    from cheaptrain.models import MODELS

    for study in PAPERS.values():
        for model, options in study.get("networks", {}).items():
            for key, (_, ours) in options.items():
                assert MODELS[model].options[key].default == ours, (model, key)


def test_the_papers_scale_compares_its_methods_at_equal_cost_on_their_own_full_epochs():
    from cheaptrain.aggregate import load_published

    everywhere = paper_recipe("dfp", lr=0.05)
    rows_runs = [
        (claim_row("lenet", "dfp", acc_delta=(-1.2, 0.3), compute_saving_pct=12.7,
                   own_time_saving_pct=(13.0, 11.0, 15.0), time_saving_pct=(-40.0, -60.0, -20.0)), None),
        (claim_row("lenet", "random_prune", acc_delta=(-0.2, 0.3), compute_saving_pct=12.7,
                   own_time_saving_pct=(12.0, 11.0, 13.0)), None),  # not in the paper: compared all the same
        (claim_row("vgg19", "dfp", everywhere, acc_delta=(0.5, 0.1), compute_saving_pct=12.7), everywhere),
    ]  # fmt: skip
    summary = [row for row, _ in rows_runs]
    runs = [run_of(row, recipe) for row, recipe in rows_runs]
    text, (_, _, cost, _), figures = paper_scale(summary, runs, load_published(PUBLISHED), AGREE)
    assert cost.slug == "ledger_accuracy_vs_cost" and "### Accuracy against cost at the papers' setting" in text
    assert [(r[1], r[3]) for r in cost.rows] == [("lenet", "random_prune"), ("lenet", "dfp")]  # best first
    assert "own time saved % [95%]" in cost.headers and "13.0 [11.0, 15.0]" in cost.rows[1]
    assert not any("-40.0" in cell for row in cost.rows for cell in row)  # the drift between runs stays out
    assert "best random_prune: Δ -0.20 [-0.50, +0.10] points" in cost.note
    assert "the lead is larger than the 95% intervals (they do not overlap)" in cost.note
    axes = [a for a in figures["ledger_acc_vs_cost.png"].axes if a.get_visible()]
    assert [a.get_xlabel() for a in axes] == [
        "compute saved (%, exact)",
        "time saved vs own full epochs (%, 95% interval)",
    ]
    own_time = {c.get_label(): c.lines[0].get_xydata()[0][0] for c in axes[1].containers}
    assert own_time == {"dfp": 13.0, "random_prune": 12.0}  # vgg19's lr is not the paper's: not at its setting
    curves = [a for a in figures["ledger_test_acc.png"].axes if a.get_visible()]
    assert len(curves) == 1 and {line.get_label() for line in curves[0].lines} == {
        "dfp (1 seed)",
        "random_prune (1 seed)",
    }


def test_every_published_accuracy_that_ran_stands_beside_ours_the_baselines_included():
    """The accuracy table: each accuracy of the papers' Tables 2 with a run at the paper's setting, the baselines'
    too, ours in the paper's measure with its interval, the gap; the baselines' gaps per study; a network trained by
    both studies' recipes named with both baselines' final accuracies. Its figure: ours against the paper's star,
    with no tolerance band (an absolute accuracy has none)."""
    from cheaptrain.aggregate import load_published

    everywhere = paper_recipe("dfp", lr=0.05)
    rows = [
        claim_row("lenet", "baseline", acc=(72.0, 0.5), final_acc=71.9),
        claim_row("lenet", "dfp", acc=(71.0, 0.4), acc_delta=(-1.0, 0.3)),
        claim_row("vgg19", "baseline", everywhere, acc=93.0),  # not at the paper's setting: not shown
        claim_row("alexnet", "baseline", final_acc=76.0),  # no DFP figure for AlexNet: its final accuracy alone
        claim_row("alexnet", "baseline", study="wus", acc=66.0, final_acc=66.0) | {"seeds": 1},
        claim_row("alexnet", "wus", study="wus", acc=67.0) | {"seeds": 2, "acc_std": 0.4},
    ]
    runs = [run_of(row, everywhere if row["model"] == "vgg19" else None) for row in rows]
    text, tables, figures = paper_scale(rows, runs, load_published(PUBLISHED), AGREE)
    (level,) = [t for t in tables if t.slug == "ledger_accuracy"]
    assert level.rows == [
        ["dfp", "cifar10", "lenet", "baseline", "best-3 acc %", "72.00 [71.50, 72.50]", "3", DEVICE, "75.15", "-3.15",
         "paper's"],
        ["dfp", "cifar10", "lenet", "dfp", "best-3 acc %", "71.00 [70.60, 71.40]", "3", DEVICE, "74.72", "-3.72",
         "paper's"],
        ["wus", "cifar10", "alexnet", "baseline", "final acc %", "66.00", "1", DEVICE, "86.86", "-20.86", "paper's"],
        ["wus", "cifar10", "alexnet", "wus", "final acc %", "67.00 (sd 0.40)", "2", DEVICE, "86.27", "-19.27",
         "paper's"],
    ]  # fmt: skip
    assert "Our baselines against the papers': DFP's -3.15 to -3.15 points (1 network), WUS's -20.86 to -20.86 " \
           "points (1 network)." in level.note  # fmt: skip
    assert "final-epoch accuracy under each: cifar10/alexnet dfp 76.00, wus 66.00." in level.note
    assert "40 of the papers' 44 accuracies have no run at the paper's setting." in level.note
    assert "### Accuracy against the papers'" in text and "(figures/ledger_accuracy.png)" in text

    def panels(name: str) -> list:
        return [a for a in figures[name].axes if a.get_visible() and a.get_title()]

    axes = panels("ledger_accuracy.png")
    assert [a.get_title() for a in axes] == ["DFP, cifar10: best-3 acc %", "WUS, cifar10: final acc %"]
    dots = [bars.lines[0].get_xydata()[0][0] for bars in axes[1].containers if bars.get_label() == "ours"]
    stars = [line.get_xydata()[0][0] for line in axes[1].lines if line.get_label() == "paper"]
    assert dots == [67.0, 66.0] and stars == [86.27, 86.86]  # the table's first on top
    assert not [line for ax in axes for line in ax.lines if line.get_label() == "paper ± tolerance"]
    bands = [line for ax in panels("ledger_claims.png") for line in ax.lines if line.get_label() == "paper ± tolerance"]
    assert bands  # the claims keep theirs


def test_the_claims_figure_draws_each_claim_that_ran_against_the_paper_with_its_verdict():
    """ledger_claims.png: a panel per kind of claim, a line per claim that ran (not the ones not yet run), ours at
    its interval (±1 sd with 2 seeds) in its verdict's color, the paper's figure inside its tolerance band."""
    from matplotlib.colors import to_hex

    from cheaptrain.aggregate import load_published
    from cheaptrain.report.claims import CLAIMS_FIGURE

    two_seeds = claim_row(
        "alexnet", "wus", study="wus", own_time_saving_pct=(48.0, 47.4, 48.7), updated_params_reduction_pct=70.5
    ) | {"seeds": 2, "updated_params_reduction_pct_std": 0.7}
    rows_runs = [
        (claim_row("lenet", "dfp", acc_delta=(-0.81, 1.08), own_time_saving_pct=(13.0, 12.2, 13.9),
                   compute_saving_pct=12.7), None),
        (two_seeds, None),
    ]  # fmt: skip
    summary = [row for row, _ in rows_runs]
    text, _, figures = paper_scale(summary, [run_of(row) for row, _ in rows_runs], load_published(PUBLISHED), AGREE)
    assert f"(figures/{CLAIMS_FIGURE})" in text and text.count(CLAIMS_FIGURE) == 1
    axes = [ax for ax in figures[CLAIMS_FIGURE].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["accuracy Δ (points)", TIME_CLAIM, "updated-parameter reduction %"]
    labels = [[t.get_text() for t in ax.get_yticklabels()] for ax in axes]
    bottom_up = [
        ["cifar10 · lenet · dfp"],
        ["cifar10 · alexnet · wus", "cifar10 · lenet · dfp"],
        ["cifar10 · alexnet · wus"],
    ]
    assert labels == bottom_up  # y counts from the bottom: the table's first claim is on top

    def drawn(ax, y: int) -> dict[str, tuple]:
        """Per color, the x extent of what is drawn at row y."""
        extents = {}
        for line in ax.get_lines():
            xs, ys = line.get_xdata(), line.get_ydata()
            if len(ys) and all(v == y for v in ys):
                extents.setdefault(to_hex(line.get_color()), []).extend(float(x) for x in xs)
        for bars in ax.collections:  # the errorbars' horizontal lines
            for segment in bars.get_segments():
                if all(v == y for v in segment[:, 1]):
                    extents.setdefault(to_hex(bars.get_color()[0]), []).extend(segment[:, 0].tolist())
        return {color: (min(xs), max(xs)) for color, xs in extents.items()}

    green, red, grey = to_hex("tab:green"), to_hex("tab:red"), to_hex("0.85")
    accuracy, time, reduction = (drawn(ax, 0) for ax in axes)
    assert accuracy[green] == pytest.approx((-0.81 - 1.08, -0.81 + 1.08))  # within 0.5 of -0.43: green
    assert accuracy[grey] == pytest.approx((-0.43 - 0.5, -0.43 + 0.5))
    assert time[red] == pytest.approx((47.4, 48.7))  # bottom row: alexnet, 10.5 points below the paper's 58.5
    assert time[grey] == pytest.approx((58.5 - 3, 58.5 + 3))
    assert reduction[red] == pytest.approx((69.8, 71.2))  # 2 seeds: ±1 sd; 74 - 70.5 > 3: outside
    assert drawn(axes[1], 1)[green] == pytest.approx((12.2, 13.9))


def test_the_claims_figure_says_so_when_no_claim_has_run():
    from cheaptrain.aggregate import load_published
    from cheaptrain.report.claims import CLAIMS_FIGURE

    _, _, figures = paper_scale([], [], load_published(PUBLISHED), AGREE)
    (ax,) = [ax for ax in figures[CLAIMS_FIGURE].axes if ax.get_visible()]
    assert [t.get_text() for t in ax.texts] == ["No published claim has been run at the paper's setting yet."]


def test_the_claims_figures_one_legend_lies_beside_the_panels_and_hides_no_dot():
    """A dot at a panel's top right corner (as VGG-11's WUS reduction, 79.0 against 74) stays in sight: the legend,
    one for all panels, lies outside every panel, each label once."""
    from cheaptrain.report.figures import claims_figure

    def point(panel: str, label: str, ours: float, paper: float, verdict: str, color: str) -> dict:
        return dict(panel=panel, label=label, ours=ours, lo=None, hi=None, paper=paper, tolerance=3.0,
                    verdict=verdict, color=color)  # fmt: skip

    points = [
        point("accuracy Δ (points)", "vgg11 · wus", -0.10, -0.67, "outside tolerance", "tab:red"),
        point("accuracy Δ (points)", "alexnet · wus", 0.2, -0.59, "within tolerance", "tab:green"),
        point("reduction %", "vgg11 · wus", 79.0, 74.0, "outside tolerance", "tab:red"),
        point("reduction %", "alexnet · wus", 75.4, 74.0, "within noise", "tab:orange"),
    ]
    fig = claims_figure(points, "claims")
    fig.draw_without_rendering()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    legends = [ax.get_legend() for ax in panels if ax.get_legend()] + fig.legends
    assert len(legends) == 1
    (legend,) = legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert sorted(labels) == sorted(["paper ± tolerance", "paper", "outside tolerance", "within tolerance",
                                     "within noise"])  # fmt: skip
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in panels)


def collapse(folder: Path, from_epoch: int = 30) -> None:
    """The entry's network stops learning at `from_epoch` and sits at chance (10%) to its end, as AlexNet's baseline of
    seed 11 did at lr 0.1 for 15 epochs: its history and metrics rewritten as the train stage would write them."""
    history = read_csv(folder / "history.csv")
    for r in history[from_epoch - 1 :]:
        r["test_acc"] = "10.0"
    with open(folder / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    accs = [float(r["test_acc"]) for r in history]
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics |= {"final_acc": accs[-1], "best_acc": max(accs), "best3_acc": sum(sorted(accs)[-3:]) / 3}
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_a_run_that_ended_at_chance_is_left_out_of_every_figure_and_named(tmp_path):
    """AlexNet's baseline of seed 3 and WUS+LR's of seed 2 collapse: the baseline's figures are over seeds 0-2, WUS's
    accuracy Δ over its seeds whose baseline learned ('3 of 4') while its own time saved is over all 4, WUS+LR's
    figures leave out its own seed 2 as well; the report names both runs and says why a Δ is missing. VGG-11's only
    baseline collapses: its method has no Δ, the summary round-trips a row with no accuracy."""
    from cheaptrain.aggregate import load_published

    for method in ("baseline", "wus", "wus_lr"):
        for seed in (0, 1, 2, 3):
            folder = write_entry(tmp_path, "wus", "alexnet", method, seed)
            if (method, seed) in (("baseline", 3), ("wus_lr", 2)):
                collapse(folder)
        folder = write_entry(tmp_path, "wus", "vgg11", method, 0)
        if method == "baseline":
            collapse(folder)
    runs = ledger_runs(tmp_path)
    summary = summarize(runs, {})
    rows = {(r["model"], r["method"]): r for r in summary}
    base, wus, wus_lr = (rows["alexnet", m] for m in ("baseline", "wus", "wus_lr"))
    assert (base["seeds"], base["collapsed_seeds"]) == (3, "3")
    learned = [r.metrics["final_acc"] for r in runs if (r.model, r.method) == ("alexnet", "baseline") and r.seed < 3]
    assert base["acc_mean"] == pytest.approx(sum(learned) / 3)
    assert (wus["seeds"], wus["paired_seeds"], wus["baseline_collapsed_seeds"]) == (4, 3, "3")
    assert "unpaired_seeds" not in wus and "collapsed_seeds" not in wus
    assert wus["acc_delta_mean"] == pytest.approx(-0.7)  # a +60-point Δ against the collapsed baseline is not in it
    assert wus["own_time_saving_pct_ci95"] is not None and wus["updated_params_reduction_pct_mean"] > 70
    assert (wus_lr["seeds"], wus_lr["collapsed_seeds"], wus_lr["paired_seeds"]) == (3, "2", 2)
    assert wus_lr["baseline_collapsed_seeds"] == "3" and wus_lr["acc_delta_mean"] == pytest.approx(-0.5)
    vgg_base, vgg_wus = rows["vgg11", "baseline"], rows["vgg11", "wus"]
    assert (vgg_base["seeds"], vgg_base["collapsed_seeds"]) == (0, "0") and "acc_mean" not in vgg_base
    assert vgg_base["source"] == "ledger"  # not a grid's configuration, which the gate would check
    assert "acc_delta_mean" not in vgg_wus and vgg_wus["baseline_collapsed_seeds"] == "0"
    (tmp_path / "summary.csv").write_text(summary_csv(summary))
    read = {(r["model"], r["method"]): r for r in read_summary(tmp_path / "summary.csv")}
    assert read["vgg11", "baseline"]["collapsed_seeds"] == "0" and "acc_mean" not in read["vgg11", "baseline"]
    assert read["alexnet", "wus_lr"]["baseline_collapsed_seeds"] == "3"
    figures = headline(summary)["ledger"]["wus"]  # `dvc metrics show`: how many seeds ended at chance, never `{}`
    assert figures["cifar10-vgg11-baseline"] == {"collapsed_seeds": 1}
    assert figures["cifar10-alexnet-wus_lr"]["collapsed_seeds"] == 1 and "acc" in figures["cifar10-alexnet-wus_lr"]
    assert "collapsed_seeds" not in figures["cifar10-alexnet-wus"]

    markdown, tables, _ = paper_scale(summary, runs, load_published(PUBLISHED), AGREE)
    table = tables[0]
    claims = {(r[2], r[3], r[4]): r for r in table.rows if r[1] == "cifar10"}
    assert claims["alexnet", "wus", "accuracy Δ (points)"][6] == "3 of 4"
    assert claims["alexnet", "wus", TIME_CLAIM][6] == "4"
    assert claims["alexnet", "wus_lr", "accuracy Δ (points)"][6] == "2 of 3 (+ seed 2 at chance)"
    assert claims["alexnet", "wus_lr", TIME_CLAIM][6] == "3 (+ seed 2 at chance)"
    assert claims["vgg11", "wus", "accuracy Δ (points)"][5] == "— (the baseline of seed 0 ended at chance)"
    assert "left out of every figure: wus cifar10/alexnet/baseline seed 3 (final 10.00%), wus " in markdown
    assert "wus cifar10/alexnet/wus_lr seed 2 (final 10.00%), wus cifar10/vgg11/baseline seed 0" in markdown
    (level,) = [t for t in tables if t.slug == "ledger_accuracy"]
    vgg11 = next(r for r in level.rows if r[2:4] == ["vgg11", "baseline"])
    assert vgg11[5:7] == ["— (its seed 0 ended at chance)", "0"] and vgg11[9] == "—"
    alexnet_base = next(r for r in level.rows if r[2:4] == ["alexnet", "baseline"])
    assert alexnet_base[6] == "3 (+ seed 3 at chance)"
    (cost,) = [t for t in tables if t.slug == "ledger_accuracy_vs_cost"]
    seeds = {r[3]: r[5] for r in cost.rows if r[1] == "alexnet"}
    assert seeds == {"wus": "4", "wus_lr": "3 (+ seed 2 at chance)"}
    assert "wus_lr: Δ -0.50 points (2 of 3 seeds) (seed 2 ended at chance, left out) at " in cost.note
    gap = base["acc_mean"] - 86.86  # AlexNet's baseline over its seeds that learned, against the paper's
    assert f"Our baselines against the papers': WUS's {gap:+.2f} to {gap:+.2f} points (1 network)." in level.note


def test_a_run_whose_loss_diverged_is_left_out_as_one_that_ended_at_chance_and_named(tmp_path):
    """AlexNet's WUS+LR seed 2 diverged in epoch 6: the ledger keeps its 5 epochs before, all above chance, with
    diverged_epoch 6. It is left out of every figure as a run that ended at chance, named with the epoch its loss
    diverged in, and its configuration's epochs stay its recipe's 200."""
    from cheaptrain.aggregate import load_published

    for method in ("baseline", "wus_lr"):
        for seed in (0, 1, 2, 3):
            diverged = (method, seed) == ("wus_lr", 2)
            folder = write_entry(tmp_path, "wus", "alexnet", method, seed, epochs=5 if diverged else 200)
            if diverged:
                metrics = json.loads((folder / "metrics.json").read_text()) | {"diverged_epoch": 6}
                (folder / "metrics.json").write_text(json.dumps(metrics))
    runs = ledger_runs(tmp_path)
    (stopped,) = [r for r in runs if "diverged_epoch" in r.metrics]
    assert stopped.metrics["final_acc"] > 40 and collapsed(stopped)
    assert not any(collapsed(r) for r in runs if r is not stopped)
    summary = summarize(runs, {})
    wus_lr = next(r for r in summary if r["method"] == "wus_lr")
    assert (wus_lr["seeds"], wus_lr["collapsed_seeds"], wus_lr["paired_seeds"], wus_lr["epochs"]) == (3, "2", 3, 200)
    markdown, _, _ = paper_scale(summary, runs, load_published(PUBLISHED), AGREE)
    assert "left out of every figure: wus cifar10/alexnet/wus_lr seed 2 (loss diverged in epoch 6)." in markdown


def test_a_grid_whose_baseline_ended_at_chance_is_reported_and_gated_and_drawn_without_it(
    tmp_path, monkeypatch, empty_store
):
    """params.yaml trains one seed, so one baseline at chance leaves its configuration without an accuracy: the stage
    still writes everything, the findings and the gate say which seeds ended at chance (the baseline's, a method's
    own), and no figure or curve draws a collapsed run (WUS's baseline: seed 0's curve alone)."""
    from cheaptrain.aggregate import load_published
    from cheaptrain.check import evaluate, load_gate
    from cheaptrain.report.figures import curves_csv, figures, png
    from cheaptrain.report.stage import write_results

    params = {"grid": {
        "dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline", "dfp"], "seeds": [0]},
        "wus": {"datasets": ["cifar10"], "models": ["alexnet"], "methods": ["baseline", "wus"], "seeds": [0, 1]},
    }}  # fmt: skip
    at_chance = {("dfp", "baseline", 0), ("wus", "baseline", 1), ("wus", "wus", 0), ("wus", "wus", 1)}
    for study, grid in params["grid"].items():
        for method in grid["methods"]:
            for seed in grid["seeds"]:
                recipe = paper_recipe(study, epochs=10, lr=0.02)
                folder = write_entry(tmp_path / "runs", study, grid["models"][0], method, seed, recipe, epochs=10)
                if (study, method, seed) in at_chance:
                    collapse(folder, from_epoch=5)
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    out = tmp_path / "results"
    summary, _ = write_results(params, tmp_path / "runs", PUBLISHED, out, tmp_path / "ledger")

    report = (out / "report.md").read_text()
    assert "- DFP cifar10/lenet/baseline: its seed 0 ended at chance.\n" in report  # the paper has a figure
    assert "- DFP cifar10/lenet/dfp: no accuracy Δ (the baseline of seed 0 ended at chance); time saved" in report
    assert "- WUS cifar10/alexnet/wus: its seeds 0, 1 all ended at chance.\n" in report
    gate = load_gate({"check": {"min_acc": {"baseline": 40.0}, "max_acc_drop": {"dfp": 1.0, "wus": 2.0}}})
    failed = [(c.config, c.check) for c in evaluate(read_summary(out / "summary.csv"), gate) if c.status == "FAIL"]
    assert ("dfp cifar10/lenet/baseline", "accuracy: its seed 0 ended at chance") in failed
    assert ("dfp cifar10/lenet/dfp", "accuracy drop vs baseline: the baseline of seed 0 ended at chance") in failed
    assert ("wus cifar10/alexnet/wus", "accuracy drop vs baseline: its seeds 0, 1 all ended at chance") in failed

    runs = collect(params, tmp_path / "runs")
    learned = [r for r in runs if not collapsed(r)]
    curves = sorted(path.name for path in (out / "curves").glob("*.csv"))
    assert curves == ["dfp-cifar10-lenet-dfp.csv", "wus-cifar10-alexnet-baseline.csv"]
    (wus_baseline,) = [r for r in learned if (r.study, r.method) == ("wus", "baseline")]
    assert (out / "curves" / curves[1]).read_text() == curves_csv([wus_baseline])
    drawn = (out / "figures" / "test_acc.png").read_bytes()
    assert drawn == png(figures(summary, learned)["test_acc.png"]) != png(figures(summary, runs)["test_acc.png"])
    assert load_published(PUBLISHED)[("dfp", "cifar10", "lenet", "baseline", "accuracy_best3")] == 75.15
