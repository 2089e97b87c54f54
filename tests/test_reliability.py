"""Reliability (issue #6): a killed run resumes exactly where it stopped, in the same MLflow run; bad params, a NaN
loss, an unusable MLflow store and failed downloads stop early with one clear error; parallel runs share the SQLite
store. Small synthetic data and LeNet throughout; the real stages run in throwaway copies of the repository, or in
this process where nothing depends on a process of their own."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import http.server
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch
import yaml
from reliability_methods import Poison, Stateful

from cheaptrain import ConfigError, UserError, runner, tracking
from cheaptrain.config import RunConfig, resolve_run, validate_grid
from cheaptrain.methods import METHODS
from cheaptrain.prepare import write_prepared
from cheaptrain.runner import checkpoint_path, train_run
from cheaptrain.tracking import RunTracker, device_name, machines_text
from cheaptrain.trainer import TrainingDiverged, final_metrics, fit

from conftest import (
    REPO,
    REQUIRE_DATA,
    copy_repo,
    read_csv,
    require_archive,
    run_env,
    run_in,
    run_stage,
    synthetic_split,
)

EPOCHS = 6
NAME = "cifar10-lenet-stateful-s0"
TIMINGS = {"epoch_train_s", "eval_s", "train_time_s", "eval_time_s", "wall_time_s"}
TRAIN, TEST = synthetic_split(256, seed=1), synthetic_split(128, seed=2)
# One thread per process: four engineers share two cores, and every run compared must use the same thread count.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """In this process too: the in-process runs compare with each other only, and contend less for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Crash(BaseException):
    """Stands in for a kill inside a test process: nothing in the run catches it."""


# --- set-up ----------------------------------------------------------------------------------------------


def small_params(epochs: int = EPOCHS, methods: tuple[str, ...] = ("stateful",), seeds: tuple[int, ...] = (0,)) -> dict:
    """params.yaml of the repository, shrunk: LeNet, a few epochs, CPU, one dataset."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["download"]["datasets"] = ["cifar10"]
    params["train"]["device"] = "cpu"
    params["train"]["threads"] = 1  # every run compared uses the same thread count: results depend on it
    params["train"]["ledger"] = "ignore"  # the tests train the same runs again and again
    params["recipes"]["dfp"] |= {"epochs": epochs, "batch_size": 32, "lr": 0.02, "milestones": [epochs - 2]}
    params["recipes"]["wus"] |= {"epochs": epochs, "batch_size": 32, "lr": 0.02, "step_size": epochs - 2}
    params["methods"] = (params.get("methods") or {}) | {"stateful": {}, "poison": {}}
    params["grid"] = {
        study: {"datasets": ["cifar10"], "models": ["lenet"], "methods": list(methods), "seeds": list(seeds)}
        for study in ("dfp", "wus")
    }
    return params


def write_data(root: Path, source: str = "synthetic") -> None:
    splits = {"train": (TRAIN.images, TRAIN.labels), "test": (TEST.images, TEST.labels)}
    write_prepared(root / "data" / "prepared" / "cifar10", splits, TRAIN.classes, {"source": source})


def make_repo(path: Path, store: Path | None, **params: object) -> Path:
    """A throwaway copy of the repository with the test methods, tiny prepared data and small params."""
    path.mkdir()
    repo = copy_repo(path)
    shutil.copy(REPO / "tests" / "reliability_methods.py", repo / "src" / "cheaptrain" / "methods")
    write_data(repo)
    (repo / "params.yaml").write_text(yaml.safe_dump(small_params(**params), sort_keys=False))
    if store:
        shutil.copy(store, repo / "mlflow.db")
    return repo


def stage_env(**extra: str) -> dict[str, str]:
    """The environment of conftest.run_in, one thread a run, for processes started with Popen."""
    return run_env(ONE_THREAD | extra)


def run_args(method: str = "stateful", seed: int = 0) -> list[str]:
    return ["--study", "dfp", "--dataset", "cifar10", "--model", "lenet", "--method", method, "--seed", str(seed)]


def train_cmd(method: str = "stateful", seed: int = 0) -> list[str]:
    return ["python", "stages/train.py", *run_args(method, seed)]


def register_test_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test methods in this process's registry, as reliability_methods.py registers them in make_repo's copy."""
    for name, cls in (("stateful", Stateful), ("poison", Poison)):
        monkeypatch.setitem(METHODS, name, cls)
        monkeypatch.setattr(cls, "name", name)


def train_in_process(monkeypatch: pytest.MonkeyPatch, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """stages/train.py run in this process (conftest.run_stage) in `cwd`, as in make_repo's copy: the test methods
    registered. Its malloc setting is left out: process-wide, and it cannot be undone."""
    register_test_methods(monkeypatch)
    monkeypatch.setattr(runner, "keep_freed_memory", lambda: None)
    return run_stage(REPO / "stages" / "train.py", *args, cwd=cwd, env=env)


def results(repo: Path, name: str = NAME) -> tuple[dict, list[dict]]:
    """metrics.json and history.csv of a run, without the timings (the only figures that may differ)."""
    out = repo / "runs" / "dfp" / name
    metrics = json.loads((out / "metrics.json").read_text())
    history = read_csv(out / "history.csv")
    return {k: v for k, v in metrics.items() if k not in TIMINGS}, [
        {k: v for k, v in row.items() if k not in TIMINGS} for row in history
    ]


def only_run(store: str, name: str = NAME):
    """The one MLflow run named `name` in experiment dfp (fails if there are several)."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("dfp")
    runs = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    assert len(runs) == 1, f"{len(runs)} MLflow runs named {name}"
    return runs[0]


def assert_each_epoch_once(store: str, run, history: list[dict]) -> None:
    """Every per-epoch metric of `history` is in the MLflow run exactly once per epoch, with the same value."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    epochs = [int(row["epoch"]) for row in history]
    for key in history[0]:
        if key == "epoch":
            continue
        logged = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in logged) == epochs, f"{key}: steps {sorted(m.step for m in logged)}"
        if key not in TIMINGS:
            values = {m.step: m.value for m in logged}
            assert [values[e] for e in epochs] == pytest.approx([float(row[key]) for row in history]), key


def checkpointed_epochs(repo: Path) -> int:
    """Epochs in the run's checkpoint (0 if there is none yet, or it went away)."""
    try:
        path = next((repo / "checkpoints").glob("*/*.pt"))
        return len(torch.load(path, weights_only=False)["history"])
    except (StopIteration, FileNotFoundError):  # none yet, or deleted at completion (written by a rename: never half)
        return 0


def wait_for_checkpoint(proc: subprocess.Popen, repo: Path, epochs: int) -> None:
    """Wait until the checkpoint of the run that `proc` trains holds `epochs` epochs."""
    deadline = time.monotonic() + 300  # a guard against a hang, not a timing
    while checkpointed_epochs(repo) < epochs:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


# --- resuming a killed run: the real stage, the real kill ---------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory, empty_store) -> tuple[dict, list[dict]]:
    """The uninterrupted run of the stage, in its own copy of the repository; in this process (one thread, as the
    stage's processes train): what is compared is the training's figures, not a process's."""
    repo = make_repo(tmp_path_factory.mktemp("reference") / "repo", empty_store)
    with pytest.MonkeyPatch.context() as patch:
        done = train_in_process(patch, repo, *run_args())
    assert done.returncode == 0, done.stderr
    return results(repo)


