"""DVC experiments outside the workspace (`dvc exp run --queue`, `--temp`) run in temporary copies of the repository;
their MLflow runs and artifacts must still land in the workspace's store."""

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import copy_repo, run_in

pytestmark = pytest.mark.e2e
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def tiny_archive(path: Path, per_class: dict[str, int]) -> Path:
    """An image-folder archive like the shared CIFAR-10 one, with a few random 32x32 images per class."""
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for split, count in per_class.items():
            for cls in CLASSES:
                for i in range(count):
                    data = io.BytesIO()
                    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(data, "PNG")
                    info = tarfile.TarInfo(f"tiny/{split}/{cls}/{i:04d}.png")
                    info.size = len(data.getvalue())
                    tar.addfile(info, io.BytesIO(data.getvalue()))
    return path


def test_queued_and_temp_experiments_log_to_the_workspace_store(tmp_path):
    from mlflow import MlflowClient

    repo = copy_repo(tmp_path / "repo")
    archive = tiny_archive(tmp_path / "tiny.tar.gz", {"train": 20, "test": 5})
    settings = [
        f"download.cifar10.source={archive}", "download.cifar10.sha256=null", "download.datasets=[cifar10]",
        "grid.dfp.models=[lenet]", "grid.dfp.methods=[baseline]", "grid.wus.datasets=[cifar10]",
        "grid.wus.models=[lenet]", "grid.wus.methods=[baseline]", "recipes.dfp.epochs=2", "recipes.dfp.milestones=[1]",
        "recipes.wus.epochs=2", "recipes.wus.step_size=1",
    ]  # fmt: skip
    args = [a for s in settings for a in ("-S", s)]
    stages = ["train_dfp", "train_wus"]  # and the download they depend on: the stages that train and log runs
    run_in(repo, "dvc", "exp", "run", "--queue", "-n", "queued-exp", *args, *stages)
    run_in(repo, "dvc", "exp", "run", "--run-all")
    run_in(repo, "dvc", "exp", "run", "--temp", "-n", "temp-exp", *args, "-S", "grid.dfp.seeds=[1]", *stages)

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    experiments = {e.name: e for e in client.search_experiments()}
    assert {"dfp", "wus"} <= set(experiments)
    for name in ("dfp", "wus"):  # artifacts beside the workspace store, never in DVC's temporary copies
        assert experiments[name].artifact_location == (repo / "mlartifacts" / name).as_uri()
    runs = client.search_runs([experiments["dfp"].experiment_id, experiments["wus"].experiment_id])
    by_exp: dict[str, list] = {}
    for run in runs:
        by_exp.setdefault(run.data.tags["dvc_exp"], []).append(run)
    assert sorted(by_exp) == ["queued-exp", "temp-exp"]
    assert sorted(r.info.run_name for r in by_exp["queued-exp"]) == ["cifar10-lenet-baseline-s0"] * 2
    # only the dfp seed changed: DVC restores the unchanged wus run from its run cache instead of training it again
    assert [r.info.run_name for r in by_exp["temp-exp"]] == ["cifar10-lenet-baseline-s1"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc")] == [1, 2]
        artifact_dir = Path(run.info.artifact_uri.removeprefix("file://"))
        assert artifact_dir.is_relative_to(repo / "mlartifacts") and (artifact_dir / "history.csv").is_file()
    assert not (repo / "runs").exists(), "a --temp/--queue experiment must not write into the workspace"
    listed = run_in(repo, "dvc", "exp", "list", "--name-only").stdout.split()
    assert sorted(listed) == ["queued-exp", "temp-exp"]
