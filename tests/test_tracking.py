"""The MLflow store (issues 15, 19): processes that open a new SQLite store at once create its tables one at a time
and all log every epoch; a store whose migration was interrupted is refused at start in one clear error; every
experiment is a model-training one, every run names its dataset; the download and check stages log their runs.
Tiny synthetic data and LeNet; the real stages run in throwaway copies of the repository, or in this process where
nothing depends on a process of their own."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_reliability import (
    assert_each_epoch_once,
    make_repo,
    only_run,
    run_args,
    small_params,
    stage_env,
    train_cmd,
    train_in_process,
    write_data,
)

from cheaptrain import UserError
from cheaptrain.data import prepared_digest
from cheaptrain.prepare import write_prepared
from cheaptrain.tracking import (
    EXPERIMENT_KIND,
    DatasetRef,
    Interrupts,
    RunTracker,
    dataset_ref,
    device_name,
    ensure_experiment,
    log_stage_run,
    stage_tags,
    tracking_uri,
)

from conftest import REPO, read_csv, run_in, run_stage, synthetic_split

SEEDS = tuple(range(4))  # more processes than cores: without the store's lock they migrate it together


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    """An SQLite store with MLflow's tables: creating them takes seconds, so tests copy it."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


# --- many processes at once ----------------------------------------------------------------------------------


def two_epoch_repo(path: Path, seeds: tuple[int, ...] = SEEDS) -> Path:
    """A throwaway repository whose grid is `seeds` baseline LeNet runs of 2 epochs each, with no store of its own."""
    repo = make_repo(path, None, methods=("baseline",), seeds=seeds)
    params = small_params(epochs=2, methods=("baseline",), seeds=seeds)
    params["recipes"]["dfp"]["milestones"] = [1]
    params["recipes"]["wus"]["step_size"] = 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return repo


def train_at_once(repo: Path, logs: Path, env: dict[str, str], seeds: tuple[int, ...] = SEEDS) -> list[str]:
    """Start one `stages/train.py` process per seed together, wait for all; returns each one's output."""
    logs.mkdir()
    env = stage_env(**env)
    procs = []
    for seed in seeds:
        with open(logs / f"s{seed}.log", "w") as log:
            cmd = train_cmd("baseline", seed)
            procs.append(subprocess.Popen(cmd, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT))
    for proc in procs:
        proc.wait(timeout=600)
    outputs = [(logs / f"s{seed}.log").read_text() for seed in seeds]
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output
        assert "Traceback" not in output and "error:" not in output, output
    return outputs


def assert_every_epoch_of_every_run(store: str, repo: Path, seeds: tuple[int, ...] = SEEDS) -> None:
    for seed in seeds:
        name = f"cifar10-lenet-baseline-s{seed}"
        run = only_run(store, name)
        assert run.info.status == "FINISHED", name
        assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["cifar10"], name  # they raced to add it
        history = read_csv(repo / "runs" / "dfp" / name / "history.csv")
        assert [row["epoch"] for row in history] == ["1", "2"]
        assert_each_epoch_once(store, run, history)


def tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_four_processes_create_a_new_sqlite_store_together_and_log_every_epoch(tmp_path):
    """MLflow creates and migrates a new store's tables in whichever process opens it first; without the
    lock beside it, four at once migrate it together ("duplicate column name: step", "table _alembic_tmp_tags already
    exists") and leave it half-migrated."""
    repo = two_epoch_repo(tmp_path / "repo")
    (tmp_path / "stores").mkdir()
    path = tmp_path / "stores" / "new.db"
    store = f"sqlite:///{path}"
    outputs = train_at_once(repo, tmp_path / "logs", {"MLFLOW_TRACKING_URI": store})
    for output in outputs:
        assert "already exists" not in output and "duplicate column" not in output and "locked" not in output.lower()
    assert_every_epoch_of_every_run(store, repo)
    assert not {t for t in tables(path) if t.startswith("_alembic_tmp_")}
    assert (tmp_path / "stores" / ".new.db.lock").exists()
    assert not (repo / "mlflow.db").exists()  # the store named by MLFLOW_TRACKING_URI, nothing else


# --- a half-migrated store -----------------------------------------------------------------------------------


