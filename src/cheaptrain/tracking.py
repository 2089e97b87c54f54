"""MLflow tracking: where the store is, one MLflow experiment per study, one MLflow run per trained configuration.

Default store: an SQLite database `mlflow.db` at the repository root, artifacts in `mlartifacts/` beside it.
Under `dvc exp run --temp/--queue` stages run in a temporary copy of the repo; DVC then sets DVC_ROOT to the real
root, so runs still land in the workspace store. MLFLOW_TRACKING_URI overrides the store.

The store is checked when a stage starts, before any work: a misconfigured or unreachable store fails within
seconds with one clear error (MLflow alone retries an HTTP server for minutes, an unopenable SQLite file for ~100 s).
Concurrent runs share the SQLite store safely: MLflow sets a 20 s SQLite busy timeout on every session.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cheaptrain import UserError


def project_root() -> Path:
    """The real repository root: DVC_ROOT under DVC (also for temporary experiment copies), else the cwd."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def default_uri() -> str:
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_uri()


@contextlib.contextmanager
def _store_lock() -> Iterator[None]:
    """Serialise creating the SQLite schema and experiments across processes started together."""
    if tracking_uri() != default_uri():
        yield
        return
    with open(project_root() / ".mlflow.db.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# The start-up probe of an HTTP store: a few seconds, not MLflow's default of 7 retries with exponential backoff
# and a 120 s timeout each. Training keeps the defaults, which ride out a short outage of the server.
PROBE_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def store_error(problem: str) -> UserError:
    """One paragraph naming the store, what is wrong with it and how to choose another."""
    problem = " ".join(problem.split()).rstrip(".")
    if len(problem) > 600:  # a web server's HTML error page, say
        problem = problem[:600] + " ..."
    if os.environ.get("MLFLOW_TRACKING_URI"):
        fix = f"Fix MLFLOW_TRACKING_URI, or unset it to use the default store {default_uri()!r}"
    else:
        fix = "That is the default store (mlflow.db at the repository root); MLFLOW_TRACKING_URI chooses another"
    return UserError(
        f"cannot use the MLflow tracking store {tracking_uri()!r}: {problem}. {fix}. Stopped before any work."
    )


def check_sqlite_path(uri: str) -> None:
    """Fail fast where MLflow would create a mistyped folder, or retry ~100 s before failing."""
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    if str(path) in ("", ":memory:"):
        return
    if not path.parent.is_dir():
        raise store_error(f"{path.parent} is not an existing folder (create it if the path is right)")
    if path.exists() and not path.is_file():
        raise store_error(f"{path} exists but is not a file")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise store_error(f"{path} or its folder is not writable by this user (SQLite writes beside the file)")


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """Bound MLflow's HTTP retries for the duration of a probe, unless the user chose their own settings."""
    chosen = {k: v for k, v in PROBE_HTTP_ENV.items() if k not in os.environ}
    os.environ.update(chosen)
    try:
        yield
    finally:
        for key in chosen:
            os.environ.pop(key, None)


def ensure_experiment(name: str) -> str:
    """Id of the MLflow experiment `name`, created (with its artifacts beside the store) if missing.

    This is the start-up check of the store: any problem raises a UserError within seconds."""
    check_sqlite_path(tracking_uri())
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    with _store_lock(), _bounded_http():
        try:
            client = MlflowClient(tracking_uri())
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                location = None  # a tracking server chooses its own artifact store
                if tracking_uri() == default_uri():
                    location = (project_root() / "mlartifacts" / name).as_uri()
                return client.create_experiment(name, artifact_location=location)
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment.experiment_id)
            return experiment.experiment_id
        except MlflowException as e:
            raise store_error(e.message) from e
        except Exception as e:  # OSError, SQLAlchemy or requests errors that MLflow passes through
            raise store_error(f"{type(e).__name__}: {e}") from e