def test_a_stage_stopped_by_sigterm_then_killed_by_sigkill_resumes_to_the_uninterrupted_result(
    tmp_path, empty_store, reference
):
    """Two interruptions: SIGTERM (as Ctrl-C: the run is marked KILLED and says where its checkpoint is), then SIGKILL
    in the resumed attempt (nothing can react to it); the third attempt completes the run."""
    repo = make_repo(tmp_path / "repo", empty_store)
    store, slow = f"sqlite:///{repo / 'mlflow.db'}", stage_env(STATEFUL_EPOCH_SLEEP="0.5")
    proc = subprocess.Popen(train_cmd(), cwd=repo, env=slow, stderr=subprocess.PIPE, text=True)
    wait_for_checkpoint(proc, repo, 1)
    proc.terminate()
    stderr = proc.communicate(timeout=300)[1]
    terminated_after = checkpointed_epochs(repo)
    assert proc.returncode == 130, stderr
    assert f"{NAME}: interrupted; the checkpoint of epoch" in stderr and "run again to resume" in stderr
    assert only_run(store).info.status == "KILLED", stderr

    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(train_cmd(), cwd=repo, env=slow, stdout=log, stderr=subprocess.STDOUT)
        wait_for_checkpoint(proc, repo, terminated_after + 1)
        proc.kill()
        proc.wait()
    killed_after = checkpointed_epochs(repo)
    assert killed_after < EPOCHS and not (repo / "runs" / "dfp" / NAME / "metrics.json").exists()
    assert only_run(store).info.status == "RUNNING"  # killed: it could not say so
    ckpt = next((repo / "checkpoints" / "dfp").glob(f"{NAME}-*.pt"))
    wall_before = torch.load(ckpt, weights_only=False)["wall_s"]

    resumed = run_in(repo, *train_cmd(), env=ONE_THREAD)
    assert f"resuming after epoch {killed_after}" in resumed.stderr
    assert results(repo) == reference  # every metric but the timings, every epoch
    assert not list((repo / "checkpoints" / "dfp").iterdir())  # neither the checkpoint nor its lock file

    run = only_run(store)
    assert run.info.status == "FINISHED"
    assert run.data.tags["resumed_after_epochs"] == f"{terminated_after},{killed_after}"
    history = read_csv(repo / "runs" / "dfp" / NAME / "history.csv")
    assert_each_epoch_once(store, run, history)
    metrics = json.loads((repo / "runs" / "dfp" / NAME / "metrics.json").read_text())
    # training time: the epochs that count, whichever attempt ran them; wall time: every attempt
    assert metrics["train_time_s"] == pytest.approx(sum(float(row["epoch_train_s"]) for row in history))
    assert metrics["wall_time_s"] > wall_before
    assert run.data.metrics["final_acc"] == metrics["final_acc"]