def mlflow_revisions() -> tuple[str, str]:
    """(MLflow's head schema revision, the one before it)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    scripts = ScriptDirectory.from_config(_get_alembic_config(""))
    head = scripts.get_revision(scripts.get_current_head())
    return head.revision, head.down_revision


def break_store(path: Path, how: str) -> None:
    """What an interrupted migration leaves, or a store of another MLflow."""
    statements = {
        "leftover-table": "CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER NOT NULL, name VARCHAR(256))",
        "older-revision": f"UPDATE alembic_version SET version_num = '{mlflow_revisions()[1]}'",
        "no-revision": "DELETE FROM alembic_version",
        "unknown-revision": "UPDATE alembic_version SET version_num = '0123456789ab'",
    }
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(statements[how])


BROKEN = [  # (how, what the error says)
    ("leftover-table", "is half-migrated: a migration of its MLflow schema was interrupted (leftover tables "
     "_alembic_tmp_experiments). Restore a backup of {path}, or move the file away to start a new, empty store"),
    ("no-revision", "is half-migrated: a migration of its MLflow schema was interrupted (tables, but no schema "
     "revision). Restore a backup of {path}"),
    ("older-revision", "has the MLflow schema revision {older}, not {head}, the one MLflow"),
    ("unknown-revision", "has the MLflow schema revision 0123456789ab, which MLflow"),
]  # fmt: skip


@pytest.mark.parametrize(("how", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_half_migrated_store_is_refused_in_one_error_naming_the_file_and_left_as_it_is(
    tmp_path, monkeypatch, empty_store, how, expected
):
    path = tmp_path / "store.db"
    shutil.copy(empty_store, path)
    break_store(path, how)
    before = path.read_bytes()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    with pytest.raises(UserError) as info:
        RunTracker("dfp")
    message = str(info.value)
    head, older = mlflow_revisions()
    assert f"cannot use the MLflow tracking store 'sqlite:///{path}': {path} " in message
    assert expected.format(path=path, head=head, older=older) in message, message
    assert "\n" not in message and message.endswith("Stopped before any work.")
    assert "Fix MLFLOW_TRACKING_URI" not in message  # the URI is right; the file is what needs the repair
    assert path.read_bytes() == before


_KILLED_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 1")  # pages spill into the file before the commit: its journal is needed to undo them
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE experiments SET name = name || '-half-written'")
db.execute("CREATE TABLE filler (x)")
db.executemany("INSERT INTO filler VALUES (?)", [(str(i) * 50,) for i in range(20000)])
os.kill(os.getpid(), signal.SIGKILL)  # mid-transaction: its journal stays behind, hot
"""


def test_a_store_whose_writer_was_killed_mid_transaction_opens_and_is_rolled_back(tmp_path, monkeypatch, empty_store):
    path = tmp_path / "store.db"
    shutil.copy(empty_store, path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{path}")
    ensure_experiment("dfp")
    subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path)], check=False)
    assert Path(f"{path}-journal").exists()  # what a SIGKILLed run can leave, the checkpoint resuming it
    RunTracker("dfp")  # no "attempt to write a readonly database": the journal is rolled back
    assert sqlite3.connect(path).execute("SELECT name FROM experiments WHERE name = 'dfp'").fetchall() == [("dfp",)]


def test_the_stage_refuses_a_half_migrated_default_store_with_exit_2_before_any_training(
    tmp_path, monkeypatch, empty_store
):
    write_data(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_params(methods=("baseline",)), sort_keys=False))
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    break_store(tmp_path / "mlflow.db", "leftover-table")
    result = train_in_process(monkeypatch, tmp_path, *run_args("baseline"))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"{tmp_path / 'mlflow.db'} is half-migrated" in errors[0], result.stderr
    assert not list(tmp_path.glob("checkpoints/**/*.pt")) and not (tmp_path / "runs").exists()


# --- what the MLflow UI shows --------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path, monkeypatch, empty_store) -> str:
    """A copy of the empty store, named by MLFLOW_TRACKING_URI."""
    shutil.copy(empty_store, tmp_path / "store.db")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    return uri


