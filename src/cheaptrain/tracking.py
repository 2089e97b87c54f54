"""MLflow tracking: where the store is, one MLflow experiment per study, one MLflow run per trained configuration.

Default store: an SQLite database `mlflow.db` at the repository root, artifacts in `mlartifacts/` beside it.
Under `dvc exp run --temp/--queue` stages run in a temporary copy of the repo; DVC then sets DVC_ROOT to the real
root, so runs still land in the workspace store. MLFLOW_TRACKING_URI overrides the store (another SQLite file, a
relative path being the repository root's, or a tracking server: `python -m cheaptrain.server`).

The store is checked when a stage starts, before any work: a misconfigured or unreachable store fails within
seconds with one clear error (MLflow alone retries an HTTP server for minutes, an unopenable SQLite file for ~100 s).
Concurrent runs share an SQLite store safely: MLflow sets a 20 s SQLite busy timeout on every session, and
creating or migrating the tables of any SQLite store (MLflow does it when a process first opens the file) is
serialised across processes by a lock file beside it, `.<file name>.lock`. Without it, processes that open a new
store at once migrate it together and leave it half-migrated for good. A store left so by an earlier crash is named
in one error at start, with how to recover.

Every experiment is marked a model-training one (tag `mlflow.experimentKind`), so that the MLflow UI opens on its
runs, not on the empty GenAI traces view; a run's prepared dataset is logged as its dataset input.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cheaptrain import UserError

if TYPE_CHECKING:
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import DatasetInput

# The MLflow UI opens an experiment on the view of its kind; without the tag MLflow 3 shows GenAI traces.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def mlflow_installed(untracked: str) -> bool:
    """Whether MLflow can be imported. Where it cannot (a GPU machine with PyTorch alone) the caller goes on without
    tracking, and this says so on stderr: `untracked` names what is not tracked and what is still written."""
    if importlib.util.find_spec("mlflow") is not None:
        return True
    print(f"warning: MLflow is not installed: {untracked}", file=sys.stderr)
    return False


class Interrupts:
    """SIGTERM and SIGINT in a training process: a KeyboardInterrupt (so that its MLflow run is marked KILLED), held
    back while the run writes to the store. Interrupted inside an SQLite transaction, MLflow can leave the store
    locked for the rest of the process, and the run could not be marked at all. A second signal during a write
    interrupts at once (a store that hangs must not make the run unstoppable)."""

    def __init__(self) -> None:
        self.writing = False
        self.held: int | None = None

    def handle(self, signum: int, frame: object) -> None:
        """The signal handler (stages/train.py installs it)."""
        if self.writing and self.held is None:
            self.held = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    @contextlib.contextmanager
    def held_back(self) -> Iterator[None]:
        """A store write: a signal that arrives during it interrupts once it is done."""
        self.writing = True
        try:
            yield
        finally:
            self.writing, signum, self.held = False, self.held, None
        if signum is not None:  # the write is done (a write that failed raises its own error)
            raise KeyboardInterrupt(f"signal {signum}")


INTERRUPTS = Interrupts()


def project_root() -> Path:
    """The real repository root: DVC_ROOT under DVC (also for temporary experiment copies), else the cwd."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def default_uri() -> str:
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the default store. A relative SQLite path there is the repository root's
    (project_root), as the default store is: a temporary copy of the repository would lose its own file."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return default_uri()
    path = sqlite_file(uri)
    if path is None or path.is_absolute():
        return uri
    query = uri.partition("?")[1] + uri.partition("?")[2]
    return f"sqlite:///{project_root() / path}{query}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of an SQLite store URI; None for other stores and in-memory databases."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise, across processes, whatever may create or migrate the tables of an SQLite store."""
    path = sqlite_file(uri)
    if path is None:
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if the process dies
        yield


# The start-up probe of an HTTP store: a few seconds, not MLflow's default of 7 retries with exponential backoff
# and a 120 s timeout each. Training keeps the defaults, which ride out a short outage of the server.
PROBE_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def store_error(problem: str, fix: str | None = None, uri: str | None = None) -> UserError:
    """One paragraph naming the store (default: the tracking URI), what is wrong with it and how to fix it (by
    default: choose another)."""
    uri = uri or tracking_uri()
    problem = " ".join(problem.split()).rstrip(".")
    if len(problem) > 600:  # a web server's HTML error page, say
        problem = problem[:600] + " ..."
    if fix is None and uri != tracking_uri():  # a store named otherwise (the server's --store)
        fix = "Fix its URI, or choose another store"
    elif fix is None and os.environ.get("MLFLOW_TRACKING_URI"):
        fix = f"Fix MLFLOW_TRACKING_URI, or unset it to use the default store {default_uri()!r}"
    elif fix is None:
        fix = "That is the default store (mlflow.db at the repository root); MLFLOW_TRACKING_URI chooses another"
    return UserError(f"cannot use the MLflow tracking store {uri!r}: {problem}. {fix}. Stopped before any work.")


def check_sqlite_path(uri: str) -> None:
    """Fail fast where MLflow would create a mistyped folder, or retry ~100 s before failing."""
    path = sqlite_file(uri)
    if path is None:
        return
    if not path.parent.is_dir():
        raise store_error(f"{path.parent} is not an existing folder (create it if the path is right)", uri=uri)
    if path.exists() and not path.is_file():
        raise store_error(f"{path} exists but is not a file", uri=uri)
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        problem = f"{path} or its folder is not writable by this user (SQLite writes beside the file)"
        raise store_error(problem, uri=uri)


def check_sqlite_schema(uri: str) -> None:
    """Refuse an SQLite store whose schema migration was interrupted: MLflow would fail on it, or run the half-done
    steps again ("duplicate column name", "table _alembic_tmp_... already exists"). Called under the store's lock,
    so no other process of this project is migrating it."""
    path = sqlite_file(uri)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return  # a new store: MLflow creates its tables
    try:
        # read-write: a writer killed mid-transaction leaves a journal that the next reader must roll back
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True, timeout=20)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            versioned = "alembic_version" in tables
            versions = [v for (v,) in db.execute("SELECT version_num FROM alembic_version")] if versioned else []
    except sqlite3.DatabaseError as e:
        raise store_error(f"{path} cannot be read as an SQLite database ({e})", uri=uri) from e
    recover = f"Restore a backup of {path}, or move the file away to start a new, empty store there"
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    unstamped = versioned and not versions and tables != {"alembic_version"}  # died in its first migration
    if leftovers or unstamped:
        found = f"leftover tables {', '.join(leftovers)}" if leftovers else "tables, but no schema revision"
        problem = f"{path} is half-migrated: a migration of its MLflow schema was interrupted ({found})"
        raise store_error(problem, recover, uri)
    if not versioned:
        return  # no migration has started: MLflow creates what is missing and migrates it
    import mlflow
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config  # MLflow's own migration scripts

    scripts = ScriptDirectory.from_config(_get_alembic_config(""))
    head = scripts.get_current_head()
    if versions == [head]:
        return
    known = {script.revision for script in scripts.walk_revisions()}
    if not set(versions) <= known:
        raise store_error(
            f"{path} has the MLflow schema revision {', '.join(versions)}, which MLflow {mlflow.__version__} does "
            "not know: a newer MLflow wrote it",
            f"Use that MLflow version, or move {path} away to start a new, empty store there",
            uri,
        )
    raise store_error(
        f"{path} has the MLflow schema revision {', '.join(versions)}, not {head}, the one MLflow "
        f"{mlflow.__version__} uses: a migration of it was interrupted, or an older MLflow wrote it",
        f"{recover}; if an older MLflow wrote it and it is intact, back it up and run `mlflow db upgrade {uri}`",
        uri,
    )


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


@contextlib.contextmanager
def _as_store_error(uri: str) -> Iterator[None]:
    """Any failure to open the store as one store_error (our own UserErrors pass through)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except UserError:
        raise
    except MlflowException as e:
        raise store_error(e.message, uri=uri) from e
    except Exception as e:  # OSError, SQLAlchemy or requests errors that MLflow passes through
        raise store_error(f"{type(e).__name__}: {e}", uri=uri) from e


