"""The results ledger: a finished run recorded by the pipeline, reused when it matches, named when it does not,
imported into MLflow once."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from reliability_methods import Poison

from cheaptrain import UserError, ledger, timing
from cheaptrain.aggregate import collapsed, ledger_runs
from cheaptrain.data import load_split
from cheaptrain.methods import METHODS
from cheaptrain.papers import PAPERS
from cheaptrain.prepare import write_prepared
from cheaptrain.runner import Recorder, checkpoint_path, code_version, fit, train_run
from cheaptrain.tracking import INTERRUPTS
from cheaptrain.trainer import TrainingDiverged

from conftest import REPO, small_config, synthetic_split

TRAIN, TEST = synthetic_split(128, seed=1), synthetic_split(64, seed=2)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SMALL_PAPER = {"epochs": 2, "batch_size": 32, "lr": 0.05, "milestones": [2], "gamma": 0.1}  # small_config's


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A folder to run in: tiny prepared data, an empty default MLflow store; the DFP paper's setting made small
    (the ledger keeps runs at a paper's setting only)."""
    monkeypatch.setitem(PAPERS["dfp"], "recipe", PAPERS["dfp"]["recipe"] | SMALL_PAPER)
    for var in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "CHEAPTRAIN_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    splits = {"train": (TRAIN.images, TRAIN.labels), "test": (TEST.images, TEST.labels)}
    write_prepared(tmp_path / "data/prepared/cifar10", splits, TRAIN.classes, {"source": "synthetic"})
    return tmp_path


def config(**changes):
    return dataclasses.replace(small_config(epochs=2, study="dfp"), **({"ledger": "record", "threads": 1} | changes))


def mlflow_runs(name: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dfp")
    return client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")


def test_a_finished_run_is_recorded_with_where_it_came_from_and_indexed(repo):
    final = train_run(config())
    entry = ledger.read_entry(repo / "ledger/dfp/cifar10-lenet-baseline-s7")
    assert entry.metrics == final
    assert [row["epoch"] for row in entry.history] == [1, 2] and "train_flops" in entry.history[0]
    info = entry.info
    assert info["config"]["recipe"]["epochs"] == 2 and info["code_version"] == code_version("baseline")
    assert info["device"].startswith("cpu") and info["torch_version"] == torch.__version__
    assert info["threads"] == [1] and len(info["data_digest"]) == 16
    run_history = repo / "runs/dfp/cifar10-lenet-baseline-s7/history.csv"
    assert run_history.read_text() == (entry.path / "history.csv").read_text()
    index = json.loads((repo / "ledger/metrics.json").read_text())
    assert index["dfp"]["cifar10-lenet-baseline-s7"]["final_acc"] == final["final_acc"]
    # the live MLflow run is the entry's: importing into the same store adds nothing
    assert ledger.import_entry(entry) == (info["mlflow_run_id"], False)
    assert len(mlflow_runs("cifar10-lenet-baseline-s7")) == 1


def test_a_matching_entry_is_reused_without_training(repo, monkeypatch):
    first = train_run(config())
    monkeypatch.setattr("cheaptrain.runner.fit", lambda *a, **k: pytest.fail("trained again"))
    (repo / "runs").rename(repo / "runs-before")
    again = train_run(config(threads=2, device="cpu", eval_batch_size=500))  # how it runs is not matched
    assert again == first
    assert (repo / "runs/dfp/cifar10-lenet-baseline-s7/metrics.json").is_file()
    assert not list(repo.glob("checkpoints/*/*"))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"recipe": "nesterov"}, "recipe.nesterov: False in the entry, True now"),  # the paper does not say
        ({"seed": 8}, "seed: 7 in the entry, 8 now"),
    ],
)
def test_an_entry_trained_differently_is_named_not_reused_nor_retrained(repo, monkeypatch, change, named):
    train_run(config())
    entry = repo / "ledger/dfp/cifar10-lenet-baseline-s7"
    recorded = (entry / "run.json").read_text()
    cfg = config()
    if "recipe" in change:
        cfg = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, nesterov=True))
    else:  # the same run name (another entry would be looked up), another seed inside
        cfg = dataclasses.replace(cfg, **change)
        entry = entry.rename(repo / "ledger/dfp/cifar10-lenet-baseline-s8")
    monkeypatch.setattr("cheaptrain.runner.fit", lambda *a, **k: pytest.fail("trained again"))
    with pytest.raises(UserError) as info:
        train_run(cfg)
    assert named in str(info.value) and "train.ledger: retrain" in str(info.value)
    assert (entry / "run.json").read_text() == recorded