def test_every_experiment_it_creates_or_uses_is_a_model_training_one(store):
    """MLflow 3 opens an experiment without the kind on its (empty) GenAI traces view."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    older = client.create_experiment("dfp")  # as this project created them before
    assert "mlflow.experimentKind" not in client.get_experiment(older).tags
    assert ensure_experiment("dfp") == older
    new = ensure_experiment("wus")
    for experiment_id in (older, new):
        tags = client.get_experiment(experiment_id).tags
        assert tags["mlflow.experimentKind"] == EXPERIMENT_KIND["mlflow.experimentKind"] == "custom_model_development"


def test_experiments_of_any_sqlite_store_keep_their_artifacts_beside_it(tmp_path, monkeypatch, empty_store):
    """Not in ./mlruns of the current folder, which `dvc exp run --temp` deletes with its copy of the repository."""
    from mlflow import MlflowClient

    for folder in ("stores", "elsewhere"):
        (tmp_path / folder).mkdir()
    shutil.copy(empty_store, tmp_path / "stores" / "other.db")
    uri = f"sqlite:///{tmp_path / 'stores' / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    experiment = MlflowClient(uri).get_experiment(ensure_experiment("dfp"))
    assert experiment.artifact_location == (tmp_path / "stores" / "mlartifacts" / "dfp").as_uri()


def test_a_relative_sqlite_store_is_the_repository_roots_also_from_a_temporary_copy(tmp_path, monkeypatch):
    """`dvc exp run --temp` runs a stage in a copy it deletes afterwards, with DVC_ROOT the workspace: a store named
    sqlite:///mine.db, as `mlflow ui --backend-store-uri sqlite:///mlflow.db` names it, is the workspace's file."""
    for folder in ("workspace", "copy"):
        (tmp_path / folder).mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mine.db?timeout=30")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "workspace"))
    monkeypatch.chdir(tmp_path / "copy")
    assert tracking_uri() == f"sqlite:///{tmp_path / 'workspace' / 'mine.db'}?timeout=30"
    ensure_experiment("dfp")
    assert (tmp_path / "workspace/mine.db").is_file() and not list((tmp_path / "copy").iterdir())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'copy' / 'mine.db'}")  # absolute: as it is
    assert tracking_uri() == f"sqlite:///{tmp_path / 'copy' / 'mine.db'}"


@pytest.mark.parametrize(
    ("failure", "error", "message", "status"),
    [
        ("the store refuses", UserError, "cannot log the check run check to the MLflow store", "FAILED"),
        ("a full disk", OSError, "No space left on device", "FAILED"),
        ("Ctrl-C", KeyboardInterrupt, None, "KILLED"),
    ],
)
def test_a_stage_run_that_fails_as_it_logs_is_marked_failed_or_killed_not_left_running(
    store, monkeypatch, failure, error, message, status
):
    from mlflow import MlflowClient

    params = {"bad@name": 1} if failure == "the store refuses" else {"name": 1}  # MLflow refuses '@' in a param's name

    def log_table(*args, **kwargs):  # the table's artifact, written after the params
        raise KeyboardInterrupt if error is KeyboardInterrupt else OSError(28, "No space left on device")

    monkeypatch.setattr(MlflowClient, "log_table", log_table)
    with pytest.raises(error, match=message):
        log_stage_run("check", "check", params, {"passed": 1.0}, table=("table.json", {"a": [1]}))
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("check").experiment_id])
    assert run.info.status == status


def test_the_stage_tags_read_the_git_commit_once(monkeypatch):
    from cheaptrain import tracking

    commits = []
    monkeypatch.setattr(tracking, "git_commit", lambda: commits.append(1) or "abc123")
    tags = stage_tags()
    assert tags["git_commit"] == tags["mlflow.source.git.commit"] == "abc123" and commits == [1]


def prepared(root: Path, seed: int, manifest: dict) -> Path:
    split = synthetic_split(40, seed=seed)
    splits = {"train": (split.images, split.labels), "test": (split.images[:10], split.labels[:10])}
    write_prepared(root / "cifar10", splits, split.classes, manifest)
    return root / "cifar10"


def test_the_dataset_of_prepared_data_names_its_source_and_changes_with_the_data(tmp_path):
    archive = {"file": "cifar10-jpg.tar.gz", "sha256": "ab" * 32}
    local = {"dataset": "cifar10", "source": {"param": "torchvision", "env": "/data/cifar10-jpg.tar.gz"}}
    ref = dataset_ref(prepared(tmp_path / "a", 0, local | {"archive": archive}))
    assert (ref.name, ref.source, ref.context) == ("cifar10", "/data/cifar10-jpg.tar.gz", "training")
    assert ref.digest == prepared_digest(tmp_path / "a" / "cifar10")  # the digest a checkpoint records
    assert dataset_ref(prepared(tmp_path / "b", 0, local | {"archive": archive})) == ref  # the same data
    assert dataset_ref(prepared(tmp_path / "c", 1, local | {"archive": archive})).digest != ref.digest

    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    official = {"dataset": "cifar10", "source": {"param": "torchvision", "env": None}, "archive": {"url": url}}
    assert dataset_ref(prepared(tmp_path / "d", 0, official)).source == url