def _open(uri: str, artifact_root: str | None = None) -> MlflowClient:
    """A client of the store; call under _store_lock(uri): constructing it creates or migrates SQLite tables, a new
    store's Default experiment with its artifacts under `artifact_root` (default: MLflow's client's, ./mlruns)."""
    from mlflow import MlflowClient

    check_sqlite_schema(uri)
    if artifact_root is not None:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        SqlAlchemyStore(uri, artifact_root)  # as `mlflow server` creates a store
    return MlflowClient(uri)


def store_client(uri: str | None = None, artifact_root: str | None = None) -> MlflowClient:
    """A client of the store (default: the tracking URI), opened safely: for code that reads the store before
    ensure_experiment has opened it in this process. `artifact_root`: of a new store's Default experiment."""
    uri = uri or tracking_uri()
    check_sqlite_path(uri)
    with _store_lock(uri), _as_store_error(uri):
        return _open(uri, artifact_root)


def ensure_experiment(name: str) -> str:
    """Id of the MLflow experiment `name`, created (with its artifacts beside the store) if missing, and marked a
    model-training experiment.

    This is the start-up check of the store: any problem raises a UserError within seconds."""
    from mlflow.exceptions import MlflowException

    uri = tracking_uri()
    check_sqlite_path(uri)
    with _store_lock(uri), _bounded_http(), _as_store_error(uri):
        client = _open(uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            # beside an SQLite file, not in the cwd's ./mlruns (lost with a temporary copy of the repository); a
            # tracking server chooses its own artifact store
            path = sqlite_file(uri)
            location = None if path is None else (path.parent.resolve() / "mlartifacts" / name).as_uri()
            try:
                return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
            except MlflowException as e:  # a tracking server: another process created it just now
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = client.get_experiment_by_name(name)
        if experiment.lifecycle_stage == "deleted":
            client.restore_experiment(experiment.experiment_id)
        for key, value in EXPERIMENT_KIND.items():
            if experiment.tags.get(key) != value:
                client.set_experiment_tag(experiment.experiment_id, key, value)
        return experiment.experiment_id


# --- datasets ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetRef:
    """The prepared data a run read, as MLflow shows it in the Dataset column: name, digest, where it came from."""

    name: str
    digest: str
    source: str
    context: str = "training"


def dataset_ref(prepared_dir: Path, context: str = "training") -> DatasetRef:
    """The DatasetRef of a prepared folder (data/prepared/<dataset>): the digest of its arrays (data.prepared_digest,
    the one a checkpoint records) and the source its manifest names (the archive, or the official URL)."""
    from cheaptrain.data import prepared_digest

    manifest = json.loads((prepared_dir / "manifest.json").read_text())
    origin = manifest.get("source")
    if isinstance(origin, dict):  # as prepare.py writes it: the params' source, and the environment's override
        origin = origin.get("env") or origin.get("param")
    if origin == "torchvision":
        origin = (manifest.get("archive") or {}).get("url") or origin
    name = manifest.get("dataset") or prepared_dir.name
    return DatasetRef(name, prepared_digest(prepared_dir), str(origin or prepared_dir), context)


def dataset_input(ref: DatasetRef) -> DatasetInput:
    """The MLflow dataset input of `ref`, for MlflowClient.log_inputs (a live run, or one imported from files)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    if ref.source.lower().startswith(("http://", "https://")):
        source_type, source = "http", {"url": ref.source}
    else:
        source_type, source = "local", {"uri": ref.source}
    dataset = Dataset(name=ref.name, digest=ref.digest, source_type=source_type, source=json.dumps(source))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", ref.context)])


def log_dataset(client: MlflowClient, run_id: str, ref: DatasetRef) -> None:
    """Log `ref` as the dataset input of the run. MLflow adds a dataset new to an experiment without a guard, so runs
    that start together race to add the same one ("UNIQUE constraint failed: datasets..."); the loser of the race
    finds it on its second try."""
    from mlflow.exceptions import MlflowException

    try:
        client.log_inputs(run_id, datasets=[dataset_input(ref)])
    except MlflowException:
        client.log_inputs(run_id, datasets=[dataset_input(ref)])


def git_commit() -> str:
    if rev := os.environ.get("DVC_EXP_BASELINE_REV"):
        return rev
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def cuda_device(device: str) -> torch.device | None:
    """The GPU a `train.device` setting names here ("auto" as the trainer reads it); None for a CPU, or without CUDA."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device) if device.startswith("cuda") and torch.cuda.is_available() else None


def device_name(device: str) -> str:
    """The GPU's name, or the CPU's and its core count, of a `train.device` setting ("auto" as the trainer reads it)."""
    import torch

    if (gpu := cuda_device(device)) is not None:
        return torch.cuda.get_device_name(gpu)
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

    def start(
        self,
        name: str,
        params: dict[str, Any],
        tags: dict[str, str],
        run_id: str | None = None,
        dataset: DatasetRef | None = None,
    ) -> int:
        """Start a run, or continue `run_id`; returns the last epoch the store holds of it (0 for a new run).

        A new run gets the params, tags and dataset input. A run that the store no longer has (deleted, or the store
        was replaced) is started afresh under a new id."""
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
        with INTERRUPTS.held_back():
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
            if dataset is not None:
                log_dataset(client, self.run_id, dataset)
            return 0

    def note_resume(self, epoch: int, machines: list[dict[str, Any]]) -> None:
        """Record on the run each epoch it was resumed after (tag `resumed_after_epochs`, e.g. "2,5"), and the
        machines it trained on once it is resumed on another (tag `machines`, `machines_text`)."""
        previous = self.mlflow.MlflowClient().get_run(self.run_id).data.tags.get("resumed_after_epochs")
        with INTERRUPTS.held_back():
            self.mlflow.set_tag("resumed_after_epochs", f"{previous},{epoch}" if previous else str(epoch))
            if text := machines_text(machines):
                self.mlflow.set_tag("machines", text)

    def log_epoch(self, row: dict[str, Any]) -> None:
        """One epoch's metrics in one batch: the store holds all of an epoch or none of it. The epoch is already
        checkpointed, so a store that fails (once MLflow's retries are spent) stops the run with a clear error."""
        from mlflow.exceptions import MlflowException

        metrics = {k: float(v) for k, v in row.items() if k != "epoch" and isinstance(v, int | float)}
        try:
            with INTERRUPTS.held_back():
                self.mlflow.log_metrics(metrics, step=int(row["epoch"]))
        except MlflowException as e:
            raise UserError(
                f"cannot log epoch {row['epoch']} to the MLflow store {tracking_uri()!r}: "
                f"{' '.join(e.message.split())[:600]}. The epoch is checkpointed: run again once the store works, "
                "to resume the run and log the epochs the store missed."
            ) from e

    def finish(self, final: dict[str, float], artifacts: list[Path]) -> None:
        with INTERRUPTS.held_back():
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
        from mlflow.exceptions import MlflowException

        client = store_client()  # the project's store, also where no RunTracker has set MLflow's tracking URI
        with contextlib.suppress(MlflowException):  # gone from the store: nothing to end
            client.set_tag(run_id, "abandoned", reason)
            if client.get_run(run_id).info.status == "RUNNING":  # killed: it could not say so itself
                client.set_terminated(run_id, "KILLED")


def stage_tags() -> dict[str, str]:
    """Where a run comes from: the git commit, the DVC stage and the DVC experiment."""
    commit = git_commit()
    return {
        "git_commit": commit,
        "mlflow.source.git.commit": commit,
        "dvc_stage": os.environ.get("DVC_STAGE", ""),
        "dvc_exp": os.environ.get("DVC_EXP_NAME", ""),
    }


def machines_text(machines: Any) -> str:
    """run.json's `machines` in words where a run trained on several ('cpu: AMD EPYC x2 with AVX512 from epoch 1, cpu:
    AMD EPYC x2 with AVX2 from epoch 57'); '' for one machine, or a run.json that predates the record."""
    if not isinstance(machines, list) or len(machines) < 2:
        return ""
    known = [m if isinstance(m, dict) else {} for m in machines]
    return ", ".join(f"{machine_words(m)} from epoch {m.get('from_epoch')}" for m in known)


def machine_words(machine: dict[str, Any]) -> str:
    """A recorded machine in words: 'NVIDIA H200 GPU-8f3c2a1b with AVX512', 'cpu: AMD EPYC x2 with AVX2'."""
    gpu = f" {machine['gpu_uuid'][:12]}" if machine.get("gpu_uuid") else ""
    kernels = f" with {machine.get('cpu_capability')}" if machine.get("cpu_capability") else ""
    return f"{machine.get('device') or 'an unnamed device'}{gpu}{kernels}"


def machine_here(device: str) -> dict[str, str]:
    """What a run trains on here: the device's name, and the vector instructions of torch's CPU kernels (two CPUs of
    one name may differ in them, and round differently and run at other speeds with them); on a GPU also its UUID
    (two GPUs of one name, rented one after the other, can differ in speed by a fifth: docs/ledger.md)."""
    import torch

    here = {"device": device_name(device), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if uuid := gpu_uuid(device):
        here["gpu_uuid"] = uuid
    return here


def gpu_uuid(device: str) -> str:
    """The UUID of the GPU a `train.device` setting names ('GPU-58f5ac0a-3b8e-...', as nvidia-smi -L prints it); ''
    on a CPU, or where this PyTorch or driver does not say."""
    import torch

    if (gpu := cuda_device(device)) is None:
        return ""
    try:
        return f"GPU-{torch.cuda.get_device_properties(gpu).uuid}"
    except Exception:  # whatever an older PyTorch or driver raises: recording where a run trained never stops it
        return ""


def run_tags(study: str, device: str) -> dict[str, str]:
    import torch

    return {"study": study, **stage_tags(), **machine_here(device), "torch_version": torch.__version__}


# --- the runs of the other stages --------------------------------------------------------------------------


def metric_key(text: str) -> str:
    """`text` as an MLflow metric name: characters MLflow refuses become '_', empty path segments go."""
    key = re.sub(r"[^/\w.\- :]", "_", text)
    return "/".join(part.strip() for part in key.split("/") if part.strip() not in ("", ".", ".."))[:250]


def log_stage_run(
    experiment: str,
    name: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    dataset: DatasetRef | None = None,
    table: tuple[str, dict[str, list[Any]]] | None = None,
) -> str:
    """One finished MLflow run of a stage, tagged with stage_tags(); returns its id. `table`: (artifact file,
    columns) for MLflow's table view. A store that fails here (it worked when the stage started) is a UserError."""
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    experiment_id = ensure_experiment(experiment)
    client, run_id = store_client(), None
    try:
        run_id = client.create_run(experiment_id, run_name=name, tags=stage_tags()).info.run_id
        now = int(time.time() * 1000)
        logged = [Metric(metric_key(k), float(v), now, 0) for k, v in metrics.items()]
        for i in range(0, len(logged), 1000):  # MLflow's limit per batch
            client.log_batch(run_id, metrics=logged[i : i + 1000])
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items() if v is not None])
        if dataset is not None:
            log_dataset(client, run_id, dataset)
        if table is not None:
            client.log_table(run_id, table[1], table[0])
        client.set_terminated(run_id, "FINISHED")
    except BaseException as e:  # a store error, a full disk under the artifacts, a Ctrl-C
        if run_id is not None:  # not left RUNNING; the store may be what failed, so its error is the one raised
            with contextlib.suppress(Exception):
                client.set_terminated(run_id, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        if not isinstance(e, MlflowException):
            raise
        raise UserError(
            f"cannot log the {experiment} run {name} to the MLflow store {tracking_uri()!r}: "
            f"{' '.join(e.message.split())[:600]}. Run the stage again once the store works."
        ) from e
    return run_id


def log_download(prepared_dir: Path, source: str, seconds: float) -> str:
    """The download stage's run (experiment `download`, named after the dataset): where the data came from, the
    archive's checksum, the images per split and class, and the seconds that fetching and preparing took. Its
    dataset input is the one of the training runs that read the data (the same digest)."""
    manifest = json.loads((prepared_dir / "manifest.json").read_text())
    ref = dataset_ref(prepared_dir, context="prepared")
    archive = manifest.get("archive") or {}
    params = {
        "dataset": ref.name,
        "source": source,
        "layout": manifest.get("layout"),
        "archive.file": archive.get("file"),
        "archive.sha256": archive.get("sha256"),
        "archive.md5": archive.get("md5"),
        "archive.url": archive.get("url"),
        "digest": ref.digest,
    }
    metrics = {"prepare_s": seconds}
    for split, counts in manifest["splits"].items():
        metrics[f"images/{split}"] = counts["count"]
        metrics |= {f"images/{split}/{label}": n for label, n in counts["per_class"].items()}
    return log_stage_run("download", ref.name, params, metrics, dataset=ref)


def _leading_number(text: str) -> float | None:
    """12.5 of '12.50 %', '>= 12.50 %' or '+1.20 (ref +1.00)'; None where the text does not start with one."""
    match = re.match(r"(?:[<>]=\s*)?([+-]?\d+(?:\.\d+)?)(?:\s|$)", text)
    return float(match.group(1)) if match else None


def log_check(checks: list[dict[str, str]], outcome: dict[str, Any], params: dict[str, Any]) -> str:
    """The check stage's run (experiment `check`): per check its value, limit and verdict as metrics
    (`<configuration> <check>/value`, `/limit`, `/pass` = 1 or 0), every check as the table `checks.json` (the
    texts as printed), the outcome (passed, checks, violations, not_checked) and `params` (the inputs)."""
    metrics: dict[str, float] = {k: float(v) for k, v in outcome.items()}
    for check in checks:
        if check["status"] == "skip":
            continue
        key = f"{check['config']} {check['check']}"  # log_stage_run makes it a valid metric name
        metrics[f"{key}/pass"] = float(check["status"] == "pass")
        for part in ("value", "limit"):
            if (number := _leading_number(check[part])) is not None:
                metrics[f"{key}/{part}"] = number
    columns = {column: [c[column] for c in checks] for column in ("status", "config", "check", "value", "limit")}
    name = f"check-{os.environ['DVC_EXP_NAME']}" if os.environ.get("DVC_EXP_NAME") else "check"
    return log_stage_run("check", name, params, metrics, table=("checks.json", columns))