def test_other_training_code_is_named(repo):
    train_run(config())
    with pytest.raises(UserError, match=r"training code: version \w+ \(commit .*\) in the entry, 0000 now"):
        ledger.find(config(), "0000", None)


def test_an_entry_trained_on_other_prepared_data_is_named_not_reused(repo, monkeypatch):
    """The same params on other arrays (prepare.py decoding otherwise, another archive): not the entry's run."""
    train_run(config())
    recorded = ledger.read_entry(repo / "ledger/dfp/cifar10-lenet-baseline-s7").info["data_digest"]
    other = synthetic_split(128, seed=3)
    splits = {"train": (other.images, other.labels), "test": (TEST.images, TEST.labels)}
    write_prepared(repo / "data/prepared/cifar10", splits, TRAIN.classes, {"source": "synthetic"})
    monkeypatch.setattr("cheaptrain.runner.fit", lambda *a, **k: pytest.fail("trained again"))
    with pytest.raises(UserError, match=rf"prepared data: digest {recorded} in the entry, (?!{recorded})\w{{16}} in "):
        train_run(config())


def test_a_run_on_part_of_the_training_images_is_neither_matched_nor_recorded(repo, monkeypatch, capsys):
    """download.<dataset>.train_size keeps part of the images: not the paper's setting, whatever the recipe."""
    train_run(config(), track=False)
    entry = repo / "ledger/dfp/cifar10-lenet-baseline-s7"
    recorded = (entry / "run.json").read_text()
    half = {"train": (TRAIN.images[:60], TRAIN.labels[:60]), "test": (TEST.images, TEST.labels)}
    subset = {"train_subset": {"train_size": 60, "archive_train_count": 128}}
    write_prepared(repo / "data/prepared/cifar10", half, TRAIN.classes, {"source": "synthetic"} | subset)
    assert ledger.find(config(), code_version("baseline"), None) is None  # not a mismatch: the ledger is not for it
    final = train_run(config(ledger="retrain"), track=False)  # trained, and the entry of every image kept
    assert "not recorded in the ledger, which keeps runs at a paper's setting only (the first 60 training images" in (
        capsys.readouterr().err
    )
    assert (entry / "run.json").read_text() == recorded and final != ledger.read_entry(entry).metrics


def test_another_networks_model_arguments_do_not_change_a_runs_entry(repo):
    train_run(config(), track=False)
    (entry,) = ledger.entries()
    cfg = config()
    vgg = dataclasses.replace(cfg.recipe, model_args={"vgg11": {"batch_norm": False}})
    other = dataclasses.replace(cfg, recipe=vgg)
    assert ledger.differences(entry, other, code_version("baseline")) == []
    own = dataclasses.replace(other, model_args={"width": 2})
    assert ledger.differences(entry, own, code_version("baseline")) == ["model_args.width: None in the entry, 2 now"]


def test_a_run_not_at_its_papers_setting_is_neither_recorded_nor_matched(repo, capsys):
    cfg = config()
    other = dataclasses.replace(cfg, recipe=dataclasses.replace(cfg.recipe, lr=0.07))
    train_run(other, track=False)
    assert "not recorded in the ledger, which keeps runs at a paper's setting only (lr 0.07 (paper: 0.05))" in (
        capsys.readouterr().err
    )
    assert not ledger.entries()
    train_run(cfg, track=False)  # the paper's setting: recorded
    assert ledger.find(other, code_version("baseline"), None) is None  # its entry is not this run's, nor a mismatch


def test_retrain_replaces_the_entry(repo, monkeypatch):
    train_run(config())
    before = ledger.read_entry(repo / "ledger/dfp/cifar10-lenet-baseline-s7").info["mlflow_run_id"]
    fits = []

    def counted(*args, **kwargs):
        fits.append(args[0])
        return fit(*args, **kwargs)

    monkeypatch.setattr("cheaptrain.runner.fit", counted)
    train_run(config(ledger="retrain"))
    assert len(fits) == 1  # trained again, the entry not reused
    (entry,) = ledger.entries()
    assert entry.path == repo / "ledger/dfp/cifar10-lenet-baseline-s7"
    assert entry.info["mlflow_run_id"] not in ("", before)  # the new run's


