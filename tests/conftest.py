"""Shared fixtures: small synthetic splits, the shared CIFAR-10 archive, throwaway copies of the repository."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_ARCHIVE = REPO.parent / "shared" / "datasets" / "cifar10-jpg.tar.gz"
BIN = Path(sys.executable).parent  # the venv running the tests: its dvc and python run the stages


def synthetic_split(n: int, num_classes: int = 10, seed: int = 0):
    """Random images whose mean colour carries the label: learnable in a few epochs by any model."""
    from cheaptrain.data import Split

    palette = np.random.default_rng(12345).integers(0, 256, (num_classes, 3))  # the same in every split
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, n).astype(np.int64)
    noise = rng.normal(0, 40, (n, 32, 32, 3))
    images = np.clip(palette[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8)
    return Split(images=images, labels=labels, classes=[f"c{i}" for i in range(num_classes)])


def small_config(
    epochs: int = 3,
    study: str = "test",
    method: str = "baseline",
    model: str = "lenet",
    seed: int = 7,
    **recipe_overrides,
):
    """A RunConfig for a few quick CPU epochs of `model` (SGD, lr 0.05, batch 32), the recipe's fields overridable."""
    from cheaptrain.config import Recipe, RunConfig  # late: keeps conftest importable before the package is

    recipe = dict(
        epochs=epochs, batch_size=32, lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=False,
        schedule="multistep", milestones=(2,), gamma=0.1, augment=True,
    )  # fmt: skip
    return RunConfig(
        study=study, dataset="cifar10", model=model, method=method, seed=seed,
        recipe=Recipe(**(recipe | recipe_overrides)), device="cpu",
    )  # fmt: skip


# what a pipeline run leaves in a checkout, untracked: never copied, so tests start clean after `make quickstart`
OUTPUTS = ("runs/", "results/", "data/prepared/", "checkpoints/", "mlartifacts/", "dvc.lock", "mlflow.db")


def git_files(*options: str) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", *options], cwd=REPO, check=True, capture_output=True, text=True)
    return list(filter(None, listed.stdout.split("\0")))


def copy_repo(dest: Path) -> Path:
    """A fresh git repository holding this checkout's files (tracked, and untracked-not-ignored ones that are not
    pipeline outputs), committed."""
    untracked = [name for name in git_files("-o", "--exclude-standard") if not name.startswith(OUTPUTS)]
    for name in git_files("-c") + untracked:
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "test copy"], cwd=dest, check=True)
    return dest