def test_dvc_repro_killed_then_run_again_resumes_from_the_checkpoint(tmp_path, empty_store, reference):
    """DVC deletes a stage's outputs before running it; the checkpoint lives outside them and survives."""
    repo = make_repo(tmp_path / "repo", empty_store)
    stage = "train_dfp@cifar10-lenet-stateful-0"
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            ["dvc", "repro", "--single-item", stage],
            cwd=repo,
            env=stage_env(STATEFUL_EPOCH_SLEEP="0.5"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: DVC and the stage die together, as in a crash
        )
        wait_for_checkpoint(proc, repo, 2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed_after = checkpointed_epochs(repo)
    assert killed_after < EPOCHS

    resumed = run_in(repo, "dvc", "repro", "--single-item", stage, env=ONE_THREAD)
    assert f"resuming after epoch {killed_after}" in resumed.stdout + resumed.stderr
    assert results(repo) == reference
    assert "up to date" in run_in(repo, "dvc", "status", stage).stdout
    store = f"sqlite:///{repo / 'mlflow.db'}"
    run = only_run(store)
    assert run.info.status == "FINISHED"
    assert_each_epoch_once(store, run, read_csv(repo / "runs" / "dfp" / NAME / "history.csv"))


# --- resuming: the crash points and checkpoints that need care, in-process ----------------------------------


@pytest.fixture
def workdir(tmp_path, monkeypatch, empty_store) -> Path:
    """The folder a stage runs in (prepared data, an empty default store) as the cwd; the test methods registered."""
    for var in ("MLFLOW_TRACKING_URI", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    write_data(tmp_path)
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    register_test_methods(monkeypatch)
    return tmp_path


def config(method: str = "stateful", lr: float = 0.02) -> RunConfig:
    params = small_params()
    params["recipes"]["dfp"]["lr"] = lr
    return resolve_run(params, "dfp", "cifar10", "lenet", method, 0)


@pytest.fixture(scope="module")
def expected() -> tuple[dict, list[dict]]:
    """The uninterrupted result of config(), from the bare training loop in this process."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(METHODS, "stateful", Stateful)
        method = Stateful()
        history = fit(config(), TRAIN, TEST, method)
    final = final_metrics(history) | method.run_metrics()
    return {k: v for k, v in final.items() if k not in TIMINGS}, [
        {k: v for k, v in row.items() if k not in TIMINGS} for row in history
    ]


def in_process_results(final: dict, workdir: Path) -> tuple[dict, list[dict]]:
    history = read_csv(workdir / "runs" / "dfp" / NAME / "history.csv")
    without = [{k: float(v) for k, v in row.items() if k not in TIMINGS} for row in history]
    return {k: v for k, v in final.items() if k not in TIMINGS}, without


def store_of(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'mlflow.db'}"


def logged_epochs(workdir: Path) -> list[int]:
    from mlflow import MlflowClient

    run = only_run(store_of(workdir))
    return sorted(m.step for m in MlflowClient(store_of(workdir)).get_metric_history(run.info.run_id, "test_acc"))


def crash_at_log_of(epoch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run config() and crash after the checkpoint of `epoch` is written, before the store has the epoch (at the end
    of the next epoch, which waits for that checkpoint's write)."""
    real_log = RunTracker.log_epoch

    def log_or_crash(self, row):
        if row["epoch"] == epoch:
            raise Crash
        real_log(self, row)

    with monkeypatch.context() as patch:
        patch.setattr(RunTracker, "log_epoch", log_or_crash)
        with pytest.raises(Crash):
            train_run(config())


def crash_as_an_epoch_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run config() and crash as its first epoch here starts: killed before it checkpoints an epoch."""

    def crash(self, epoch, lr):
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(Stateful, "on_epoch_start", crash)
        with pytest.raises(Crash):
            train_run(config())


def test_a_run_that_mlflow_left_running_is_marked_killed_in_the_store(workdir, monkeypatch):
    """An interrupt inside MLflow's own calls can leave fluent end_run without effect: fail() checks the store."""
    from mlflow import MlflowClient

    tracker = RunTracker("test")
    tracker.start("cifar10-lenet-stateful-s0", {}, {})
    with monkeypatch.context() as patch:
        patch.setattr(tracker.mlflow, "end_run", lambda status: None)  # the status never reaches the store
        tracker.fail("KILLED")
    status = MlflowClient().get_run(tracker.run_id).info.status
    tracker.mlflow.end_run("KILLED")  # leave no active run behind for the tests that follow in this process
    assert status == "KILLED"


def test_a_crash_between_checkpoint_and_store_logs_the_missing_epoch_on_resume(workdir, monkeypatch, expected):
    crash_at_log_of(3, monkeypatch)
    assert checkpointed_epochs(workdir) == 3 and logged_epochs(workdir) == [1, 2]
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    run = only_run(store_of(workdir))
    assert run.info.status == "FINISHED" and run.data.tags["resumed_after_epochs"] == "3"
    assert_each_epoch_once(store_of(workdir), run, read_csv(workdir / "runs" / "dfp" / NAME / "history.csv"))


def test_a_run_without_a_terminal_logs_a_line_per_epoch_and_its_resume_goes_on_from_there(workdir, monkeypatch, capsys):
    """In a log file (nohup, dvc exp run --temp) no progress bar shows: each epoch is a line, with the time left."""
    line = re.compile(rf"{NAME}: epoch (\d)/{EPOCHS} · train loss \d\.\d{{4}} · test acc \d+\.\d\d% · \d+\.\d s"
                      r"( · [\d,]+ pruned)? · about (\d+ s|\d+ min|\d+ h \d\d min) left$")  # fmt: skip
    crash_at_log_of(3, monkeypatch)  # epoch 3's line printed, its checkpoint written; epoch 4 ends before its line
    train_run(config())
    err = capsys.readouterr().err.splitlines()
    epochs = [int(m.group(1)) for m in map(line.fullmatch, err) if m]
    assert epochs == [1, 2, 3, 4, 5, 6], err
    at = {m.group(1): i for i, m in enumerate(map(line.fullmatch, err)) if m}
    resumed = next(i for i, text in enumerate(err) if "resuming after epoch 3" in text)
    assert at["3"] < resumed < at["4"]
    assert err[at["6"]].endswith("about 0 s left")


def test_train_running_lists_the_runs_under_way_and_whether_a_process_trains_them_now(workdir, monkeypatch):
    """`python stages/train.py --running`: a run killed after epoch 3 is stopped until its command runs again, unless
    other training code, other prepared data or another kind of device wrote its checkpoint."""
    stage = [sys.executable, str(REPO / "stages" / "train.py"), "--running"]
    done = train_in_process(monkeypatch, workdir, "--running")
    assert (done.returncode, done.stdout) == (0, "no run under way (no checkpoint in checkpoints/)\n")
    crash_at_log_of(3, monkeypatch)
    (line,) = runner.runs_under_way("cpu")  # params train.device, as the stage passes it
    acc = torch.load(checkpoint_path(config()), weights_only=False)["history"][-1]["test_acc"]
    assert re.fullmatch(rf"dfp/{NAME}: epoch 3/{EPOCHS}, test acc {acc:.2f}%, written \d{{4}}-\d\d-\d\d \d\d:\d\d UTC, "
                        "stopped: the command that started it resumes it", line)  # fmt: skip
    head = line.split(", stopped")[0]
    with open(checkpoint_path(config()).with_suffix(".lock")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the training process holds it: another process lists it
        done = subprocess.run(stage, capture_output=True, text=True, cwd=workdir, check=True)
    assert done.stdout == f"{head}, training now\n"
    written = checkpoint_path(config()).stat()

    def rewrite(**identity: str) -> None:
        state = torch.load(checkpoint_path(config()), weights_only=False)
        torch.save(state | {"identity": state["identity"] | identity}, checkpoint_path(config()))
        os.utime(checkpoint_path(config()), ns=(written.st_atime_ns, written.st_mtime_ns))  # written then, not now

    afresh = f"{head}, stopped, would start afresh: it was written with different"
    (workdir / "params.yaml").write_text(yaml.safe_dump(small_params()))  # train.device: cpu
    done = train_in_process(monkeypatch, workdir, "--running", "-S", "train.device=cuda")
    assert (done.returncode, done.stdout) == (0, f"{afresh} device than here\n")
    rewrite(data="0123456789abcdef")  # from data prepared otherwise than data/prepared/cifar10's
    assert runner.runs_under_way("cpu") == [
        f"{afresh} prepared data than here (data/prepared/cifar10); in a copy of the repository that holds the data "
        "it was written with, as `dvc exp run --temp` makes, it resumes"
    ]
    assert runner.runs_under_way("cuda:0") == [f"{afresh} prepared data and device than here"]
    rewrite(code="0123456789abcdef")  # as an earlier version of trainer.py wrote it
    (older,) = runner.runs_under_way("cpu")
    assert older == f"{head}, stopped, written by other training code: this checkout's command trains the run afresh"
    with monkeypatch.context() as patch:  # the run finished (or discarded it) between the listing and the read
        patch.setattr(runner, "read_checkpoint", lambda path, expected: (None, None))
        assert runner.runs_under_way("cpu") == [
            f"dfp/{NAME}: its checkpoint {checkpoint_path(config())} vanished while listed: its run finished or "
            "started afresh"
        ]
    train_run(config())  # started afresh and finished: its checkpoint goes
    assert runner.runs_under_way("cpu") == []


def test_an_epoch_line_shows_what_the_method_left_out_and_the_time_left_at_the_recent_pace():
    def row(epoch: int, seconds: float, **own: int) -> dict:
        return {"epoch": epoch, "train_loss": 0.5, "test_acc": 61.0, "epoch_train_s": seconds, "eval_s": 1.0} | own

    history = [row(1, 500.0), *(row(e, 59.0) for e in range(2, 7)), row(7, 39.0, pruned_samples=15000)]
    text = runner.epoch_line("run", history, 200)  # 193 epochs left at 55 s (the last 5 but the slowest)
    assert (
        text
        == "run: epoch 7/200 · train loss 0.5000 · test acc 61.00% · 39.0 s · 15,000 pruned · about 2 h 57 min left"
    )
    # as on an H100: a WUS run's first skip epoch compiles the phase's graphs (11.4 s), the next takes 0.9 s
    wus = [row(e, 1.4) for e in range(17, 20)] + [row(20, 11.4, phase=1), row(21, 0.9, phase=1)]
    assert runner.epoch_line("run", wus, 200).endswith("0.9 s · skip epoch · about 7 min left")  # 179 x 2.275 s
    assert runner.epoch_line("run", [row(9, 20.0, phase=1)], 11).endswith("20.0 s · skip epoch · about 42 s left")
    assert runner.epoch_line("run", [row(9, 20.0, phase=0)], 12).endswith("20.0 s · about 1 min left")
    assert runner.duration(7 * 60 + 20) == "7 min" and runner.duration(3600) == "1 h 00 min"


def test_a_store_that_fails_mid_run_stops_it_with_a_clear_error_and_the_rerun_fills_the_gap(
    workdir, monkeypatch, expected
):
    import mlflow
    from mlflow.exceptions import MlflowException

    real_log = mlflow.log_metrics

    def failing(metrics, step=None, **kwargs):
        if step == 3:
            raise MlflowException("(sqlite3.OperationalError) disk I/O error")
        return real_log(metrics, step=step, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(mlflow, "log_metrics", failing)
        with pytest.raises(UserError, match=r"cannot log epoch 3 to the MLflow store .* disk I/O error\. The epoch"):
            train_run(config())
    assert only_run(store_of(workdir)).info.status == "FAILED"
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    run = only_run(store_of(workdir))
    assert run.info.status == "FINISHED"
    assert_each_epoch_once(store_of(workdir), run, read_csv(workdir / "runs" / "dfp" / NAME / "history.csv"))


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_checkpoint_whose_mlflow_run_is_gone_resumes_into_a_new_run_with_every_epoch(
    workdir, monkeypatch, capsys, empty_store, expected, how
):
    """The new run's id goes into the checkpoint at once: a resume killed before its first epoch ends continues that
    run, not a third."""
    crash_at_log_of(3, monkeypatch)
    gone = only_run(store_of(workdir)).info.run_id
    if how == "deleted":
        from mlflow import MlflowClient

        MlflowClient(store_of(workdir)).delete_run(gone)
    else:  # mlflow.db deleted, or MLFLOW_TRACKING_URI now names another store
        shutil.copy(empty_store, workdir / "mlflow.db")

    crash_as_an_epoch_starts(monkeypatch)
    assert checkpointed_epochs(workdir) == 3
    assert f"the MLflow run {gone} of its checkpoint is not in the store" in capsys.readouterr().err
    final = train_run(config())
    assert "is not in the store" not in capsys.readouterr().err
    assert in_process_results(final, workdir) == expected  # resumed: the checkpoint was good
    run = only_run(store_of(workdir))
    assert run.info.run_id != gone and run.info.status == "FINISHED"
    assert run.data.tags["resumed_after_epochs"] == "3,3"
    assert_each_epoch_once(store_of(workdir), run, read_csv(workdir / "runs" / "dfp" / NAME / "history.csv"))


@pytest.mark.parametrize("stop", ["interrupted", "diverged"])
def test_a_stopped_run_whose_last_log_fails_still_ends_its_mlflow_run(workdir, monkeypatch, stop):
    """A second Ctrl-C, or a store that fails, while a stopped run logs its checkpointed epoch: the run still ends
    KILLED or FAILED, not left RUNNING for MLflow's exit hook to end as FINISHED."""
    import mlflow

    # stopped in epoch 4 (a Ctrl-C) or 3 (a NaN loss): the epoch before is checkpointed, not yet logged
    cfg, last, error = (config(), 3, KeyboardInterrupt) if stop == "interrupted" else (config("poison"), 2, UserError)
    real_log, real_start = RunTracker.log_epoch, Stateful.on_epoch_start

    def log_or_fail(self, row):
        if row["epoch"] == last:
            raise error("the store failed")
        real_log(self, row)

    def interrupt(self, epoch, lr):
        if epoch == 4:
            raise KeyboardInterrupt
        return real_start(self, epoch, lr)

    with monkeypatch.context() as patch:
        patch.setattr(RunTracker, "log_epoch", log_or_fail)
        patch.setattr(Stateful, "on_epoch_start", interrupt)
        with pytest.raises(error):
            train_run(cfg)
    assert mlflow.active_run() is None
    assert only_run(store_of(workdir), cfg.name).info.status == ("KILLED" if stop == "interrupted" else "FAILED")


def test_a_store_ahead_of_the_checkpoint_never_gets_an_epoch_twice(workdir, monkeypatch, expected):
    """The checkpoint is written first, so this needs a lost checkpoint write: epoch 3 logged, checkpoint at 2."""
    real_write = runner.atomic_write

    def write(path, data):
        epochs = len(torch.load(io.BytesIO(data), weights_only=False)["history"]) if path.suffix == ".pt" else 0
        if epochs == 3:
            return  # lost
        if epochs == 4:
            raise Crash  # in the writer's thread: raised in the run at the next epoch's end
        real_write(path, data)

    with monkeypatch.context() as patch:
        patch.setattr(runner, "atomic_write", write)
        with pytest.raises(Crash):
            train_run(config())
    assert checkpointed_epochs(workdir) == 2 and logged_epochs(workdir) == [1, 2, 3]
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    run = only_run(store_of(workdir))
    assert_each_epoch_once(store_of(workdir), run, read_csv(workdir / "runs" / "dfp" / NAME / "history.csv"))


def test_a_checkpoint_goes_to_disk_while_the_next_epoch_trains_and_its_epoch_then_to_the_store(workdir, monkeypatch):
    """The write of epoch 1's checkpoint waits until epoch 2 has started: written in line, it would wait in vain."""
    events, next_epoch = [], threading.Event()
    real_write, real_start, real_log = runner.atomic_write, Stateful.on_epoch_start, RunTracker.log_epoch

    def write(path, data):
        if path.suffix != ".pt":  # the run's outputs
            return real_write(path, data)
        epochs = len(torch.load(io.BytesIO(data), weights_only=False)["history"])
        if epochs == 1:
            assert next_epoch.wait(timeout=120), "epoch 2 did not start while epoch 1's checkpoint was being written"
        real_write(path, data)
        events.append(f"checkpoint {epochs}")

    def on_epoch_start(self, epoch, lr):
        events.append(f"epoch {epoch}")
        if epoch == 2:
            next_epoch.set()
        return real_start(self, epoch, lr)

    def log_epoch(self, row):
        events.append(f"store {row['epoch']}")
        real_log(self, row)

    with monkeypatch.context() as patch:
        patch.setattr(runner, "atomic_write", write)
        patch.setattr(Stateful, "on_epoch_start", on_epoch_start)
        patch.setattr(RunTracker, "log_epoch", log_epoch)
        train_run(config())
    written = [e for e in events if not e.startswith("checkpoint 0")]  # the one before epoch 1: the run's id
    assert written[:4] == ["epoch 1", "epoch 2", "checkpoint 1", "store 1"], events
    for epoch in range(1, EPOCHS + 1):
        assert events.index(f"checkpoint {epoch}") < events.index(f"store {epoch}")  # never ahead of it
        assert events.count(f"store {epoch}") == 1


def test_a_run_killed_in_its_first_epoch_continues_the_same_mlflow_run(workdir, monkeypatch, expected):
    crash_as_an_epoch_starts(monkeypatch)
    assert checkpointed_epochs(workdir) == 0 and checkpoint_path(config()).exists()  # holds the MLflow run id
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    run = only_run(store_of(workdir))
    assert run.info.status == "FINISHED" and run.data.tags["resumed_after_epochs"] == "0"


def test_an_untracked_attempt_between_tracked_ones_keeps_the_mlflow_run_that_the_last_continues(
    workdir, monkeypatch, capsys, expected
):
    """Tracked to epoch 2, untracked (`--no-mlflow`) to epoch 4, tracked to the end: one MLflow run, every epoch
    in it once, as if nothing had stopped it."""

    real = Stateful.on_epoch_start

    def crash_at(epoch: int, track: bool) -> None:
        def crash(self, at, lr):
            if at == epoch:
                raise Crash
            return real(self, at, lr)

        with monkeypatch.context() as patch:
            patch.setattr(Stateful, "on_epoch_start", crash)
            with pytest.raises(Crash):
                train_run(config(), track=track)

    crash_at(3, track=True)
    crash_at(5, track=False)
    assert re.search(r"resuming after epoch 2 \(.*\), not tracked\n", capsys.readouterr().err)
    assert checkpointed_epochs(workdir) == 4
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    run = only_run(store_of(workdir))
    assert run.info.status == "FINISHED" and run.data.tags["resumed_after_epochs"] == "4"
    assert_each_epoch_once(store_of(workdir), run, read_csv(workdir / "runs" / "dfp" / NAME / "history.csv"))


@pytest.mark.parametrize("resumed_on", ["this machine", "another machine", "a checkpoint without the record"])
def test_run_json_names_each_machine_a_run_trained_on_from_its_first_epoch(workdir, monkeypatch, expected, resumed_on):
    """A run resumed on a CPU with other vector instructions (or another GPU) trains on as before, and run.json says
    where each epoch trained: its times mix two machines' (`aggregate.machine_difference`)."""
    crash_at_log_of(3, monkeypatch)  # epochs 1-3 checkpointed here
    here = runner.machine_here("cpu")
    assert here == {"device": device_name("cpu"), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    machines = [{"from_epoch": 1, **here}]
    if resumed_on == "another machine":
        elsewhere = here | {"cpu_capability": "AVX2_ELSEWHERE"}
        monkeypatch.setattr(runner, "machine_here", lambda device: elsewhere)
        machines.append({"from_epoch": 4, **elsewhere})
        (line,) = runner.runs_under_way("cpu")  # `python stages/train.py --running` says so before it resumes
        assert line.endswith(f"stopped: the command that started it resumes it, here on another machine than its last "
                             f"({here['device']} with {here['cpu_capability']}; here {here['device']} with "
                             "AVX2_ELSEWHERE): its time will pair with no baseline's")  # fmt: skip
    elif resumed_on == "this machine":
        (line,) = runner.runs_under_way("cpu")
        assert line.endswith("stopped: the command that started it resumes it")
    elif resumed_on == "a checkpoint without the record":  # written before run.json named machines
        state = torch.load(checkpoint_path(config()), weights_only=False)
        del state["machines"]
        torch.save(state, checkpoint_path(config()))
        machines = [{"from_epoch": 1, "device": "unrecorded", "cpu_capability": ""}, {"from_epoch": 4, **here}]
    final = train_run(config())
    assert in_process_results(final, workdir) == expected
    info = json.loads((workdir / "runs" / "dfp" / NAME / "run.json").read_text())
    assert info["machines"] == machines
    assert (info["device"], info["cpu_capability"]) == (machines[-1]["device"], machines[-1]["cpu_capability"])
    tags = only_run(store_of(workdir)).data.tags  # the MLflow run: its first machine's tags, and the rest where any
    assert (tags["device"], tags["cpu_capability"]) == (here["device"], here["cpu_capability"])
    assert tags.get("machines") == (machines_text(machines) or None)


def test_a_run_resumed_on_another_gpu_of_the_same_name_says_so_and_run_json_names_the_last(workdir, monkeypatch):
    """Two rented GPUs of one name are two machines (their speeds differ): the UUID tells them apart. Trained on the
    CPU here, as two GPUs of one name would record it."""
    first = {
        "device": "NVIDIA H200",
        "cpu_capability": "AVX512",
        "gpu_uuid": "GPU-0a1b2c3d-0000-0000-0000-000000000001",
    }
    second = first | {"gpu_uuid": "GPU-9f8e7d6c-0000-0000-0000-000000000002"}
    monkeypatch.setattr(runner, "machine_here", lambda device: first)
    crash_at_log_of(3, monkeypatch)
    monkeypatch.setattr(runner, "machine_here", lambda device: second)
    (line,) = runner.runs_under_way("cpu")
    assert line.endswith("here on another machine than its last (NVIDIA H200 GPU-0a1b2c3d with AVX512; here NVIDIA "
                         "H200 GPU-9f8e7d6c with AVX512): its time will pair with no baseline's")  # fmt: skip
    train_run(config())
    info = json.loads((workdir / "runs" / "dfp" / NAME / "run.json").read_text())
    assert info["machines"] == [{"from_epoch": 1, **first}, {"from_epoch": 4, **second}]
    assert info["gpu_uuid"] == second["gpu_uuid"]
    assert machines_text(info["machines"]) == ("NVIDIA H200 GPU-0a1b2c3d with AVX512 from epoch 1, NVIDIA H200 "
                                               "GPU-9f8e7d6c with AVX512 from epoch 4")  # fmt: skip


def test_a_gpus_uuid_is_recorded_where_torch_says_it_and_never_stops_a_run(monkeypatch):
    """machine_here names the GPU's UUID as nvidia-smi -L does; a CPU run records none (its run.json is unchanged),
    and a PyTorch or driver that cannot say gives ''."""
    assert "gpu_uuid" not in runner.machine_here("cpu") and tracking.gpu_uuid("cpu") == ""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    props = type("Props", (), {"uuid": "58f5ac0a-3b8e-4c1d-9f00-5a6b7c8d9e0f"})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    here = tracking.machine_here("cuda")
    assert here["device"] == "NVIDIA H200" and here["gpu_uuid"] == "GPU-58f5ac0a-3b8e-4c1d-9f00-5a6b7c8d9e0f"
    assert tracking.gpu_uuid("auto") == here["gpu_uuid"]

    def unsupported(device):
        raise RuntimeError("CUDA driver version is insufficient")

    monkeypatch.setattr(torch.cuda, "get_device_properties", unsupported)
    assert "gpu_uuid" not in tracking.machine_here("cuda:0")


def test_an_attempt_that_checkpointed_no_epoch_is_not_a_machine_of_the_run():
    here, there = {"device": "cpu: A x2", "cpu_capability": "AVX2"}, {"device": "cpu: A x2", "cpu_capability": "AVX512"}
    assert runner.machines_of(None, here) == [{"from_epoch": 1, **here}]
    crashed_in_epoch_1 = {"history": [], "machines": [{"from_epoch": 1, **there}]}
    assert runner.machines_of(crashed_in_epoch_1, here) == [{"from_epoch": 1, **here}]
    gpu = {"device": "NVIDIA H200", "cpu_capability": "AVX512"}
    after_2 = {"history": [{}, {}], "machines": [{"from_epoch": 1, **there}, {"from_epoch": 3, **gpu}]}
    assert runner.machines_of(after_2, here) == [{"from_epoch": 1, **there}, {"from_epoch": 3, **here}]
    assert runner.machines_of(after_2, there) == [{"from_epoch": 1, **there}]  # back where it trained


def test_resuming_without_the_methods_state_would_not_match(workdir, monkeypatch, expected):
    """The control for the tests above: they would notice a method whose state did not survive the checkpoint."""
    crash_at_log_of(3, monkeypatch)
    monkeypatch.setattr(Stateful, "load_state_dict", lambda self, state: None)
    final = train_run(config())
    assert in_process_results(final, workdir) != expected


def test_a_checkpoint_is_never_resumed_by_another_configuration(workdir, monkeypatch):
    crash_at_log_of(3, monkeypatch)
    first = checkpoint_path(config())
    saved = first.read_bytes()
    other = config(lr=0.01)  # same run name, other params
    assert checkpoint_path(other) != first
    train_run(other)
    assert first.read_bytes() == saved  # untouched: it still resumes its own configuration

    from mlflow import MlflowClient

    client = MlflowClient(store_of(workdir))
    runs = client.search_runs([client.get_experiment_by_name("dfp").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]
    finished = next(r for r in runs if r.info.status == "FINISHED")
    assert finished.data.params["recipe.lr"] == "0.01" and "resumed_after_epochs" not in finished.data.tags


def test_the_same_images_prepared_from_another_source_resume_the_checkpoint(workdir, monkeypatch, capsys, expected):
    crash_at_log_of(3, monkeypatch)
    write_data(workdir, source="another archive")  # another manifest, the same arrays
    capsys.readouterr()
    final = train_run(config())
    assert "resuming after epoch 3" in capsys.readouterr().err
    assert in_process_results(final, workdir) == expected


@pytest.mark.parametrize("damage", ["truncated", "other-code", "other-data"])
def test_an_unusable_checkpoint_is_discarded_with_a_warning_and_the_run_starts_afresh(
    workdir, monkeypatch, capsys, expected, damage
):
    crash_at_log_of(3, monkeypatch)
    ckpt = checkpoint_path(config())
    stale_run = only_run(store_of(workdir)).info.run_id
    if damage == "truncated":  # a full disk, say: torch.load fails
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
        reason = "cannot be read"
    elif damage == "other-code":  # src/cheaptrain changed since: the epochs would mix two versions
        monkeypatch.setattr(runner, "code_version", lambda method: "0" * 16)
        reason = "different training code"
    else:  # the prepared data holds other images now (its digest is of the arrays)
        monkeypatch.setattr(runner, "prepared_digest", lambda path: "f" * 16)
        reason = "different prepared data"
    capsys.readouterr()
    final = train_run(config())
    warning = capsys.readouterr().err
    assert f"discarding the checkpoint {ckpt}: it" in warning and reason in warning
    assert in_process_results(final, workdir) == expected  # from epoch 1, not 4

    from mlflow import MlflowClient

    client = MlflowClient(store_of(workdir))
    runs = client.search_runs([client.get_experiment_by_name("dfp").experiment_id])
    new = next(r for r in runs if r.info.run_id != stale_run)
    assert new.info.status == "FINISHED" and "resumed_after_epochs" not in new.data.tags
    assert [m.step for m in client.get_metric_history(new.info.run_id, "test_acc")] == list(range(1, EPOCHS + 1))
    if damage != "truncated":  # the run id was readable: the old run says why it will never finish
        assert reason in client.get_run(stale_run).data.tags["abandoned"]


def test_a_probe_of_the_lock_leaves_a_starting_run_its_checkpoint(tmp_path, monkeypatch):
    """`--running` and every `threads: auto` training probe each lock (a shared lock, for an instant): a run starting
    meanwhile waits it out and owns its checkpoint; a lock held on, by a process training the run, it does not get."""
    lock_path = tmp_path / "run.lock"
    lock_path.touch()
    with open(lock_path) as probe:
        fcntl.flock(probe, fcntl.LOCK_SH)  # as runner.lock_held takes it
        waits = []

        def probe_ends_during_the_wait(seconds: float) -> None:  # the probe's instant ends as the run waits
            waits.append(seconds)
            fcntl.flock(probe, fcntl.LOCK_UN)

        waiting = types.SimpleNamespace(**(vars(time) | {"sleep": probe_ends_during_the_wait}))  # runner's time alone
        with monkeypatch.context() as patched:
            patched.setattr(runner, "time", waiting)
            with runner.checkpoint_owner(lock_path) as owner:
                assert owner and len(waits) == 1  # refused once, owned at the next try
    with open(lock_path) as training:
        fcntl.flock(training, fcntl.LOCK_EX)
        with runner.checkpoint_owner(lock_path, wait_s=0.1) as owner:
            assert not owner


def test_a_run_that_opened_the_lock_its_finishing_owner_removed_locks_the_file_there_now(tmp_path, monkeypatch):
    """A finished run removes its lock file; a run starting at that instant may have opened the removed file. Locking
    that file would leave the path free, and a third process would own the same checkpoint beside it."""
    lock_path = tmp_path / "run.lock"
    finishing = open(lock_path, "w")  # noqa: SIM115 (closed below, as its owner finishes)
    fcntl.flock(finishing, fcntl.LOCK_EX)
    flock = fcntl.flock

    def owner_finishes_first(file, operation):
        if not finishing.closed:  # after the starting run opened the file, before it locks it
            lock_path.unlink()
            finishing.close()
        return flock(file, operation)

    monkeypatch.setattr(fcntl, "flock", owner_finishes_first)
    with runner.checkpoint_owner(lock_path) as owner:
        assert owner and finishing.closed
        assert runner.lock_held(lock_path)  # the file at the path is locked: a third process does not own it


def test_a_second_process_on_the_same_configuration_trains_without_touching_the_checkpoint(
    workdir, monkeypatch, capsys, expected
):
    """Queued DVC experiments that share a run train it at once: neither may resume or overwrite the other's state."""
    crash_at_log_of(3, monkeypatch)
    ckpt = checkpoint_path(config())
    saved = ckpt.read_bytes()
    with open(ckpt.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the process that resumed it would hold it
        final = train_run(config())
    assert "another process is training the same configuration" in capsys.readouterr().err
    assert in_process_results(final, workdir) == expected  # from epoch 1: not resumed
    assert ckpt.read_bytes() == saved and ckpt.with_suffix(".lock").exists()  # still the other process's

    from mlflow import MlflowClient

    client = MlflowClient(store_of(workdir))
    runs = client.search_runs([client.get_experiment_by_name("dfp").experiment_id])
    assert sorted(r.info.status for r in runs) == ["FAILED", "FINISHED"]


# --- a NaN loss ----------------------------------------------------------------------------------------------


def test_a_nan_loss_fails_the_mlflow_run_keeps_the_checkpoint_and_diverges_again_when_rerun(workdir):
    from mlflow import MlflowClient

    cfg = config("poison")
    name = "cifar10-lenet-poison-s0"
    store = store_of(workdir)
    for attempt in (1, 2):
        with pytest.raises(TrainingDiverged) as info:
            train_run(cfg)
        message = str(info.value)
        assert "the training loss became nan in epoch 3" in message and "Lower recipes.dfp.lr" in message
        assert f"is marked FAILED; the checkpoint of epoch 2 is kept in {checkpoint_path(cfg)}" in message
        assert "\n" not in message
        run = only_run(store, name)
        assert run.info.status == "FAILED"
        for key in ("train_loss", "test_acc"):
            assert sorted(m.step for m in MlflowClient(store).get_metric_history(run.info.run_id, key)) == [1, 2]
        if attempt == 2:
            assert run.data.tags["resumed_after_epochs"] == "2"
    assert not (workdir / "runs").exists()


def test_a_run_that_diverges_in_its_first_epoch_leaves_no_checkpoint_and_says_so(workdir):
    cfg = config(lr=1e12)
    with pytest.raises(TrainingDiverged, match="in epoch 1") as info:
        train_run(cfg)
    assert "no checkpoint is kept" in str(info.value)
    assert not checkpoint_path(cfg).exists() and not checkpoint_path(cfg).with_suffix(".lock").exists()
    assert only_run(store_of(workdir)).info.status == "FAILED"
    with pytest.raises(TrainingDiverged, match=r"in epoch 1 .*The run is not tracked; no checkpoint is kept"):
        train_run(cfg, track=False)


@pytest.mark.parametrize("broken", ["threads", "store"])
def test_a_run_that_fails_as_it_starts_is_failed_in_the_store_and_leaves_no_checkpoint(workdir, monkeypatch, broken):
    """Failed, not left RUNNING for MLflow's exit hook to end as FINISHED with no epoch."""
    import mlflow

    if broken == "threads":
        monkeypatch.setenv("CHEAPTRAIN_THREADS", "many")
        error, expected = UserError, "CHEAPTRAIN_THREADS='many' is invalid"
    else:

        def store_fails(*args, **kwargs):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(mlflow, "log_params", store_fails)
        error, expected = OSError, "Input/output error"
    with pytest.raises(error, match=expected):
        train_run(config())
    assert mlflow.active_run() is None
    assert only_run(store_of(workdir)).info.status == "FAILED"
    assert list((workdir / "checkpoints").rglob("*.*")) == []


def test_the_stage_exits_2_on_a_nan_loss_with_the_message(workdir, monkeypatch):
    (workdir / "params.yaml").write_text(yaml.safe_dump(small_params(methods=("poison",)), sort_keys=False))
    result = train_in_process(monkeypatch, workdir, *run_args("poison"))
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "became nan in epoch 3" in errors[0] and "marked FAILED" in errors[0]
    assert only_run(store_of(workdir), "cifar10-lenet-poison-s0").info.status == "FAILED"


# --- the MLflow store --------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _NotMlflow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404, "Not Found", "<html><body>\n<h1>some other web server</h1>\n</body></html>")

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_web_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotMlflow)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        pytest.param("http://127.0.0.1:{port}", "Connection refused", id="http-nothing-listening"),
        pytest.param("{server}", "404", id="http-not-mlflow"),
        pytest.param("sqlite:///{tmp}/no/such/folder/mlflow.db", "is not an existing folder", id="sqlite-no-folder"),
        pytest.param("sqlite:///{tmp}/a-file/mlflow.db", "is not an existing folder", id="sqlite-folder-is-a-file"),
        pytest.param("sqlite:///{tmp}/read-only/mlflow.db", "is not writable", id="sqlite-read-only-folder"),
        pytest.param("sqlite:///{tmp}", "is not a file", id="sqlite-folder-as-file"),
        pytest.param("nosuchscheme://host/x", "unsupported URI", id="unknown-scheme"),
    ],
)
def test_an_unusable_tracking_store_fails_at_start_before_any_training(workdir, monkeypatch, uri, expected, request):
    if "read-only" in uri:
        (read_only := workdir / "read-only").mkdir(mode=0o500)
        if os.geteuid() == 0:  # root writes past the mode bits: the store's check gets the answer any other user gets
            real_access = os.access

            def access(path, mode: int, **kwargs) -> bool:
                if path == read_only:  # the check passes a Path
                    return not mode & os.W_OK and real_access(path, mode, **kwargs)
                return real_access(path, mode, **kwargs)

            monkeypatch.setattr(os, "access", access)
    (workdir / "a-file").write_text("")
    server = request.getfixturevalue("other_web_server") if "{server}" in uri else ""
    uri = uri.format(port=closed_port(), server=server, tmp=workdir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(UserError) as info:
        train_run(config())
    message = str(info.value)
    assert f"cannot use the MLflow tracking store {uri!r}" in message and expected in message
    assert "Fix MLFLOW_TRACKING_URI" in message and "\n" not in message
    assert not (workdir / "checkpoints").exists() and not (workdir / "runs").exists()


def test_the_stage_exits_2_at_once_on_an_unreachable_tracking_server(workdir, monkeypatch):
    """The probe connects 3 times (2 retries), not MLflow's 8 over minutes: counted, not timed."""
    import urllib3.connectionpool

    attempts = []
    connect = urllib3.connectionpool.HTTPConnectionPool._make_request

    def counted(pool, *args, **kwargs):
        attempts.append(pool.port)
        if len(attempts) > 3:  # one past the bound: fail at once rather than wait out MLflow's backoff
            raise AssertionError("a fourth connection attempt")
        return connect(pool, *args, **kwargs)

    monkeypatch.setattr(urllib3.connectionpool.HTTPConnectionPool, "_make_request", counted)
    (workdir / "params.yaml").write_text(yaml.safe_dump(small_params(), sort_keys=False))
    port = closed_port()
    uri = f"http://127.0.0.1:{port}"
    result = train_in_process(monkeypatch, workdir, *run_args(), MLFLOW_TRACKING_URI=uri)
    assert attempts == [port] * 3
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "MLFLOW_TRACKING_URI" in errors[0] and uri in errors[0]
    assert not (workdir / "checkpoints").exists() and not (workdir / "runs").exists()


# --- parallel runs on the SQLite store -------------------------------------------------------------------


def test_the_stage_lists_every_bad_param_of_the_grid_and_exits_2_before_any_work(tmp_path, monkeypatch):
    params = small_params(methods=("baseline",))
    params["recipes"]["dfp"]["epochs"] = 0
    params["recipes"]["wus"]["lr"] = -0.1
    params["grid"]["wus"] = params["grid"]["wus"] | {"models": ["lenet", "resnet81"]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(params))
    stage = str(REPO / "stages" / "train.py")
    run = [*run_args("baseline"), "--params", "bad.yaml"]
    # the command of a train stage in its own process, as DVC sees its status (the stage's error path end to end),
    # then --check in this one
    in_a_process = run_in(tmp_path, "python", stage, *run, check=False)
    for result in (in_a_process, train_in_process(monkeypatch, tmp_path, "--check", "--params", "bad.yaml")):
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: invalid params:\n")
        problems = result.stderr.splitlines()[1:]
        assert problems == [
            "  - grid.wus.models: 'resnet81' is unknown (accepted: " + ", ".join(_models()) + ")",
            "  - recipes.dfp.epochs: 0 is invalid; accepted: a positive integer",
            "  - recipes.wus.lr: -0.1 is invalid; accepted: a positive number",
        ], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no store, no checkpoint, no output

    (tmp_path / "good.yaml").write_text(yaml.safe_dump(small_params(methods=("baseline",))))
    result = train_in_process(monkeypatch, tmp_path, "--check", "--params", "good.yaml")
    assert result.returncode == 0 and "every run of the grid has valid params" in result.stdout, result.stderr


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"dfp": {"prune_num": 256}}, "methods.dfp.prune_num: 256 prunes 256 of the 256 training samples"),
        ({"wus": {"bias_layers": 10000}}, "methods.wus.bias_layers: 10000 exceeds the 5 layers with parameters"),
        ({"dfp": {"starting_point": 5, "attenuation": 1, "window": 6, "block": 2, "count": 1}},
         "methods.dfp: the schedule plans no pruning epoch in this run's 6 epochs"),
        (None, "methods: missing; accepted: a mapping of method name"),
    ],
)  # fmt: skip
def test_check_names_what_only_the_run_tells_and_no_run_leaves_anything_behind(tmp_path, monkeypatch, change, problem):
    write_data(tmp_path)  # prepared data of 256 training images; small_params: LeNet, 6 epochs
    params = small_params(methods=("baseline", "dfp") if change and "dfp" in change else ("baseline", "wus"))
    if change is None:
        del params["methods"]
    else:
        params["methods"] |= change
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    method = next(iter(change)) if change else "wus"
    study = "dfp" if method == "dfp" else "wus"
    run = ["--study", study, "--dataset", "cifar10", "--model", "lenet", "--method", method, "--seed", "0"]
    for args in (["--check"], run):
        result = train_in_process(monkeypatch, tmp_path, *args)
        assert result.returncode == 2 and problem in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "params.yaml"]  # no store, checkpoint or output