def test_a_run_that_diverges_at_its_papers_setting_is_kept_as_a_run_that_ended_at_chance(repo, monkeypatch, capsys):
    """Poison's loss becomes NaN in epoch 3, every time. Not at a paper's setting the run stops with the checkpoint of
    epoch 2; at it (3 epochs here), resumed from that checkpoint, it diverges again and its 2 epochs become its outputs
    and ledger entry, diverged_epoch 3 in its metrics, its MLflow run finished with them, no checkpoint left: the stage
    ends without an error, the report counts it as a run that ended at chance, and run again it reuses the entry."""
    monkeypatch.setitem(METHODS, "poison", Poison)
    monkeypatch.setattr(Poison, "name", "poison")
    cfg = dataclasses.replace(small_config(epochs=3, study="dfp", method="poison"), ledger="record", threads=1)
    with pytest.raises(TrainingDiverged, match="became nan in epoch 3"):
        train_run(cfg)  # the paper's setting here has 2 epochs: not recorded
    assert checkpoint_path(cfg).is_file() and not ledger.entries()
    monkeypatch.setitem(PAPERS["dfp"], "recipe", PAPERS["dfp"]["recipe"] | {"epochs": 3})
    final = train_run(cfg)
    err = capsys.readouterr().err
    assert "resuming after epoch 2" in err and "warning: cifar10-lenet-poison-s7: the training loss became nan in " \
        "epoch 3" in err and "Its 2 epochs before it are kept as its outputs and ledger entry" in err  # fmt: skip
    entry = ledger.read_entry(repo / "ledger/dfp/cifar10-lenet-poison-s7")
    assert entry.metrics == final and final["diverged_epoch"] == 3 and final["epochs"] == 2
    assert [row["epoch"] for row in entry.history] == [1, 2]  # the resumed epochs, from the checkpoint
    for name in ledger.FILES:
        assert (repo / "runs/dfp/cifar10-lenet-poison-s7" / name).read_bytes() == (entry.path / name).read_bytes()
    assert not checkpoint_path(cfg).exists()
    (run,) = mlflow_runs("cifar10-lenet-poison-s7")
    assert run.info.status == "FINISHED" and run.data.metrics["diverged_epoch"] == 3
    assert run.data.metrics["final_acc"] == final["final_acc"]
    (recorded,) = ledger_runs()
    assert collapsed(recorded)  # whatever its epoch 2's accuracy
    ledger.main(["list"])
    assert ", 2 epochs (loss diverged in epoch 3), cpu" in capsys.readouterr().out
    monkeypatch.setattr("cheaptrain.runner.fit", lambda *a, **k: pytest.fail("trained again"))
    assert train_run(cfg) == final and len(mlflow_runs("cifar10-lenet-poison-s7")) == 1


def test_without_mlflow_an_entry_is_written_and_imported_once_later(repo):
    final = train_run(config(), track=False)
    assert not (repo / "mlflow.db").exists()
    (entry,) = ledger.entries()
    assert entry.info["mlflow_run_id"] == ""
    run_id, imported = ledger.import_entry(entry)
    assert imported and ledger.import_entry(entry) == (run_id, False)
    (run,) = mlflow_runs("cifar10-lenet-baseline-s7")
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    assert run.info.status == "FINISHED" and run.data.tags["ledger_entry"] == entry.id
    assert run.data.params["recipe.epochs"] == "2" and run.data.metrics["final_acc"] == final["final_acc"]
    assert [m.step for m in client.get_metric_history(run_id, "test_acc")] == [1, 2]
    assert {a.path for a in client.list_artifacts(run_id)} == {"history.csv", "run.json"}
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "cifar10" and dataset.dataset.digest == entry.info["data_digest"]
    experiment = client.get_experiment_by_name("dfp")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_two_processes_that_import_one_entry_at_once_add_one_run(repo, monkeypatch):
    """Runs that reuse one entry at once (queued experiments) each import it: the store gets it once. Each search
    waits for the other's before it returns, which stands in for the race: without the lock both would find no run,
    and both would add one; with it the second waits for the first's import, and the first's wait runs out."""
    import threading

    from mlflow import MlflowClient

    train_run(config(), track=False)
    (entry,) = ledger.entries()
    search = MlflowClient.search_runs
    both_searched = threading.Barrier(2, timeout=3)

    def slow_search(self, *args, **kwargs):
        found = search(self, *args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):  # the other is held at the lock: no race
            both_searched.wait()
        return found

    monkeypatch.setattr(MlflowClient, "search_runs", slow_search)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ledger.import_entry(entry))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    (run,) = mlflow_runs("cifar10-lenet-baseline-s7")
    assert sorted(results, key=lambda r: r[1]) == [(run.info.run_id, False), (run.info.run_id, True)]