def start_in(repo: Path, *cmd: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start a command in `repo` with this venv first on PATH, in a process group of its own (see `finish`)."""
    full_env = os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env.pop("DVC_ROOT", None)
    return subprocess.Popen(cmd, cwd=repo, env=full_env | (env or {}), text=True, start_new_session=True, **popen)


def finish(process: subprocess.Popen, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    """Wait for a command of `start_in`; returns its CompletedProcess. On timeout the whole process group goes
    (`dvc exp run` -> stages -> python), not only the direct child."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(process.args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def run_in(repo: Path, *cmd: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 2400):
    """Run a command in `repo` with this venv first on PATH; returns the CompletedProcess (output captured)."""
    process = start_in(repo, *cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return finish(process, timeout, check)


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An MLflow SQLite store with its tables: a copy of it spares each test the seconds of creating them."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("store") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


REQUIRE_DATA = "CHEAPTRAIN_REQUIRE_DATA"  # set (CI sets it): a test that needs the real data fails without it


def require_archive(path: Path) -> Path:
    """`path`, the real data; without it the test skips, or fails where REQUIRE_DATA is set."""
    if not path.is_file():
        missing = f"the shared CIFAR-10 archive is not at {path}"
        if os.environ.get(REQUIRE_DATA):
            pytest.fail(f"{missing}, and {REQUIRE_DATA} is set: the end-to-end tests must train on it")
        pytest.skip(missing)
    return path


@pytest.fixture(scope="session")
def shared_archive() -> Path:
    return require_archive(SHARED_ARCHIVE)


def needs_quick(item: pytest.Item) -> bool:
    return "quick" in getattr(item, "fixturenames", ())  # directly or through another fixture


@pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixture scope, which a stable sort keeps
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that read the quick pipeline's outputs run last: it trains in the background meanwhile."""
    items.sort(key=needs_quick)


@pytest.fixture(scope="session", autouse=True)
def quick_started(request, tmp_path_factory):
    """Starts the README's quick command (`python -m cheaptrain.quick`: `dvc exp run` on params.quick.yaml) at the
    start of the session when a selected test reads its outputs, in a throwaway copy of the repository, on the real
    CIFAR-10 archive: it trains while the tests that do not need it run, so the session waits for the longer of the
    two, not for both. Yields (repository, process, log file), or None."""
    if not SHARED_ARCHIVE.is_file() or not any(map(needs_quick, request.session.items)):
        yield None
        return
    folder = tmp_path_factory.mktemp("quick")
    (repo := folder / "repo").mkdir()
    copy_repo(repo)
    # the copy lives in a temporary folder, so "../shared" must come from the environment variable. One thread per
    # training: its figures do not depend on the machine's core count (the thread count changes the float rounding),
    # and it leaves the other cores to the tests running beside it. OpenMP threads sleep while they wait. MLflow
    # samples the system metrics at its default interval (10 s): a run of the quick setting lasts minutes on a CPU
    env = {"CIFAR10_SOURCE": str(SHARED_ARCHIVE), "OMP_WAIT_POLICY": "PASSIVE", "CHEAPTRAIN_THREADS": "1"}
    log = folder / "quick.log"
    with open(log, "w") as out:
        process = start_in(repo, "python", "-m", "cheaptrain.quick", env=env, stdout=out, stderr=subprocess.STDOUT)
    yield repo, process, log
    if process.poll() is None:  # the session ended (or was interrupted) before a test waited for it
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session", autouse=True)
def loaded_started(request, tmp_path_factory):
    """Starts test_noise's loaded runs (`test_noise.start_loaded`) at the start of the session when one of its tests
    is selected, so that they train beside the quick pipeline and the other tests, not after them. Yields
    (repository, process, log file), or None."""
    if not SHARED_ARCHIVE.is_file() or not any(item.path.name == "test_noise.py" for item in request.session.items):
        yield None
        return
    from test_noise import start_loaded

    started = start_loaded(tmp_path_factory.mktemp("loaded"))
    yield started
    if (process := started[1]).poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def quick(quick_started, shared_archive) -> Path:
    """The quick pipeline's checkout, once it has finished (started by `quick_started`). Tests only read from it."""
    repo, process, log = quick_started
    finish(process, timeout=2400, check=False)
    output = log.read_text()
    assert process.returncode == 0, f"the quick command exited {process.returncode}\n{output}"
    status = run_in(repo, "git", "status", "--porcelain", "--untracked-files=no").stdout
    (repo / "quick.log").write_text(output)
    (repo / "quick.status").write_text(status)  # what `git status` showed right after it: nothing, it must be
    # the tests read the params the experiment ran with from params.yaml, as a checkout after `dvc exp apply` would
    from dvc.utils.hydra import apply_overrides

    from cheaptrain.quick import overrides

    apply_overrides(repo / "params.yaml", overrides(yaml.safe_load((repo / "params.quick.yaml").read_text())))
    return repo


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def grid(repo: Path):
    """(study, run name, epochs) of every run that the repository's params.yaml grid trains."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for study, g in params["grid"].items():
        for dataset in g["datasets"]:
            for model in g["models"]:
                for method in g["methods"]:
                    for seed in g["seeds"]:
                        yield study, f"{dataset}-{model}-{method}-s{seed}", params["recipes"][study]["epochs"]