def git_commit() -> str:
    if rev := os.environ.get("DVC_EXP_BASELINE_REV"):
        return rev
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    return f"cpu: {platform.processor() or platform.machine()} x{os.cpu_count()}"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'recipe': {'lr': 0.1}} -> {'recipe.lr': 0.1}"""
    flat: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class RunTracker:
    """The MLflow run of one configuration; `start` creates it or continues it after a crash."""

    def __init__(self, experiment: str) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri())
        self.experiment_id = ensure_experiment(experiment)
        self.run_id: str | None = None

    def start(self, name: str, params: dict[str, Any], tags: dict[str, str], run_id: str | None = None) -> int:
        """Start a run, or continue `run_id`; returns the last epoch the store holds of it (0 for a new run).

        A run that the store no longer has (deleted, or the store was replaced) is started afresh under a new id."""
        from mlflow.exceptions import MlflowException

        client = self.mlflow.MlflowClient()
        if run_id is not None:
            try:
                missing = client.get_run(run_id).info.lifecycle_stage == "deleted"
            except MlflowException as e:
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise store_error(f"cannot read the run {run_id} of {name}: {e.message}") from e
                missing = True
            if missing:
                print(
                    f"warning: {name}: the MLflow run {run_id} of its checkpoint is not in the store "
                    f"{tracking_uri()!r} (deleted, or another store); logging the run to a new MLflow run",
                    file=sys.stderr,
                )
                run_id = None
        try:
            run = self.mlflow.start_run(
                run_id=run_id, experiment_id=self.experiment_id, run_name=name, log_system_metrics=True
            )
        except MlflowException as e:  # a store that reads but does not write, say
            raise store_error(f"cannot start the run {name}: {e.message}") from e
        self.run_id = run.info.run_id
        if run_id is not None:
            logged = client.get_metric_history(run_id, "test_acc")
            return max((m.step for m in logged), default=0)
        self.mlflow.log_params({k: str(v) for k, v in flatten(params).items()})
        self.mlflow.set_tags(tags)
        return 0

    def note_resume(self, epoch: int) -> None:
        """Record on the run each epoch it was resumed after (tag `resumed_after_epochs`, e.g. "2,5")."""
        previous = self.mlflow.MlflowClient().get_run(self.run_id).data.tags.get("resumed_after_epochs")
        self.mlflow.set_tag("resumed_after_epochs", f"{previous},{epoch}" if previous else str(epoch))

    def log_epoch(self, row: dict[str, Any]) -> None:
        """One epoch's metrics in one batch: the store holds all of an epoch or none of it. The epoch is already
        checkpointed, so a store that fails (once MLflow's retries are spent) stops the run with a clear error."""
        from mlflow.exceptions import MlflowException

        metrics = {k: float(v) for k, v in row.items() if k != "epoch" and isinstance(v, int | float)}
        try:
            self.mlflow.log_metrics(metrics, step=int(row["epoch"]))
        except MlflowException as e:
            raise UserError(
                f"cannot log epoch {row['epoch']} to the MLflow store {tracking_uri()!r}: "
                f"{' '.join(e.message.split())[:600]}. The epoch is checkpointed: run again once the store works, "
                "to resume the run and log the epochs the store missed."
            ) from e

    def finish(self, final: dict[str, float], artifacts: list[Path]) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in final.items()})
        for path in artifacts:
            self.mlflow.log_artifact(str(path))
        self.mlflow.end_run("FINISHED")

    def fail(self, status: str = "FAILED") -> None:
        """Mark the run FAILED or KILLED; never hides the error that stopped it (the store may be what failed)."""
        if self.run_id is None:  # failed before the run started
            return
        error: Exception | None = None
        try:
            if self.mlflow.active_run() is not None:
                self.mlflow.end_run(status)
        except Exception as e:
            error = e
        try:  # check in the store: an interrupt inside MLflow's own calls can leave the run RUNNING there
            client = self.mlflow.MlflowClient()
            if client.get_run(self.run_id).info.status == "RUNNING":
                client.set_terminated(self.run_id, status)
        except Exception as e:
            error = error or e
            print(f"warning: could not mark the MLflow run {self.run_id} {status}: {error!r}", file=sys.stderr)

    @staticmethod
    def abandon(run_id: str, reason: str) -> None:
        """End an unfinished run that will never be continued (its checkpoint was discarded), saying why."""
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        client = MlflowClient()
        with contextlib.suppress(MlflowException):  # gone from the store: nothing to end
            client.set_tag(run_id, "abandoned", reason)
            if client.get_run(run_id).info.status == "RUNNING":  # killed: it could not say so itself
                client.set_terminated(run_id, "KILLED")


def run_tags(study: str, device: str) -> dict[str, str]:
    import torch

    return {
        "study": study,
        "git_commit": git_commit(),
        "mlflow.source.git.commit": git_commit(),
        "dvc_stage": os.environ.get("DVC_STAGE", ""),
        "dvc_exp": os.environ.get("DVC_EXP_NAME", ""),
        "device": device_name(device),
        "torch_version": torch.__version__,
    }