def test_the_import_command_adds_every_entry_once(repo, capsys):
    train_run(config(), track=False)
    train_run(config(seed=8), track=False)
    ledger.main(["import"])
    ledger.main(["import"])
    out = capsys.readouterr().out
    assert "2 of 2 ledger entries imported" in out and "0 of 2 ledger entries imported" in out
    assert len(mlflow_runs("cifar10-lenet-baseline-s7")) == len(mlflow_runs("cifar10-lenet-baseline-s8")) == 1


def test_a_broken_entry_is_a_clear_error(repo):
    train_run(config(), track=False)
    (repo / "ledger/dfp/cifar10-lenet-baseline-s7/metrics.json").unlink()
    with pytest.raises(UserError, match=r"missing metrics\.json; an entry holds run\.json, metrics\.json"):
        ledger.entries()


def test_an_import_stopped_part_way_is_done_again_and_the_part_marked_failed(repo, monkeypatch):
    from mlflow import MlflowClient

    train_run(config(), track=False)
    (entry,) = ledger.entries()

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(MlflowClient, "log_artifact", interrupt)
        with pytest.raises(KeyboardInterrupt):
            ledger.import_entry(entry)
    run_id, imported = ledger.import_entry(entry)
    assert imported and ledger.import_entry(entry) == (run_id, False)
    statuses = {run.info.run_id: run.info.status for run in mlflow_runs("cifar10-lenet-baseline-s7")}
    assert statuses.pop(run_id) == "FINISHED" and list(statuses.values()) == ["FAILED"]


