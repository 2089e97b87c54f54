"""End to end: the README's quick command on the real CIFAR-10 (the `quick` fixture of conftest.py): MLflow store,
outputs, DVC state."""

import json

import pytest
import yaml

from conftest import grid, read_csv, run_in

pytestmark = pytest.mark.e2e


def test_the_quickstart_leaves_the_checkout_as_it_found_it(quick):
    assert (quick / "quick.status").read_text() == "", "make quickstart modified tracked files"
    assert run_in(quick, "git", "status", "--porcelain", "ledger").stdout == "", "the quick setting records nothing"


def test_quick_setting_is_lenet_on_cifar10_for_ten_epochs(quick):
    runs = list(grid(quick))
    assert runs and all("cifar10-lenet-" in name and epochs == 10 for _, name, epochs in runs)


def test_every_run_is_in_mlflow_with_params_tags_per_epoch_metrics_and_history(quick):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{quick / 'mlflow.db'}")
    for study, name, epochs in grid(quick):
        experiment = client.get_experiment_by_name(study)
        assert experiment.artifact_location == (quick / "mlartifacts" / study).as_uri()
        found = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
        assert len(found) == 1, f"{study}/{name}: {len(found)} MLflow runs"
        run = found[0]
        assert run.info.status == "FINISHED"
        assert run.data.params["recipe.epochs"] == str(epochs)
        assert run.data.params["dataset"] == "cifar10" and run.data.params["model"] == "lenet"
        tags = run.data.tags
        assert tags["dvc_stage"] == f"train_{study}@{name.replace('-s0', '-0')}"
        assert tags["dvc_exp"] and len(tags["git_commit"]) == 40
        assert tags["device"].startswith("cpu") and tags["torch_version"] and tags["cpu_capability"]
        for metric in ("train_loss", "train_acc", "test_loss", "test_acc", "lr", "epoch_train_s", "eval_s",
                       "trained_samples"):  # fmt: skip
            steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
            assert sorted(steps) == list(range(1, epochs + 1)), f"{name} {metric}: steps {steps}"
        for metric in ("final_acc", "best_acc", "best3_acc", "train_time_s", "wall_time_s"):
            assert metric in run.data.metrics
        assert any(k.startswith("system/") for k in run.data.metrics), "no system metrics"
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"history.csv", "run.json"} <= artifacts
        metrics = json.loads((quick / "runs" / study / name / "metrics.json").read_text())
        assert metrics["final_acc"] == pytest.approx(run.data.metrics["final_acc"])


def test_lenet_reaches_56_percent_within_10_epochs_on_half_of_the_training_images(quick):
    for study, name, _ in grid(quick):
        if name.endswith("baseline-s0"):
            history = read_csv(quick / "runs" / study / name / "history.csv")
            assert len(history) == 10 and {row["trained_samples"] for row in history} == {"25000"}
            assert max(float(row["test_acc"]) for row in history) >= 56, f"{study}/{name}"


def test_results_have_one_row_per_configuration(quick):
    rows = [r for r in read_csv(quick / "results" / "summary.csv") if r["source"] != "ledger"]  # the ledger's own
    assert {(r["study"], f"{r['dataset']}-{r['model']}-{r['method']}-s0") for r in rows} == {
        (study, name) for study, name, _ in grid(quick)
    }
    assert "| study |" in (quick / "results" / "report.md").read_text()


def test_dvc_is_clean_and_a_second_repro_does_nothing(quick):
    assert "up to date" in run_in(quick, "dvc", "status").stdout
    again = run_in(quick, "dvc", "repro")
    assert "Running stage" not in again.stdout, again.stdout
    assert "up to date" in run_in(quick, "dvc", "status").stdout


def test_a_changed_recipe_reruns_only_its_own_study(quick):
    params_file = quick / "params.yaml"
    original = params_file.read_text()
    try:
        params = yaml.safe_load(original)
        params["recipes"]["wus"]["lr"] = 0.05
        params_file.write_text(yaml.safe_dump(params, sort_keys=False))
        changed = json.loads(run_in(quick, "dvc", "status", "--json").stdout)
        assert changed and all(stage.startswith("train_wus@") for stage in changed), changed
        assert len(changed) == sum(1 for study, _, _ in grid(quick) if study == "wus")
    finally:
        params_file.write_text(original)
