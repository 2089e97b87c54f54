"""MLflow tracking: where the store is, one MLflow experiment per study, one MLflow run per trained configuration.

Default store: an SQLite database `mlflow.db` at the repository root, artifacts in `mlartifacts/` beside it.
Under `dvc exp run --temp/--queue` stages run in a temporary copy of the repo; DVC then sets DVC_ROOT to the real
root, so runs still land in the workspace store. MLFLOW_TRACKING_URI overrides the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import subprocess
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


def ensure_experiment(name: str) -> str:
    """Id of the MLflow experiment `name`, created (with its artifacts beside the store) if missing."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    with _store_lock():
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
            raise UserError(
                f"cannot use the MLflow tracking store {tracking_uri()!r}: {e.message}. Check MLFLOW_TRACKING_URI "
                "(unset it to use the default SQLite store mlflow.db at the repository root)."
            ) from e


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
        """Start (or resume `run_id`); returns the last epoch the store already holds (0 for a new run)."""
        run = self.mlflow.start_run(
            run_id=run_id, experiment_id=self.experiment_id, run_name=name, log_system_metrics=True
        )
        self.run_id = run.info.run_id
        if run_id is not None:
            logged = self.mlflow.MlflowClient().get_metric_history(run_id, "test_acc")
            return max((m.step for m in logged), default=0)
        self.mlflow.log_params({k: str(v) for k, v in flatten(params).items()})
        self.mlflow.set_tags(tags)
        return 0

    def log_epoch(self, row: dict[str, Any]) -> None:
        metrics = {k: float(v) for k, v in row.items() if k != "epoch" and isinstance(v, int | float)}
        self.mlflow.log_metrics(metrics, step=int(row["epoch"]))

    def finish(self, final: dict[str, float], artifacts: list[Path]) -> None:
        self.mlflow.log_metrics({k: float(v) for k, v in final.items()})
        for path in artifacts:
            self.mlflow.log_artifact(str(path))
        self.mlflow.end_run("FINISHED")

    def fail(self, status: str = "FAILED") -> None:
        if self.mlflow.active_run() is not None:
            self.mlflow.end_run(status)


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