def test_a_failed_record_leaves_no_staging_folder(repo, monkeypatch):
    train_run(config(), track=False)
    copy = shutil.copy2

    def disk_full(source, target):
        if Path(target).name == "history.csv":
            raise OSError(28, "No space left on device")
        return copy(source, target)

    monkeypatch.setattr(shutil, "copy2", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ledger.record(config().out_dir, config(), None)
    assert [p.name for p in (repo / "ledger/dfp").iterdir()] == ["cifar10-lenet-baseline-s7"]


def test_a_record_whose_index_fails_keeps_the_new_entry_and_no_copy_of_the_old(repo, monkeypatch):
    train_run(config(), track=False)
    (config().out_dir / "metrics.json").write_text(json.dumps({"final_acc": 12.5, "epochs": 2}))

    def index_fails(root=None):
        raise UserError("ledger entry ledger/dfp/other: metrics.json is not a mapping")

    monkeypatch.setattr(ledger, "write_index", index_fails)
    with pytest.raises(UserError, match="is not a mapping"):
        ledger.record(config().out_dir, config(), None)
    assert [p.name for p in (repo / "ledger/dfp").iterdir()] == ["cifar10-lenet-baseline-s7"]
    assert json.loads((repo / "ledger/dfp/cifar10-lenet-baseline-s7/metrics.json").read_text())["final_acc"] == 12.5


def test_a_record_whose_swap_fails_puts_the_old_entry_back(repo, monkeypatch):
    train_run(config(), track=False)
    old = (repo / "ledger/dfp/cifar10-lenet-baseline-s7/metrics.json").read_text()
    (config().out_dir / "metrics.json").write_text(json.dumps({"final_acc": 12.5, "epochs": 2}))
    rename = Path.rename

    def staging_fails(self, target):
        if self.name.startswith(".cifar10-lenet-baseline-s7.") and ".replaced." not in self.name:
            raise OSError(5, "Input/output error")
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", staging_fails)
    with pytest.raises(OSError, match="Input/output error"):
        ledger.record(config().out_dir, config(), None)
    assert [p.name for p in (repo / "ledger/dfp").iterdir()] == ["cifar10-lenet-baseline-s7"]
    assert (repo / "ledger/dfp/cifar10-lenet-baseline-s7/metrics.json").read_text() == old


def test_a_signal_during_the_swap_interrupts_once_the_index_lists_the_new_entry(repo, monkeypatch):
    """SIGTERM is held back while the entry is swapped in and the index rewritten: a later run only reuses the entry,
    and would never rewrite an index that lacks it."""
    train_run(config(), track=False)
    (config().out_dir / "metrics.json").write_text(json.dumps({"final_acc": 12.5, "epochs": 2}))
    rename = Path.rename

    def signalled(self, target):
        if self.name.startswith(".cifar10-lenet-baseline-s7.") and ".replaced." not in self.name:
            INTERRUPTS.handle(signal.SIGTERM, None)  # as stages/train.py's handler gets it
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", signalled)
    with pytest.raises(KeyboardInterrupt, match=f"signal {int(signal.SIGTERM)}"):
        ledger.record(config().out_dir, config(), None)
    index = json.loads((repo / "ledger/metrics.json").read_text())
    assert index["dfp"]["cifar10-lenet-baseline-s7"]["final_acc"] == 12.5
    assert [p.name for p in (repo / "ledger/dfp").iterdir()] == ["cifar10-lenet-baseline-s7"]


def test_a_staging_folder_left_by_a_killed_record_is_not_an_entry(repo):
    train_run(config(), track=False)
    shutil.copytree(repo / "ledger/dfp/cifar10-lenet-baseline-s7", repo / "ledger/dfp/.cifar10-lenet-baseline-s7.0a1b")
    assert [entry.name for entry in ledger.entries()] == ["cifar10-lenet-baseline-s7"]


def test_an_entry_has_the_permissions_the_umask_gives(repo):
    train_run(config(), track=False)
    umask = os.umask(0o027)
    try:
        path = ledger.record(config().out_dir, config(), None)
    finally:
        os.umask(umask)
    assert path is not None and path.stat().st_mode & 0o777 == 0o750


def test_an_entry_is_reused_on_a_machine_without_mlflow(repo, monkeypatch, capsys):
    final = train_run(config(), track=False)
    for name in ["mlflow", *[name for name in sys.modules if name.startswith("mlflow.")]]:
        monkeypatch.setitem(sys.modules, name, None)  # importing MLflow fails, as where PyTorch alone is installed
    assert train_run(config()) == final
    assert "MLflow is not installed: the ledger entry is not imported" in capsys.readouterr().err
    assert not (repo / "mlflow.db").exists()


def test_a_failure_after_training_marks_the_mlflow_run_failed_and_the_rerun_finishes_it(repo, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(ledger, "record", disk_full)
        with pytest.raises(OSError, match="No space left"):
            train_run(config())
    (run,) = mlflow_runs("cifar10-lenet-baseline-s7")
    assert run.info.status == "FAILED"
    train_run(config())  # resumes after the last epoch and records
    (run,) = mlflow_runs("cifar10-lenet-baseline-s7")
    assert run.info.status == "FINISHED" and ledger.entries()[0].info["mlflow_run_id"] == run.info.run_id


def killed_once_recorded(monkeypatch: pytest.MonkeyPatch, cfg) -> None:
    """Train `cfg` and stop it as a kill's handler would, its ledger entry recorded and its MLflow run not yet
    finished: the checkpoint stays."""

    def killed(*args, **kwargs):
        raise SystemExit(143)

    with monkeypatch.context() as patched:
        patched.setattr("cheaptrain.tracking.RunTracker.finish", killed)
        with pytest.raises(SystemExit):
            train_run(cfg)


def test_a_run_stopped_after_recording_its_entry_leaves_no_checkpoint_once_reused(repo, monkeypatch):
    """Killed between its entry and removing its checkpoint: the rerun reuses the entry and removes the checkpoint of
    the finished run; a retrain's unfinished checkpoint beside a matching entry stays, to resume."""

    ckpt = checkpoint_path(config())
    killed_once_recorded(monkeypatch, config())
    assert ledger.entries() and ckpt.is_file()
    train_run(config())  # the entry reused
    assert not ckpt.exists() and not ckpt.with_suffix(".lock").exists()

    def one_epoch(cfg, train, test, method, resume, epoch_end, processes):
        def end(*args, **kwargs):
            epoch_end(*args, **kwargs)
            raise SystemExit(143)

        return fit(cfg, train, test, method, resume, end, processes)

    with monkeypatch.context() as patched:
        patched.setattr("cheaptrain.runner.fit", one_epoch)
        with pytest.raises(SystemExit):
            train_run(config(ledger="retrain"))
    assert ckpt.is_file()
    train_run(config())  # the entry reused; the retrain's epoch kept
    assert ckpt.is_file()


def test_a_run_killed_after_recording_its_entry_is_marked_killed_once_reused_and_the_entry_imported(repo, monkeypatch):
    """SIGKILL between the entry and the end of its MLflow run leaves that run RUNNING, tagged as the entry's source,
    for ever: the reuse that removes its checkpoint marks it KILLED (abandoned), and the entry comes in as a finished
    run of its own."""
    from mlflow import MlflowClient

    killed_once_recorded(monkeypatch, config())
    (live,) = mlflow_runs("cifar10-lenet-baseline-s7")
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    client.update_run(live.info.run_id, status="RUNNING")  # as SIGKILL leaves it: nothing could mark it
    assert checkpoint_path(config()).is_file()
    train_run(config())  # the entry reused
    runs = {run.info.run_id: run for run in mlflow_runs("cifar10-lenet-baseline-s7")}
    killed_run = runs.pop(live.info.run_id)
    assert killed_run.info.status == "KILLED" and "before its run finished" in killed_run.data.tags["abandoned"]
    ((imported_id, imported),) = runs.items()
    assert imported.info.status == "FINISHED" and "imported_from" in imported.data.tags
    assert ledger.import_entry(ledger.entries()[0]) == (imported_id, False)


def test_a_diverged_run_stopped_after_recording_its_entry_leaves_no_checkpoint_once_reused(repo, monkeypatch):
    """Its entry holds the epochs before the divergence, fewer than the recipe's: the checkpoint of those epochs is
    the finished run's all the same, and goes once the entry is reused (`--running` would list it as stopped)."""
    monkeypatch.setitem(METHODS, "poison", Poison)
    monkeypatch.setattr(Poison, "name", "poison")
    monkeypatch.setitem(PAPERS["dfp"], "recipe", PAPERS["dfp"]["recipe"] | {"epochs": 3})
    cfg = dataclasses.replace(small_config(epochs=3, study="dfp", method="poison"), ledger="record", threads=1)

    killed_once_recorded(monkeypatch, cfg)  # diverges in epoch 3; its 2 epochs recorded, then killed
    assert [len(e.history) for e in ledger.entries()] == [2] and checkpoint_path(cfg).is_file()
    monkeypatch.setattr("cheaptrain.runner.fit", lambda *a, **k: pytest.fail("trained again"))
    assert train_run(cfg)["diverged_epoch"] == 3  # the entry reused
    assert not checkpoint_path(cfg).exists() and not checkpoint_path(cfg).with_suffix(".lock").exists()


def test_a_run_whose_first_checkpoint_fails_is_marked_failed_not_left_running(repo, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Recorder, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train_run(config())
    (run,) = mlflow_runs("cifar10-lenet-baseline-s7")
    assert run.info.status == "FAILED"
    assert list((repo / "checkpoints").rglob("*.*")) == []


@pytest.mark.parametrize(
    ("file", "change", "problem"),
    [
        ("metrics.json", lambda m: list(m), "metrics.json is not a mapping"),
        ("metrics.json", lambda m: m | {"final_acc": "73.8"}, "metrics.json final_acc is not a number"),
        ("run.json", lambda i: i | {"config": "dfp"}, "run.json config is not a mapping"),
        ("run.json", lambda i: i | {"config": {}}, "run.json config lacks study or it is not a string"),
        ("run.json", lambda i: i | {"config": i["config"] | {"study": ["dfp"]}}, "config lacks study or it is not"),
        ("run.json", lambda i: i | {"name": 7}, "run.json name is not a string"),
        ("run.json", lambda i: i | {"machines": "cpu"}, "run.json machines is not a list of mappings, each with its"),
        ("run.json", lambda i: i | {"machines": [{"device": "cpu"}]}, "machines is not a list of mappings, each with"),
    ],
)
@pytest.mark.parametrize("command", ["list", "index", "import"])
def test_a_malformed_entry_is_a_clear_error_naming_it(repo, file, change, problem, command):
    train_run(config(), track=False)
    path = repo / "ledger/dfp/cifar10-lenet-baseline-s7"
    (path / file).write_text(json.dumps(change(json.loads((path / file).read_text()))))
    with pytest.raises(UserError, match=rf"ledger entry {path}: .*{re.escape(problem)}"):
        ledger.main([command])


def test_load_split_reads_the_prepared_data(repo):  # the data the entries' digest is of
    assert len(load_split(repo / "data/prepared/cifar10", "train").labels) == 128


def test_the_aggregate_reads_a_recorded_run_as_the_pipeline_wrote_it(repo):
    final = train_run(config(), track=False)
    (run,) = ledger_runs()
    assert (run.study, run.name, run.source) == ("dfp", "cifar10-lenet-baseline-s7", "ledger")
    assert run.metrics["final_acc"] == final["final_acc"] and run.device.startswith("cpu")
    assert [row["epoch"] for row in run.history] == [1.0, 2.0] and run.history[0]["train_flops"] > 0


def test_list_and_the_aggregate_say_when_an_entry_trained_on_several_machines(repo, capsys):
    train_run(config(), track=False)
    path = repo / "ledger/dfp/cifar10-lenet-baseline-s7/run.json"
    info = json.loads(path.read_text())
    ledger.main(["list"])
    assert f", 2 epochs, {info['device']}, commit " in capsys.readouterr().out
    (machine,) = info["machines"]  # resumed after epoch 1 on a CPU of the same name with AVX2 alone
    path.write_text(json.dumps(info | {"machines": [machine, machine | {"from_epoch": 2, "cpu_capability": "AVX2"}]}))
    ledger.main(["list"])
    assert f", 2 epochs, 2 machines, the last {info['device']}, commit " in capsys.readouterr().out
    (run,) = ledger_runs()
    assert run.trained_on == (f"{info['device']} with {machine['cpu_capability']} from epoch 1, {info['device']} "
                              "with AVX2 from epoch 2")  # fmt: skip
    ledger.main(["import"])
    (imported,) = mlflow_runs("cifar10-lenet-baseline-s7")
    assert imported.data.tags["machines"] == run.trained_on


def test_timing_prints_each_kinds_median_seconds_of_the_repository_entries(monkeypatch, capsys):
    """The per-epoch medians docs/measured.md quotes, from the committed entries: DFP's pruned epochs train fewer
    samples than its full ones; the medians are of the epochs after the first, seconds as measured."""
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(REPO)
    timing.main(["dfp/cifar10-vgg16-dfp-s0", "wus/cifar10-lenet-baseline-s0"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("2 entries;") and len(lines) == 5  # a header, the DFP entry's two kinds, the baseline
    with open(REPO / "ledger/dfp/cifar10-vgg16-dfp-s0/history.csv", newline="") as f:
        rows = list(csv.DictReader(f))[1:]
    for line, pruned in zip(lines[1:3], (False, True), strict=True):
        seconds = [float(r["epoch_train_s"]) for r in rows if (int(r["trained_samples"]) < 50000) == pruned]
        epochs, work, median, of_full = line.split()[-4:]
        assert int(epochs) == len(seconds) and float(median) == round(statistics.median(seconds), 3)
        assert (work, of_full) == ("0.70", "0.71") if pruned else (work, of_full) == ("1.00", "1.00")
    assert lines[3].startswith("wus/cifar10-lenet-baseline-s0") and lines[3].split()[-4:-2] == ["199", "1.00"]
    with pytest.raises(UserError, match="no ledger entry holds those words"):
        timing.main(["no-such-entry"])


_NO_MLFLOW_NOR_DVC = """
import runpy, sys
sys.modules["mlflow"] = sys.modules["dvc"] = None  # as on a machine that has PyTorch alone: importing them fails
from cheaptrain.papers import PAPERS
PAPERS["dfp"]["recipe"] |= {"epochs": 2, "batch_size": 32, "milestones": [1]}  # the paper's setting, made small
sys.argv = ["stages/train.py", "--study", "dfp", "--dataset", "cifar10", "--model", "lenet", "--method", "baseline",
            "--seed", "0", "--params", "params.yaml"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_machine_without_mlflow_and_dvc_trains_and_records_a_ledger_entry(repo):
    shutil.copytree(REPO / "stages", repo / "stages")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"] |= {"device": "cpu", "threads": 1, "ledger": "record"}
    params["recipes"]["dfp"] |= {"epochs": 2, "batch_size": 32, "milestones": [1]}
    params["download"]["datasets"] = ["cifar10"]
    params["grid"] = {"dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline"], "seeds": [0]}}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    done = subprocess.run([sys.executable, "-c", _NO_MLFLOW_NOR_DVC], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "MLflow is not installed: this run is not tracked" in done.stderr
    (entry,) = ledger.entries(repo / "ledger")
    assert entry.name == "cifar10-lenet-baseline-s0" and entry.info["mlflow_run_id"] == ""
    assert not (repo / "mlflow.db").exists()


def test_make_gpu_ledger_trains_its_runs_at_once_without_mlflow_and_fails_when_one_of_them_fails(repo):
    """`make gpu-ledger` (docs/gpu.md, for a machine with PyTorch alone): one process per named method, each with its
    log; one failed run fails the command, and the others still finish."""
    shutil.copytree(REPO / "stages", repo / "stages")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"] |= {"device": "cpu", "threads": 1, "ledger": "ignore"}
    params["recipes"]["dfp"] |= {"epochs": 2, "batch_size": 32, "milestones": [1]}
    params["grid"]["dfp"] |= {"models": ["lenet"], "methods": ["baseline"]}
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    make = ["make", "--no-print-directory", "-f", str(REPO / "Makefile"), "-C", str(repo), f"PYTHON={sys.executable}"]
    usage = subprocess.run([*make, "gpu-ledger", "STUDY=dfp", "MODEL=lenet"], capture_output=True, text=True)
    assert usage.returncode != 0 and "usage: make gpu-ledger" in usage.stdout
    names = ["gpu-ledger", "STUDY=dfp", "MODEL=lenet", "METHODS=baseline no_such_method"]
    done = subprocess.run([*make, *names], capture_output=True, text=True)
    assert done.returncode != 0, done.stdout + done.stderr
    assert json.loads((repo / "runs/dfp/cifar10-lenet-baseline-s0/metrics.json").read_text())["epochs"] == 2
    assert "dfp/cifar10-lenet-baseline-s0: final" in done.stdout  # each run's last line, once all have ended
    assert "no_such_method" in (repo / "gpu-ledger/dfp-cifar10-lenet-no_such_method-s0.log").read_text()
    assert not (repo / "mlflow.db").exists()


def test_make_ledger_trains_the_one_run_it_names_through_the_pipeline_and_needs_every_name():
    make = ["make", "--no-print-directory", "-C", str(REPO), "-o", ".venv/bin/.installed"]
    missing = subprocess.run([*make, "ledger", "STUDY=wus", "MODEL=alexnet"], capture_output=True, text=True)
    assert missing.returncode != 0 and "usage: make ledger STUDY=dfp|wus" in missing.stdout
    names = ["STUDY=wus", "MODEL=alexnet", "METHOD=wus_lr", "SEED=2", "CIFAR10=/data/c10.tar.gz"]
    shown = subprocess.run([*make, "-n", "ledger", *names], capture_output=True, text=True, check=True).stdout
    command = shown.replace("\\\n", " ").splitlines()[-1].split()
    assert command[command.index("exp") :][:4] == ["exp", "run", "--temp", "-n"] and command[-1] == "train_wus"
    overrides = {command[i + 1].strip("'") for i, word in enumerate(command) if word == "-S"}
    assert overrides == {
        "download.datasets=[cifar10]", "download.cifar10.source=/data/c10.tar.gz", "grid.dfp.datasets=[cifar10]",
        "grid.wus.datasets=[cifar10]",  # every grid's datasets must be downloaded: CIFAR-10 alone for both
        "grid.wus.models=[alexnet]", "grid.wus.methods=[wus_lr]", "grid.wus.seeds=[2]", "train.threads=1",
        "train.ledger=record",
    }  # fmt: skip