def test_a_new_run_logs_its_dataset_once_and_a_resumed_one_not_again(store):
    from mlflow import MlflowClient

    ref = DatasetRef(name="cifar10", digest="0123abcd0123abcd", source="/data/cifar10-jpg.tar.gz")
    tracker = RunTracker("dfp")
    assert tracker.start("cifar10-lenet-baseline-s0", {"seed": 0}, {"study": "dfp"}, dataset=ref) == 0
    run_id = tracker.run_id
    tracker.fail("KILLED")
    again = RunTracker("dfp")
    again.start("cifar10-lenet-baseline-s0", {"seed": 0}, {"study": "dfp"}, run_id=run_id, dataset=ref)
    again.finish({"final_acc": 50.0}, [])
    assert again.run_id == run_id
    (logged,) = MlflowClient(store).get_run(run_id).inputs.dataset_inputs
    assert (logged.dataset.name, logged.dataset.digest) == ("cifar10", "0123abcd0123abcd")
    assert logged.dataset.source_type == "local" and "/data/cifar10-jpg.tar.gz" in logged.dataset.source
    assert {t.key: t.value for t in logged.tags} == {"mlflow.data.context": "training"}


# --- the download and check stages log their runs ------------------------------------------------------------


def test_the_download_stage_logs_source_checksum_counts_and_seconds(tmp_path, empty_store):
    from mlflow import MlflowClient
    from test_experiments import CLASSES, tiny_archive

    per_class = {"train": 3, "test": 2}
    archive = tiny_archive(tmp_path / "tiny.tar.gz", per_class)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_params(methods=("baseline",))))
    download = REPO / "stages" / "download.py"
    args = ("--dataset", "cifar10")
    env = {"CIFAR10_SOURCE": str(archive), "DVC_STAGE": "download@cifar10"}

    unusable = f"sqlite:///{tmp_path / 'no' / 'such' / 'mlflow.db'}"  # fails before any work: in this process
    result = run_stage(download, *args, cwd=tmp_path, env=env | {"MLFLOW_TRACKING_URI": unusable})
    assert result.returncode == 2 and "error: cannot use the MLflow tracking store" in result.stderr
    assert not (tmp_path / "data").exists()  # failed before the download

    shutil.copy(empty_store, tmp_path / "store.db")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    result = run_in(tmp_path, "python", str(download), *args, env=env | {"MLFLOW_TRACKING_URI": store})
    assert "MLflow: experiment 'download', run " in result.stdout
    client = MlflowClient(store)
    experiments = {e.name: e for e in client.search_experiments()}
    assert {"download", "dfp", "wus"} <= set(experiments)
    for name in ("download", "dfp", "wus"):
        assert experiments[name].tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([experiments["download"].experiment_id])
    assert run.info.run_name == "cifar10" and run.info.status == "FINISHED"
    assert run.data.params["source"] == str(archive)
    assert run.data.params["archive.sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    metrics = run.data.metrics
    for split, count in per_class.items():
        assert metrics[f"images/{split}"] == count * len(CLASSES)
        assert all(metrics[f"images/{split}/{label}"] == count for label in CLASSES)
    assert metrics["prepare_s"] > 0
    assert run.data.tags["dvc_stage"] == "download@cifar10" and run.data.tags["git_commit"]
    (logged,) = run.inputs.dataset_inputs  # as the training runs name it: the same data, the same digest
    assert logged.dataset.name == "cifar10" and str(archive) in logged.dataset.source
    assert logged.dataset.digest == prepared_digest(tmp_path / "data" / "prepared" / "cifar10")


_WITHOUT_MLFLOW = """
import runpy, sys
sys.modules["mlflow"] = sys.modules["dvc"] = None  # as on a machine that has PyTorch alone: importing them fails
sys.argv = sys.argv[1:]  # the script, then its arguments
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("flag", [[], ["--no-mlflow"]])
def test_the_download_stage_prepares_the_data_where_mlflow_is_missing_or_not_wanted(tmp_path, flag):
    """A GPU machine with PyTorch alone prepares the data it trains on with the stage itself, and writes no store."""
    from test_experiments import tiny_archive

    archive = tiny_archive(tmp_path / "tiny.tar.gz", {"train": 3, "test": 2})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_params(methods=("baseline",))))
    download, args = REPO / "stages" / "download.py", ["--dataset", "cifar10", *flag]
    env = {"CIFAR10_SOURCE": str(archive), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    if flag:  # MLflow is there, unused: nothing here depends on the process, so it runs in this one
        done = run_stage(download, *args, cwd=tmp_path, env=env)
    else:  # a new interpreter, which cannot import MLflow
        command = [sys.executable, "-c", _WITHOUT_MLFLOW, str(download), *args]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=os.environ | env)
    assert done.returncode == 0, done.stderr
    assert ("MLflow is not installed: the download is not tracked" in done.stderr) == (not flag)
    assert "cifar10: train 30, test 20 images from" in done.stdout and "MLflow:" not in done.stdout
    assert prepared_digest(tmp_path / "data" / "prepared" / "cifar10")
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()


def test_the_check_stage_gates_where_mlflow_is_missing_and_logs_nothing(tmp_path):
    from test_check import THRESHOLDS, bad, write

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"check": THRESHOLDS}))
    write(tmp_path / "summary.csv", bad())
    command = [sys.executable, "-c", _WITHOUT_MLFLOW, str(REPO / "stages" / "check.py"), "--out", "check.json",
               "--summary", "summary.csv"]  # fmt: skip
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stderr  # the gate fails, as with MLflow
    assert "MLflow is not installed: the gate is not tracked" in done.stderr and "MLflow:" not in done.stdout
    assert "FAILED: 3 violation(s) of 7 checks" in " ".join(done.stdout.split())
    assert json.loads((tmp_path / "check.json").read_text())["violations"] == 3
    assert not (tmp_path / "mlflow.db").exists()


def test_the_check_stage_logs_each_threshold_value_limit_and_verdict(tmp_path, monkeypatch, empty_store):
    from mlflow import MlflowClient
    from test_check import THRESHOLDS, bad, gate

    shutil.copy(empty_store, tmp_path / "store.db")
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("DVC_STAGE", "check")
    result = gate(tmp_path, bad(), THRESHOLDS, track=True)
    assert result.returncode == 1, result.stdout + result.stderr  # the gate fails; logging it does not
    assert "MLflow: experiment 'check', run " in result.stdout

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("check")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "check" and run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert (metrics["passed"], metrics["checks"], metrics["violations"]) == (0, 7, 3)
    dropped = "dfp cifar10/lenet/dfp accuracy drop vs baseline"
    assert (metrics[f"{dropped}/value"], metrics[f"{dropped}/limit"], metrics[f"{dropped}/pass"]) == (3, 1, 0)
    saved = "wus cifar10/lenet/wus updated-parameter reduction"
    assert (metrics[f"{saved}/value"], metrics[f"{saved}/limit"], metrics[f"{saved}/pass"]) == (60, 50, 1)
    assert run.data.tags["dvc_stage"] == "check" and run.data.tags["git_commit"]
    assert run.data.params["summary"] == "summary.csv"
    table = Path(client.download_artifacts(run.info.run_id, "checks.json", str(tmp_path)))
    assert "accuracy drop vs baseline" in table.read_text()


def test_the_check_stage_fails_early_on_an_unusable_store(tmp_path, monkeypatch):
    from test_check import THRESHOLDS, gate, good

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'no' / 'mlflow.db'}")
    result = gate(tmp_path, good(), THRESHOLDS, track=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: cannot use the MLflow tracking store")
    assert "PASSED" not in result.stdout and not (tmp_path / "check.json").exists()


def test_a_signal_during_a_store_write_interrupts_once_the_write_is_done():
    """An interrupt inside MLflow's SQLite transaction can leave the store locked, so that the run cannot be marked
    KILLED: stages/train.py's handler holds SIGTERM and SIGINT back until the write is done; a second one does not
    wait; outside a write they interrupt at once."""
    import signal

    interrupts = Interrupts()
    done = []
    previous = signal.signal(signal.SIGTERM, interrupts.handle)
    try:
        with pytest.raises(KeyboardInterrupt, match="signal 15"), interrupts.held_back():
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: inside the write
            done.append("the whole write")
        assert done == ["the whole write"]
        with pytest.raises(KeyboardInterrupt, match="signal 2"), interrupts.held_back():
            interrupts.handle(signal.SIGTERM, None)
            interrupts.handle(signal.SIGINT, None)  # a second signal: a store that hangs stays stoppable
            done.append("never")
        assert done == ["the whole write"]
        with interrupts.held_back():
            done.append("no signal: nothing raised")
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            os.kill(os.getpid(), signal.SIGTERM)  # outside a write: at once
            time.sleep(5)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_run_on_the_default_device_auto_is_recorded_under_the_gpus_name_where_there_is_one(monkeypatch):
    """params.yaml's `train.device: auto` trains on CUDA where there is one: run.json, the MLflow tag and the ledger
    name that GPU, not this machine's CPU."""
    cpu = device_name("cpu")
    assert cpu.startswith("cpu: ")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_name("auto") == cpu
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"GPU of {device}")
    assert device_name("auto") == "GPU of cuda"
    assert device_name("cuda:1") == "GPU of cuda:1"
    assert device_name("cpu") == cpu
