"""Shared fixtures: small synthetic splits, the shared CIFAR-10 archive, throwaway copies of the repository."""

from __future__ import annotations

import csv
import json
import os
import resource
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
QUICK_SOURCE = {"CIFAR10_SOURCE": str(SHARED_ARCHIVE)}  # the quick copy lives elsewhere: no "../shared" beside it
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


def run_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a stage of these tests runs in: this one with this venv first on PATH, no tracking URI or DVC
    root of the caller's (each test names its own), and `env` over it."""
    full_env = os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    full_env.pop("MLFLOW_TRACKING_URI", None)
    full_env.pop("DVC_ROOT", None)
    return full_env | (env or {})


def start_in(repo: Path, *cmd: str, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
    """Start a command in `repo` in `run_env(env)`, in a process group of its own (see `finish`)."""
    return subprocess.Popen(cmd, cwd=repo, env=run_env(env), text=True, start_new_session=True, **popen)


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
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that read the quick pipeline's outputs run last: it trains in the background meanwhile. A helper
    session of a shared queue (SHARE_QUEUE) leaves them to the main one, so that the pipeline trains once."""
    items.sort(key=needs_quick)
    if os.environ.get(SHARE_QUEUE) and os.environ.get(SHARE_ROLE) == "helper":
        config.hook.pytest_deselected(items=[item for item in items if needs_quick(item)])
        items[:] = [item for item in items if not needs_quick(item)]


# `make test` runs several pytest sessions at once over one queue of test files (a folder): each session runs the files
# it claims first, so all stay busy until the queue is empty, whatever the machine makes of each file's time (a static
# split that fits one CPU leaves a session idle for minutes on another). The main session (SHARE_ROLE unset or
# "main") also runs the tests that read the quick pipeline, last; the helpers ("helper") leave those out.
SHARE_QUEUE, SHARE_ROLE = "CHEAPTRAIN_TEST_QUEUE", "CHEAPTRAIN_TEST_ROLE"
# the files that take longest first, so that the last ones claimed are short and the sessions end together
LONGEST_FIRST = (
    "test_compile.py", "test_reliability.py", "test_gpu_session.py", "test_benchmarks.py", "test_server.py",
    "test_gpu_check.py", "test_experiments.py", "test_ledger.py", "test_distributed.py", "test_tracking.py",
)  # fmt: skip


def claim(queue: Path, path: Path) -> bool:
    """True for the one session that claims test file `path` first (an exclusive create is atomic)."""
    try:
        os.close(os.open(queue / path.name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def shared_items(session: pytest.Session, queue: Path):
    """This session's items, in order: those of each file it claims, then (the main session) those reading the
    quick pipeline. Lazy: a file is claimed when the item before its first one is about to run."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in session.items:
        if not needs_quick(item):
            files.setdefault(item.path, []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for path in sorted(files, key=lambda p: rank.get(p.name, len(rank))):  # stable: the rest in collection order
        if claim(queue, path):
            yield from files[path]
    yield from (item for item in session.items if needs_quick(item))


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """With SHARE_QUEUE set, run the items this session claims (pytest's own loop otherwise). Each item is told the
    next one it runs, so that module fixtures end with their file and session fixtures with the session."""
    queue = os.environ.get(SHARE_QUEUE)
    if not queue or session.config.option.collectonly:
        return None
    if session.testsfailed and not session.config.option.continue_on_collection_errors:
        raise session.Interrupted(f"{session.testsfailed} error{'s' * (session.testsfailed > 1)} during collection")
    items = shared_items(session, Path(queue))
    item = next(items, None)
    while item is not None:
        nextitem = next(items, None)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    return True


# CI's length on a machine of few cores is the CPU time of the tests, not their wall time (a test waiting for a core
# looks long in --durations): each session also lists the tests that took the most CPU seconds. A test's are its own
# process's and those of the processes it started and waited for; a process it left running (inductor's compile
# workers, a server shut down by the session) counts where it ends. The quick pipeline's seconds count on the test
# that waits for it first (and reaps it).
CPU_SECONDS: dict[str, float] = {}
CPU_LISTED = 15


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    before = cpu_seconds()
    try:
        return (yield)
    finally:
        CPU_SECONDS[item.nodeid] = cpu_seconds() - before


def pytest_terminal_summary(terminalreporter) -> None:
    """The tests and test files that took the most CPU seconds (setup and teardown included), and the session's
    total: what LONGEST_FIRST orders by."""
    if not CPU_SECONDS:
        return
    files: dict[str, float] = {}
    for nodeid, seconds in CPU_SECONDS.items():
        path = nodeid.split("::")[0]
        files[path] = files.get(path, 0.0) + seconds
    for title, times in (("tests", CPU_SECONDS), ("test files", files)):
        terminalreporter.write_sep("=", f"most CPU seconds ({title}): {min(CPU_LISTED, len(times))} of {len(times)}")
        for name, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:CPU_LISTED]:
            terminalreporter.write_line(f"{seconds:7.1f}s {name}")
    terminalreporter.write_line(f"{sum(CPU_SECONDS.values()):7.1f}s in all, this session's tests")


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
    env = QUICK_SOURCE | {"OMP_WAIT_POLICY": "PASSIVE", "CHEAPTRAIN_THREADS": "1"}
    log = folder / "quick.log"
    with open(log, "w") as out:
        process = start_in(repo, "python", "-m", "cheaptrain.quick", env=env, stdout=out, stderr=subprocess.STDOUT)
    yield repo, process, log
    if process.poll() is None:  # the session ended (or was interrupted) before a test waited for it
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session", autouse=True)
def loaded_started(request, tmp_path_factory, quick_started):
    """Starts test_noise's loaded runs (`test_noise.start_loaded`) at the start of the session when one of its tests
    is selected, so that they train beside the quick pipeline and the other tests, not after them; they read the
    quick pipeline's prepared data (its tests read the quick pipeline, which is started too). Yields (repository,
    process, log file), or None."""
    if quick_started is None or not any(item.path.name == "test_noise.py" for item in request.session.items):
        yield None
        return
    from test_noise import start_loaded

    started = start_loaded(tmp_path_factory.mktemp("loaded"), quick_started[0])
    yield started
    if (process := started[1]).poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def quick(quick_started, shared_archive) -> Path:
    """The quick pipeline's checkout, once it has finished (started by `quick_started`). Tests read from it; the one
    that fails its gate (test_check) puts params.yaml back, and leaves its check runs in the MLflow store."""
    repo, process, log = quick_started
    finish(process, timeout=2400, check=False)
    output = log.read_text()
    assert process.returncode == 0, f"the quick command exited {process.returncode}\n{output}"
    status = run_in(repo, "git", "status", "--porcelain", "--untracked-files=no").stdout
    (repo / "quick.log").write_text(output)
    (repo / "quick.status").write_text(status)  # what `git status` showed right after it: nothing, it must be
    # the tests read the params the experiment ran with from params.yaml, as a checkout after `dvc exp apply` would
    from dvc.utils.hydra import apply_overrides

    from cheaptrain.quick import overrides, with_env_sources

    overlay, params = (yaml.safe_load((repo / name).read_text()) for name in ("params.quick.yaml", "params.yaml"))
    apply_overrides(repo / "params.yaml", overrides(with_env_sources(overlay, params, repo, QUICK_SOURCE)))
    return repo


def write_run(
    root: Path, study: str, name: str, history: list[dict], metrics: dict, config: dict | None = None
) -> None:
    """A run's three files as the train stage writes them, in runs/ or a ledger: history.csv, metrics.json, run.json."""
    folder = root / study / name
    folder.mkdir(parents=True)
    with open(folder / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        writer.writerows(history)
    (folder / "metrics.json").write_text(json.dumps(metrics))
    info = {"name": name, "config": config or {"recipe": {"epochs": len(history), "lr": 0.02}}, "mlflow_run_id": name}
    (folder / "run.json").write_text(json.dumps(info))


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


def run_script(path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python path *args` run in this process, as `__main__`: what it printed, and its exit status as the interpreter
    would make it of a SystemExit. Spares a test the seconds of a new interpreter importing torch again, for a check of
    what a script says. Any other exception propagates: the test fails. Restored after it: sys.argv, sys.path, the
    working directory, torch's thread count and global generators, and the modules imported from the script's folder
    (a script may import another beside it, as `python` puts its folder first on the path)."""
    import contextlib
    import io
    import random
    import runpy

    import torch

    argv, search_path, cwd, modules = sys.argv, list(sys.path), os.getcwd(), set(sys.modules)
    threads, python_random, numpy_random = torch.get_num_threads(), random.getstate(), np.random.get_state()
    sys.argv, sys.path[:0] = [str(path), *args], [str(path.parent)]
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_path(str(path), run_name="__main__")
                status = 0
            except SystemExit as exit:
                status = 0 if exit.code is None else exit.code
                if not isinstance(status, int):  # sys.exit("message"): the message on stderr, status 1
                    print(status, file=sys.stderr)
                    status = 1
    finally:
        sys.argv, sys.path[:] = argv, search_path
        os.chdir(cwd)
        torch.set_num_threads(threads)
        random.setstate(python_random)
        np.random.set_state(numpy_random)
        for name in set(sys.modules) - modules:
            if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == path.parent:
                del sys.modules[name]
    return subprocess.CompletedProcess([sys.executable, str(path), *args], status, stdout.getvalue(), stderr.getvalue())


def run_stage(path: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`run_script` of a stage in `cwd`, in `run_env(env)`: for a test of what a stage says and its exit status where
    nothing depends on a process of its own. Also restored after it, as a stage changes them for its whole process: the
    environment (MLflow sets MLFLOW_TRACKING_URI, stages/train.py OMP_WAIT_POLICY), the SIGTERM and SIGINT handlers, and
    MLflow's tracking URI and active run. Output that a new interpreter would add goes
    unseen: warnings (pytest records them) and what modules print when first imported."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    # the URI set in MLflow, None if none was (mlflow.get_tracking_uri would resolve one)
    mlflow_uri = getattr(sys.modules.get("mlflow.tracking._tracking_service.utils"), "_tracking_uri", None)
    environment = run_env(env)
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(cwd)
    try:
        return run_script(path, *args)
    finally:
        if (mlflow := sys.modules.get("mlflow")) is not None:
            if mlflow.active_run() is not None:
                mlflow.end_run()  # as MLflow's exit handler ends it in a stage's own process
            mlflow.set_tracking_uri(mlflow_uri)  # None: back to MLFLOW_TRACKING_URI or the default
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