def train_stage():
    """stages/train.py as a module, for its functions."""
    spec = importlib.util.spec_from_file_location("train_stage", REPO / "stages" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SET_BAD = [  # (-S assignments, the error's text)
    (["recipe.wus.epochs=50"], "-S 'recipe.wus.epochs=50': params has no section recipe (its sections: download, "
     "train, recipes, methods, grid, aggregate, check)"),
    (["downlod.cifar10.train_size=7"], "params has no section downlod"),
    (["recipes.wuss.epochs=5"], "-S 'recipes.wuss.epochs=5': params has no recipes.wuss (recipes holds: dfp, wus)"),
    (["grid.dfpp.seeds=[1]"], "-S 'grid.dfpp.seeds=[1]': params has no grid.dfpp (grid holds: dfp, wus)"),
    (["recipes.wus.per_model.vgg16.lr=0.01", "recipes.wus.per_model.vgg16.lr.x=1"],
     "recipes.wus.per_model.vgg16.lr is 0.01, not a section of settings"),
    (["methods.dfpp.prune_num=0.5"], "-S: params has no methods.dfpp, and dfpp is no method (accepted: baseline, "),
    (["train.compile=[true"], "-S 'train.compile=[true': the value is not valid YAML: while parsing a flow sequence"),
]  # fmt: skip


@pytest.mark.parametrize(("assignments", "problem"), SET_BAD, ids=[a[0] for a, _ in SET_BAD])
def test_set_refuses_a_key_of_no_section_in_one_line(assignments, problem):
    """A mistyped section is not created (validation ignores what no run reads): the error names what there is."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    with pytest.raises(UserError) as info:
        train_stage().set_params(params, assignments)
    assert problem in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_set_creates_a_models_settings_and_a_named_configuration():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["methods"]["baseline"] = None  # `baseline:` with nothing after it
    train_stage().set_params(params, [
        "recipes.wus.per_model.vgg16.lr=0.05", "recipes.dfp.model_args.vgg16.batch_norm=false",
        "methods.dfp_p90.prune_num=0.9", "methods.dfp_p90.method=dfp", "grid.dfp.methods=[baseline,dfp_p90]",
        "methods.baseline.x=1",
    ])  # fmt: skip
    assert params["recipes"]["wus"]["per_model"] == {"vgg16": {"lr": 0.05}}
    assert params["recipes"]["dfp"]["model_args"] == {"vgg16": {"batch_norm": False}}
    assert params["methods"]["dfp_p90"] == {"prune_num": 0.9, "method": "dfp"}
    assert params["methods"]["baseline"] == {"x": 1}
    with pytest.raises(ConfigError, match=r"methods\.baseline\.x: unknown parameter"):
        validate_grid(params)


def test_check_names_the_runs_whose_ledger_entry_would_stop_them(tmp_path, monkeypatch):
    """With `train.ledger: record`, a run whose entry another training-code version trained stops its train stage
    (ledger.find), hours into `dvc repro`: `--check` lists it and fails; `train.ledger: retrain` replaces it."""
    from cheaptrain.runner import run_code_version

    params = yaml.safe_load((REPO / "params.yaml").read_text())  # the papers' setting: the ledger keeps its runs
    params["download"]["datasets"] = ["cifar10"]
    params["grid"] = {
        "dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline"], "seeds": [0, 1]},
        "wus": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline"], "seeds": [0]},
    }
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for seed, stale in ((0, True), (1, False)):  # dfp seed 0 by other training code, seed 1 by this one
        cfg = resolve_run(params, "dfp", "cifar10", "lenet", "baseline", seed)
        code = "0123456789abcdef" if stale else run_code_version(cfg)
        entry = tmp_path / "ledger" / "dfp" / cfg.name
        entry.mkdir(parents=True)
        info = {"name": cfg.name, "config": json.loads(json.dumps(cfg.to_dict())), "code_version": code}
        (entry / "run.json").write_text(json.dumps(info | {"git_commit": "c0ffee"}))
        (entry / "metrics.json").write_text(json.dumps({"final_acc": 50.0}))
        (entry / "history.csv").write_text("epoch,test_acc\n1,50.0\n")
    result = train_in_process(monkeypatch, tmp_path, "--check")
    assert result.returncode == 1, result.stderr
    assert (
        result.stdout.splitlines()[1] == "ledger: 1 of 3 runs reuse their ledger entry, 1 train, 1 would stop at theirs"
    )
    assert result.stderr.splitlines()[:2] == [
        "error: 1 runs of the grid have a ledger entry trained differently, which stops their train stage:",
        "  - dfp/cifar10-lenet-baseline-s0: training code: version 0123456789abcdef (commit c0ffee) in the entry, "
        f"{run_code_version(cfg)} now",
    ]
    assert "-S train.ledger=retrain" in result.stderr and "python -m cheaptrain.replay --stale" in result.stderr
    retrain = train_in_process(monkeypatch, tmp_path, "--check", "-S", "train.ledger=retrain")
    assert retrain.returncode == 0, retrain.stderr
    assert retrain.stdout == "params.yaml with -S: every run of the grid has valid params\n"


def test_set_trains_with_a_params_value_for_one_command_and_a_bad_one_fails_before_training(tmp_path, monkeypatch):
    """`stages/train.py -S KEY=VALUE` (a machine without DVC): the run trains with the value and params.yaml stays
    as it was; a bad key, value or form fails in seconds under its name, and no run leaves anything behind."""
    repo = make_repo(tmp_path / "repo", None, methods=("baseline", "wus"))
    params_before = (repo / "params.yaml").read_text()
    run = ["--study", "wus", "--dataset", "cifar10", "--model", "lenet", "--method", "wus", "--seed", "0"]
    run += ["--no-mlflow"]
    for bad, problem in [
        ("recipes.wus.epochs=two", "recipes.wus.epochs: 'two' is invalid; accepted: a positive integer"),
        ("methods.wus.patienc=2", "methods.wus.patienc: unknown parameter"),
        ("recipes.wus.lr.x=1", "-S 'recipes.wus.lr.x=1': recipes.wus.lr is 0.02, not a section of settings"),
        ("train.compile", "-S 'train.compile': expected KEY=VALUE"),
        ("train.compile=[true", "-S 'train.compile=[true': the value is not valid YAML"),
    ]:
        result = train_in_process(monkeypatch, repo, *run, "-S", bad)  # fails before any work: in this process
        assert result.returncode == 2 and problem in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not (repo / "checkpoints").exists() and not (repo / "runs").exists()

    shorter = ["-S", "recipes.wus.epochs=3", "-S", "recipes.wus.step_size=2", "-S", "methods.wus.patience=2"]
    yaml12 = ["-S", "recipes.wus.weight_decay=1e-5", "-S", "train.amp=off"]  # YAML 1.1 reads a string, a false
    run_in(repo, "python", "stages/train.py", *run, *shorter, *yaml12)
    out = repo / "runs" / "wus" / "cifar10-lenet-wus-s0"
    config = json.loads((out / "run.json").read_text())["config"]
    assert (config["recipe"]["epochs"], config["recipe"]["step_size"], config["method_args"]["patience"]) == (3, 2, 2)
    assert (config["recipe"]["weight_decay"], config["amp"]) == (1e-5, "off")
    assert len(read_csv(out / "history.csv")) == 3
    assert (repo / "params.yaml").read_text() == params_before


def _models() -> list[str]:
    from cheaptrain.models import MODELS

    return list(MODELS)


def test_validate_grid_accepts_the_repository_params():
    validate_grid(yaml.safe_load((REPO / "params.yaml").read_text()))
    validate_grid(small_params(methods=("baseline",)))


GRID_BAD = [  # (change to grid.dfp of small_params(), text the error must contain)
    ({"models": ["lenet", "resnet81"]}, "grid.dfp.models: 'resnet81' is unknown (accepted: "),
    ({"datasets": ["mnist"]}, "grid.dfp.datasets: 'mnist' is unknown (accepted: cifar10, cifar100)"),
    ({"datasets": ["cifar100"]}, "grid.dfp.datasets: 'cifar100' is not in download.datasets ['cifar10']"),
    ({"methods": ["magic"]}, "grid.dfp.methods: 'magic' is unknown (accepted: baseline"),
    ({"seeds": [0, -1]}, "grid.dfp.seeds: -1 is invalid; accepted: integers >= 0"),
    ({"seeds": [0, 0]}, "grid.dfp.seeds: [0, 0] repeats a value"),
    ({"seeds": []}, "grid.dfp.seeds: [] is invalid; accepted: a non-empty list"),
    ({"models": "lenet"}, "grid.dfp.models: 'lenet' is invalid; accepted: a non-empty list"),
    ({"model": ["lenet"]}, "grid.dfp.model: unknown (accepted: datasets, models, methods, seeds)"),
]


@pytest.mark.parametrize(("change", "expected"), GRID_BAD, ids=[b[1][:40] for b in GRID_BAD])
def test_bad_grid_entries_are_reported_with_their_key(change, expected):
    params = small_params(methods=("baseline",))
    params["grid"]["dfp"] = params["grid"]["dfp"] | change
    with pytest.raises(ConfigError) as info:
        validate_grid(params)
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_grid_problems_of_every_run_are_reported_once():
    params = small_params(methods=("baseline",))
    params["recipes"]["dfp"]["batch_size"] = 0  # shared by every dfp run: one line, not one per run
    params["grid"]["dfp"] = params["grid"]["dfp"] | {"seeds": [0, 1, 2]}
    params["grid"]["wus"] = "lenet"
    with pytest.raises(ConfigError) as info:
        validate_grid(params)
    assert info.value.problems == [
        "grid.wus: accepted: a mapping with the lists datasets, models, methods, seeds",
        "recipes.dfp.batch_size: 0 is invalid; accepted: a positive integer",
    ]


# --- the download stage -----------------------------------------------------------------------------------


def test_the_download_stage_fails_in_one_paragraph_leaves_nothing_and_a_retry_succeeds(tmp_path, empty_store):
    from test_prepare import folder_entries, sample_images, write_archive

    archive = write_archive(tmp_path / "src.tar.gz", folder_entries(sample_images()))
    good = archive.read_bytes()
    archive.write_bytes(good[: len(good) // 2])  # a copy that stopped half way
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(small_params(methods=("baseline",))))
    shutil.copy(empty_store, tmp_path / "mlflow.db")
    stage = ("python", str(REPO / "stages" / "download.py"), "--dataset", "cifar10")
    env = {"CIFAR10_SOURCE": str(archive)}
    result = run_in(tmp_path, *stage, check=False, env=env)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"Cannot read {archive}" in errors[0] and "truncated or corrupt" in errors[0]
    assert not (tmp_path / "data").exists()
    archive.write_bytes(good)
    assert "cifar10: train 30, test 20 images" in run_in(tmp_path, *stage, env=env).stdout


# --- the shared CIFAR-10 archive of the end-to-end tests ---------------------------------------------------


@pytest.mark.parametrize("required", ["", "1"])
def test_a_missing_shared_archive_skips_the_tests_on_it_or_fails_them_where_ci_requires_it(
    tmp_path, monkeypatch, required
):
    monkeypatch.setenv(REQUIRE_DATA, required)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="the shared CIFAR-10 archive is not at"):
        require_archive(tmp_path / "cifar10-jpg.tar.gz")
    (archive := tmp_path / "cifar10-jpg.tar.gz").write_bytes(b"")
    assert require_archive(archive) == archive


# --- the code a checkpoint depends on ----------------------------------------------------------------------


# --- threads: a fair share of the cores ---------------------------------------------------------------------


def test_auto_threads_share_the_cores_with_the_trainings_running_now_and_are_recorded(workdir, monkeypatch, request):
    cores = 4  # a machine of 4 cores, whatever this one has (on 1 core a share and the whole would both be 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))  # as it was
    monkeypatch.delenv("CHEAPTRAIN_THREADS", raising=False)
    cfg = dataclasses.replace(config(), threads="auto", recipe=dataclasses.replace(config().recipe, epochs=1))
    other = workdir / "checkpoints" / "wus" / "another-run.lock"  # another training of this repository, running
    other.parent.mkdir(parents=True)
    with open(other, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        train_run(cfg)
    shared = json.loads((workdir / "runs/dfp" / NAME / "run.json").read_text())["threads"]
    assert shared == [2]
    assert read_csv(workdir / "runs/dfp" / NAME / "history.csv")[0]["threads"] == "2"
    train_run(dataclasses.replace(cfg, seed=1))  # alone now
    alone = json.loads((workdir / "runs/dfp" / "cifar10-lenet-stateful-s1" / "run.json").read_text())["threads"]
    assert alone == [cores]
    monkeypatch.setenv("CHEAPTRAIN_THREADS", "1")
    assert runner.cpu_threads("auto") == 1 and runner.cpu_threads(2) == 1
    monkeypatch.setenv("CHEAPTRAIN_THREADS", "many")
    with pytest.raises(UserError, match="CHEAPTRAIN_THREADS='many' is invalid"):
        runner.cpu_threads("auto")
