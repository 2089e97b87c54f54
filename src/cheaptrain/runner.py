"""One run end to end: load the prepared data, start (or resume) its MLflow run, train, write the outputs.

Outputs of run `<study>/<dataset>-<model>-<method>-s<seed>` under `runs/`:
    history.csv   one row per epoch (every per-epoch metric)
    metrics.json  the final metrics (DVC metrics)
    run.json      the resolved configuration and where the run came from: code, data, device, versions, MLflow run

A checkpoint is written atomically after every epoch to `checkpoints/<study>/<name>-<fingerprint>.pt` at the repository
root, outside the outputs (DVC deletes a stage's outputs before running it): its bytes are taken at the epoch's end, and
they go to disk while the next epoch trains. Re-running an interrupted run resumes from it and continues the same MLflow
run, which receives each epoch exactly once. An epoch is logged once its checkpoint is on disk, so the store is never
ahead of it; the checkpoint is deleted when the run completes, and when the run fails before its first epoch. A
checkpoint resumes only the run that wrote it: the file name carries the configuration's fingerprint, and one written by
other training code, from other prepared data or on another kind of device is discarded (with a warning), as is an
unreadable one. A run resumed on another machine of that kind (another GPU, a CPU of other vector instructions) goes on,
and run.json's `machines` lists each machine with the first epoch it trained: its times against another run's do not
compare (`aggregate.machine_difference`). Of several processes training the same configuration at once, only the
first uses the checkpoint (a lock file beside it).

With params `train.ledger: record` a finished run is also kept in the results ledger (ledger.py), and a run whose
ledger entry matches is not trained again. A run whose loss becomes NaN stops, keeping its checkpoint; at its paper's
setting in ledger mode record, its epochs before the divergence are kept instead as its outputs and ledger entry
(`diverged_epoch` in its metrics): run again on that kind of machine it diverges again, a result a count of falls
needs.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import ctypes
import fcntl
import functools
import hashlib
import inspect
import io
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from cheaptrain import UserError, atomic_write
from cheaptrain import ledger as ledger_
from cheaptrain.config import RunConfig
from cheaptrain.data import load_split, prepared_digest
from cheaptrain.distributed import ONE, Processes, broadcast, device_of, start
from cheaptrain.methods import METHODS, create_method, implementation
from cheaptrain.tracking import (
    RunTracker,
    dataset_ref,
    git_commit,
    machine_here,
    machine_words,
    mlflow_installed,
    project_root,
    run_tags,
)
from cheaptrain.trainer import TrainingDiverged, final_metrics, fit, resolve_device

IDENTITY_NAMES = {"config": "configuration", "code": "training code", "data": "prepared data", "device": "device"}


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed blocks for reuse instead of handing them back to the OS (a training stage's
    process calls it at its start: the setting is process-wide; Linux with glibc only, else a no-op).

    By default glibc maps every block over 128 KiB (a threshold it then raises and lowers as blocks come and go)
    and unmaps it when freed, so each CPU training step faults its activations' pages in anew
    (`benchmarks/malloc.py` measures the difference). Numbers are unchanged; only where memory comes from."""
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's, or musl's no-op
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest; a fixed value also stops it from moving
    mallopt(m_trim_threshold, 1 << 30)  # keep up to 1 GiB of freed memory at the top of the heap


def checkpoint_path(cfg: RunConfig) -> Path:
    return project_root() / "checkpoints" / cfg.study / f"{cfg.name}-{cfg.fingerprint()}.pt"


def imported_files(module: str) -> list[Path]:
    """The source files of `module` and of every cheaptrain module it imports, directly or not, as the code reads
    (import statements anywhere in a file, deferred ones too). A subpackage brings all its modules (`methods`
    imports each of them); a submodule brings the __init__.py of each package above it, which Python runs first;
    the package root is its __init__.py."""
    root = Path(__file__).parent

    def files_of(name: str) -> list[Path]:
        parts = name.split(".")[1:]
        path = root.joinpath(*parts)
        if path == root:
            return [root / "__init__.py"]
        if path.is_dir():
            return sorted(path.rglob("*.py"))
        if not path.with_suffix(".py").is_file():
            return []  # a name, not a module
        parents = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]  # a submodule runs them
        return [path.with_suffix(".py"), *parents]

    seen: set[Path] = set()
    todo = files_of(module)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                if name == "cheaptrain" or name.startswith("cheaptrain."):
                    todo += files_of(name)
    return sorted(seen)


@functools.cache  # about 40 ms (every file parsed and hashed); the sources do not change within a process
def code_version(method: str) -> str:
    """Hash of the code that trains a run of the registered `method`: trainer.py and what it imports (configuration,
    data, models, costs), and of the methods package only the modules that define this method's class and its
    bases; not the tracking or the outputs around it. A checkpoint never mixes two versions in one run, and a
    ledger entry is reused only by the code that would train it again (a method added beside it changes nothing)."""
    root = Path(__file__).parent
    methods_dir = root / "methods"
    own = {Path(inspect.getfile(cls)) for cls in METHODS[method].__mro__ if cls.__module__.startswith("cheaptrain.")}
    own.add(methods_dir / "__init__.py")
    digest = hashlib.sha256()
    for path in [p for p in imported_files("cheaptrain.trainer") if p.parent != methods_dir or p in own]:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def run_code_version(cfg: RunConfig) -> str:
    return code_version(implementation(cfg.method, cfg.method_args))


def identity(cfg: RunConfig) -> dict[str, str]:
    """What a checkpoint must match to be resumed."""
    return {
        "config": cfg.fingerprint(),
        "code": run_code_version(cfg),
        "data": prepared_digest(cfg.data_dir),
        "device": resolve_device(cfg.device).type,
    }


def same_machine(recorded: dict[str, Any], here: dict[str, str]) -> bool:
    """Whether a recorded machine (a checkpoint's, run.json's `machines`) is `machine_here`'s."""
    return all(recorded.get(k) == v for k, v in here.items())


def machines_of(resume: dict[str, Any] | None, here: dict[str, str]) -> list[dict[str, Any]]:
    """The machines a run trains on, each with the first epoch it trained there: those of the checkpoint's epochs, and
    this attempt's where it differs from the last. Epochs of a checkpoint that does not record them are 'unrecorded'."""
    done = len(resume["history"]) if resume else 0
    earlier = resume.get("machines") if resume else None
    if earlier is None:
        earlier = [{"from_epoch": 1, "device": "unrecorded", "cpu_capability": ""}] if done else []
    machines = [m for m in earlier if m["from_epoch"] <= done]  # an attempt that checkpointed no epoch trained none
    if not machines or not same_machine(machines[-1], here):
        machines.append({"from_epoch": done + 1, **here})
    return machines


def cpu_threads(setting: int | str, share: int = 1) -> int:
    """The CPU threads this process trains with: `setting`, or for "auto" its fair share of the cores among the
    trainings of this repository running now (each holds a lock under checkpoints/, this one included) and the
    `share` processes of its own run. Env CHEAPTRAIN_THREADS overrides both."""
    if env := os.environ.get("CHEAPTRAIN_THREADS"):
        if not env.isdigit() or int(env) < 1:
            raise UserError(f"CHEAPTRAIN_THREADS={env!r} is invalid; accepted: a positive integer")
        return int(env)
    if setting != "auto":
        return int(setting)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // (max(1, running_trainings()) * share))


def running_trainings() -> int:
    """Training processes of this repository that hold their checkpoint lock now."""
    return sum(lock_held(path) for path in (project_root() / "checkpoints").glob("*/*.lock"))


def lock_held(path: Path) -> bool:
    """Whether a process holds this checkpoint lock now (the kernel releases it when the process dies)."""
    with contextlib.suppress(OSError), open(path) as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def runs_under_way(device: str = "auto") -> list[str]:
    """One line per checkpoint under checkpoints/ (a run started, not finished): its last epoch and accuracy, and
    whether a process trains it now, it waits for its command to be run again, or its command would start afresh:
    other training code, other prepared data (where its dataset is prepared here) or another kind of device than
    `device` (params train.device) wrote it."""
    lines, code_now = [], {code_version(method) for method in METHODS}
    here = resolve_device("auto").type if device == "auto" else device.split(":")[0]
    digests: dict[str, str | None] = {}  # per dataset: the prepared data's, None where none is prepared here
    for path in sorted((project_root() / "checkpoints").glob("*/*.pt")):
        name = f"{path.parent.name}/{path.stem.rsplit('-', 1)[0]}"
        dataset = path.stem.split("-", 1)[0]
        if dataset not in digests:
            digests[dataset] = digest_here(project_root() / RunConfig.data_root / dataset)
        expected = ({"data": digests[dataset]} if digests[dataset] else {}) | {"device": here}
        try:
            written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
            state, problem = read_checkpoint(path, expected)
        except FileNotFoundError:
            state, problem = None, None
        if state is None and problem is None:
            lines.append(f"{name}: its checkpoint {path} vanished while listed: its run finished or started afresh")
            continue
        if state is None:
            lines.append(f"{name}: unusable checkpoint {path} ({problem}): its run starts afresh")
            continue
        history, total = state["history"], state.get("epochs")
        done = f"epoch {len(history)}" + (f"/{total}" if total else "")
        acc = f", test acc {history[-1]['test_acc']:.2f}%" if history else ""
        if lock_held(path.with_suffix(".lock")):
            what = "training now"
        elif state["identity"].get("code") not in code_now:
            what = "stopped, written by other training code: this checkout's command trains the run afresh"
        elif problem:
            what = f"stopped, would start afresh: {problem} than here"
            if {k for k, v in expected.items() if state["identity"].get(k) != v} == {"data"}:
                what += (f" (data/prepared/{dataset}); in a copy of the repository that holds the data it was "
                         "written with, as `dvc exp run --temp` makes, it resumes")  # fmt: skip
        else:
            what = "stopped: the command that started it resumes it" + elsewhere(state, machine_here(device))
        lines.append(f"{name}: {done}{acc}, written {written}, {what}")
    return lines


def elsewhere(state: dict[str, Any], here: dict[str, str]) -> str:
    """', here on another machine ...' where the checkpoint's last epochs trained on another machine than this."""
    last = (state.get("machines") or [{}])[-1]
    if not last or same_machine(last, here):
        return ""
    return (f", here on another machine than its last ({machine_words(last)}; here {machine_words(here)}): its time "
            "will pair with no baseline's")  # fmt: skip


def digest_here(data_dir: Path) -> str | None:
    """The digest of the data prepared in `data_dir`; None where none is."""
    try:
        return prepared_digest(data_dir)
    except OSError:
        return None


@contextlib.contextmanager
def checkpoint_owner(lock_path: Path, wait_s: float = 1.0) -> Iterator[bool]:
    """Whether this process owns the checkpoint of its configuration. Of several processes that train the same
    configuration at once (queued DVC experiments that share a run, say) the first does; the others train without
    one, rather than resume or overwrite each other's state. A probe of the lock (lock_held) holds it for an instant:
    the lock is tried again for `wait_s` before another process is taken to own it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while True:
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel when the process dies
            except BlockingIOError:
                pass
            else:
                if same_file(lock, lock_path):
                    yield True
                    return
                continue  # its owner finished and removed the file this process had opened: lock the one there now
        if time.monotonic() >= deadline:
            yield False
            return
        time.sleep(0.02)


def same_file(opened: Any, path: Path) -> bool:
    """Whether the open file `opened` is the file at `path` now (not one removed since it was opened)."""
    try:
        here, there = os.fstat(opened.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def remove_checkpoint(ckpt: Path) -> None:
    """Remove a checkpoint and its lock file (the lock may be held: its holder is the one removing it)."""
    ckpt.unlink(missing_ok=True)
    ckpt.with_suffix(".lock").unlink(missing_ok=True)


def remove_finished(cfg: RunConfig, entry_epochs: int) -> str | None:
    """Remove the checkpoint of `cfg` and its lock where it holds every epoch, or those of its matching ledger entry
    (`entry_epochs`: a run whose loss diverged keeps its epochs before): its run recorded the entry, then stopped
    before removing them (killed, or its MLflow store failed). One a process trains from now stays, and so does one of
    an unfinished run (a retrain interrupted), to resume. Returns the MLflow run the removed checkpoint names."""
    ckpt = checkpoint_path(cfg)
    if not ckpt.exists():
        return None
    with checkpoint_owner(ckpt.with_suffix(".lock"), wait_s=0) as owner:
        state = read_checkpoint(ckpt, {})[0] if owner else None
        epochs = len(state["history"]) if state is not None else 0
        if state is not None and (epochs >= cfg.recipe.epochs or epochs == entry_epochs):
            remove_checkpoint(ckpt)
            print(f"{cfg.name}: removed the checkpoint of its finished run, {ckpt}", file=sys.stderr)
            return state.get("run_id")
    return None


def checkpoint_bytes(state: dict[str, Any]) -> bytes:
    """The checkpoint file's bytes: the state as it is now (the tensors copied off the device too)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def read_checkpoint(path: Path, expected: dict[str, str]) -> tuple[dict[str, Any] | None, str | None]:
    """(state, None) for a checkpoint to resume; (state or None, why not) for one to discard; (None, None): none."""
    if not path.exists():
        return None, None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: trusted
    except Exception as e:  # truncated (disk full), zeroed by a crash of the file system, not a torch file
        return None, f"it cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    if not isinstance(state, dict) or not {"identity", "run_id", "history", "wall_s"} <= state.keys():
        return None, "it is not a checkpoint of this version of cheaptrain"
    changed = [IDENTITY_NAMES[k] for k, v in expected.items() if state["identity"].get(k) != v]
    if changed:
        return state, f"it was written with different {' and '.join(changed)}"
    return state, None


def history_csv(history: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(key for row in history for key in row))  # union, in first-seen order
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    return out.getvalue()


class NoTracker:
    """Stands in for RunTracker where MLflow is off: the run trains and writes its outputs, nothing is logged."""

    run_id: str | None = None

    def start(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def note_resume(self, epoch: int, machines: list[dict[str, Any]]) -> None: ...

    def log_epoch(self, row: dict[str, Any]) -> None: ...

    def finish(self, final: dict[str, float], artifacts: list[Path]) -> None: ...

    def fail(self, status: str = "FAILED") -> None: ...

    def abandon(self, run_id: str, reason: str) -> None: ...


class Recorder:
    """After each epoch: the checkpoint first, then the store, which never gets an epoch twice. The checkpoint's bytes
    are taken at the epoch's end; `writer`'s thread puts them on disk while the next epoch trains (written in line, a
    ResNet-18 checkpoint, 90 MB, adds about a fifth to a 1.4 s epoch: benchmarks/checkpoint.py), and the epoch
    reaches the store once they are there."""

    def __init__(
        self,
        cfg: RunConfig,
        ident: dict[str, str],
        tracker: RunTracker | NoTracker,
        owner: bool,
        resume: dict[str, Any] | None,
        logged: int,
        writer: ThreadPoolExecutor,
        lines: bool = False,
    ) -> None:
        self.cfg, self.identity, self.tracker, self.owner, self.writer = cfg, ident, tracker, owner, writer
        self.lines = lines  # a line per epoch on stderr, where no progress bar shows (a log file, a pipe)
        self.path = checkpoint_path(cfg)
        self.started = time.perf_counter()
        self.wall_before = resume["wall_s"] if resume else 0.0  # earlier attempts, up to their last checkpoint
        self.done = len(resume["history"]) if resume else 0  # epochs checkpointed: on disk
        self.machines = machines_of(resume, machine_here(cfg.device))
        self.writing: tuple[Future, int] | None = None  # the checkpoint being written, and its epochs
        # the epochs so far, as the last epoch's end saw them (a resumed run's, until its first epoch here ends)
        self.history: list[dict[str, Any]] = list(resume["history"]) if resume else []
        self.logged = logged  # epochs the store holds
        # the MLflow run the checkpoint names: untracked, the one a tracked attempt began, which a later one continues
        self.run_id = tracker.run_id or (resume and resume["run_id"]) or None

    def wall_s(self) -> float:
        return self.wall_before + time.perf_counter() - self.started

    def checkpoint(self, state: dict[str, Any]) -> bytes:
        meta = {"identity": self.identity, "run_id": self.run_id, "wall_s": self.wall_s(),
                "epochs": self.cfg.recipe.epochs, "machines": self.machines}  # fmt: skip
        return checkpoint_bytes(state | meta)

    def save(self, state: dict[str, Any]) -> None:
        """Write a checkpoint now (before the first epoch: it holds the MLflow run's id)."""
        if self.owner:
            atomic_write(self.path, self.checkpoint(state))

    def epoch_end(self, history: list[dict[str, Any]], state: dict[str, Any]) -> None:
        self.history = history
        if error := self.settle():
            raise error
        if not self.owner:  # another process owns the checkpoint: nothing to wait for
            self.done = history[-1]["epoch"]
        self.log_missing(history)  # up to the last epoch on disk
        if self.owner:
            data = self.checkpoint(state)  # now: the next epoch changes the tensors
            self.writing = (self.writer.submit(atomic_write, self.path, data), history[-1]["epoch"])
        if self.lines:
            print(epoch_line(self.cfg.name, history, self.cfg.recipe.epochs), file=sys.stderr, flush=True)

    def settle(self) -> BaseException | None:
        """Wait for the checkpoint being written: its epochs count as checkpointed once it is on disk. What the write
        raised is returned, not raised, for a caller that is already handling another error."""
        if self.writing is None:
            return None
        (future, epochs), self.writing = self.writing, None
        try:
            future.result()
        except BaseException as error:  # a full disk, or a test's stand-in for a kill
            return error
        self.done = epochs
        return None

    def log_missing(self, history: list[dict[str, Any]]) -> None:
        """Log the checkpointed epochs the store lacks (after a crash between a checkpoint and the store, those
        too)."""
        for row in history:
            if self.logged < row["epoch"] <= self.done:
                self.tracker.log_epoch(row)
                self.logged = row["epoch"]

    def kept(self) -> str:
        if self.done and self.owner:
            return f"the checkpoint of epoch {self.done} is kept in {self.path}"
        return "no checkpoint is kept"

    def discard(self) -> None:
        """A run that failed before its first epoch leaves nothing behind."""
        if self.owner and not self.done:
            remove_checkpoint(self.path)


def epoch_line(name: str, history: list[dict[str, Any]], epochs: int) -> str:
    """What a progress bar shows, as one line: the epoch, its loss, accuracy, seconds and the method's own figures,
    and the time left at the pace of the last 5 epochs but the slowest (a new phase's first epoch compiles)."""
    row = history[-1]
    recent = sorted(r["epoch_train_s"] + r.get("eval_s", 0.0) for r in history[-5:])
    recent = recent[:-1] if len(recent) > 2 else recent
    pace = sum(recent) / len(recent)
    own = f" · {int(row['pruned_samples']):,} pruned" if row.get("pruned_samples") else ""
    own += " · skip epoch" if row.get("phase") else ""
    left = (epochs - row["epoch"]) * pace
    return (
        f"{name}: epoch {row['epoch']}/{epochs} · train loss {row['train_loss']:.4f} · test acc "
        f"{row['test_acc']:.2f}% · {row['epoch_train_s']:.1f} s{own} · about {duration(left)} left"
    )


def duration(seconds: float) -> str:
    """'2 h 05 min', '7 min', '40 s'."""
    minutes = round(seconds / 60)
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def failed_in(tracker: RunTracker | NoTracker) -> str:
    return f"The MLflow run {tracker.run_id} is marked FAILED" if tracker.run_id else "The run is not tracked"


def open_tracker(study: str, track: bool) -> RunTracker | NoTracker:
    """The MLflow run tracker, checked now (before any work), or none when tracking is off."""
    untracked = (
        "this run is not tracked (its outputs and ledger entry are still written; "
        "`python -m cheaptrain.ledger import` logs a ledger entry later)"
    )
    if not track or not mlflow_installed(untracked):
        return NoTracker()
    return RunTracker(study)


def run_info(
    cfg: RunConfig, run_id: str | None, data_digest: str, history: list[dict[str, Any]], machines: list[dict[str, Any]]
) -> dict[str, Any]:
    """run.json: the configuration and everything needed to tell where the results came from. `device`,
    `cpu_capability` and on a GPU `gpu_uuid` are the last attempt's; `machines`, each machine the run trained on from
    which epoch."""
    return {
        "name": cfg.name,
        "config": cfg.to_dict(),
        "mlflow_run_id": run_id or "",
        "code_version": run_code_version(cfg),
        "git_commit": git_commit(),
        "data_digest": data_digest,
        "device": machines[-1]["device"],
        # the vector instructions torch's CPU kernels use: CPUs of one name may differ in them, and round differently
        "cpu_capability": machines[-1]["cpu_capability"],
        **({"gpu_uuid": machines[-1]["gpu_uuid"]} if "gpu_uuid" in machines[-1] else {}),  # GPUs of one name differ too
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "threads": sorted({row.get("threads") for row in history if row.get("threads")}),
        "machines": machines,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_outputs(out: Path, history: list[dict[str, Any]], final: dict[str, float], info: dict[str, Any]) -> None:
    atomic_write(out / "history.csv", history_csv(history))
    atomic_write(out / "run.json", json.dumps(info, indent=2) + "\n")
    atomic_write(out / "metrics.json", json.dumps(final, indent=2) + "\n")


def finish_run(
    cfg: RunConfig,
    tracker: RunTracker | NoTracker,
    recorder: Recorder,
    data_digest: str,
    history: list[dict[str, Any]],
    final: dict[str, float],
) -> Path | None:
    """Write a run's outputs, record them in the ledger in ledger mode record or retrain (returning the entry's
    path), and finish its MLflow run with them."""
    info = run_info(cfg, tracker.run_id, data_digest, history, recorder.machines)
    write_outputs(cfg.out_dir, history, final, info)
    entry = ledger_.record(cfg.out_dir, cfg, tracker.run_id) if cfg.ledger in ("record", "retrain") else None
    tracker.finish(final, [cfg.out_dir / "history.csv", cfg.out_dir / "run.json"])
    return entry


def train_run(cfg: RunConfig, track: bool = True, processes: Processes = ONE) -> dict[str, float]:
    """Train one configuration (resuming from its checkpoint if one exists, reusing its ledger entry if one
    matches); returns its final metrics. Across `processes` (torchrun), the main one tracks, checkpoints and writes;
    the others train their part."""
    if cfg.ledger == "record" and (entry := ledger_.find(cfg, run_code_version(cfg), digest_here(cfg.data_dir))):
        if not processes.main:
            return entry.metrics
        stopped = remove_finished(cfg, len(entry.history))  # between recording its entry and removing its checkpoint
        imported = "the ledger entry is not imported into MLflow (`python -m cheaptrain.ledger import` does it later)"
        tracked = track and mlflow_installed(imported)
        if stopped and tracked:  # killed, it may be RUNNING still; the entry's import is the finished run
            RunTracker.abandon(stopped, "stopped after recording its ledger entry, before its run finished")
        return ledger_.reuse(entry, cfg, tracked)
    tracker = open_tracker(cfg.study, track and processes.main)  # fails here, before any work, if unusable
    start(processes, device_of(processes, resolve_device(cfg.device)))
    ckpt = checkpoint_path(cfg)
    lock = checkpoint_owner(ckpt.with_suffix(".lock")) if processes.main else contextlib.nullcontext(False)
    with lock as owner, ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint") as writer:
        method = create_method(cfg.method, cfg.method_args)
        train_split, test_split = load_split(cfg.data_dir, "train"), load_split(cfg.data_dir, "test")
        ident = identity(cfg)
        resume = broadcast(processes, resume_state(cfg, ckpt, ident, owner, tracker) if processes.main else None)
        try:  # a run whose start or first save fails ends FAILED, not RUNNING (nor FINISHED by MLflow's exit hook)
            logged = tracker.start(cfg.name, cfg.to_dict(), run_tags(cfg.study, cfg.device),
                                   resume and resume["run_id"], dataset=dataset_ref(cfg.data_dir))  # fmt: skip
            bar_shown = sys.stderr.isatty()  # tqdm's own test: it shows its bar only on a terminal
            recorder = Recorder(cfg, ident, tracker, owner, resume, logged, writer,
                                lines=processes.main and not bar_shown)  # fmt: skip
            if resume and processes.main:
                into = f"MLflow run {tracker.run_id}" if tracker.run_id else "not tracked"
                print(f"{cfg.name}: resuming after epoch {recorder.done} ({ckpt}), {into}", file=sys.stderr)
                tracker.note_resume(recorder.done, recorder.machines)
                if recorder.run_id != resume["run_id"]:  # a new MLflow run: a crash before the next epoch continues it
                    recorder.save(resume)
                recorder.log_missing(resume["history"])
            else:  # no epoch yet, but the run id: a crash in epoch 1 continues this MLflow run, not a second one
                recorder.save({"history": []})
        except BaseException:
            tracker.fail("FAILED")
            if owner and not resume:  # nothing to resume: nothing left behind
                remove_checkpoint(ckpt)
            raise
        try:
            torch.set_num_threads(cpu_threads(cfg.threads, processes.local_world))  # after the lock: the others count
            try:
                history = fit(cfg, train_split, test_split, method, resume if recorder.done else None,
                              recorder.epoch_end, processes)  # fmt: skip
            finally:  # the checkpoint being written is on disk before anything reports, reads or removes it
                error = recorder.settle()
            if error:
                raise error
            recorder.log_missing(history)  # the last epoch
            final = final_metrics(history) | method.run_metrics()
            final["wall_time_s"] = recorder.wall_s()  # every attempt up to its last checkpoint, plus this one
            if not processes.main:
                return final
            finish_run(cfg, tracker, recorder, ident["data"], history, final)  # in the try: a failure ends FAILED
        except TrainingDiverged as e:  # deterministic: the same params resume and diverge again, so say what helps
            try:
                recorder.log_missing(recorder.history)  # the store gets what the checkpoint holds
            except BaseException:  # the store failed, or a Ctrl-C: the run ends FAILED, not FINISHED by MLflow's hook
                tracker.fail("FAILED")
                raise
            if not keeps_divergence(cfg, recorder.history):
                tracker.fail("FAILED")
                recorder.discard()  # diverged in its first epoch: nothing to resume
                raise TrainingDiverged(
                    f"{e} {failed_in(tracker)}; {recorder.kept()}. Running again with the "
                    "same params diverges again; changed params start afresh."
                ) from None
            final = final_metrics(recorder.history) | {"diverged_epoch": recorder.history[-1]["epoch"] + 1}
            final["wall_time_s"] = recorder.wall_s()
            if processes.main:
                try:
                    record_divergence(cfg, tracker, recorder, ident["data"], final, str(e))
                except BaseException:
                    tracker.fail("FAILED")
                    raise
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see stages/train.py)
            try:
                recorder.log_missing(recorder.history)
            finally:  # a second Ctrl-C in the log still ends the run KILLED, not FINISHED by MLflow's exit hook
                tracker.fail("KILLED")
            again = "resume" if recorder.done and recorder.owner else "start over"
            if processes.main:
                print(f"{cfg.name}: interrupted; {recorder.kept()}: run again to {again}.", file=sys.stderr)
            recorder.discard()
            raise
        except Exception:  # a run that fails before its first epoch leaves no checkpoint or lock behind
            tracker.fail("FAILED")
            recorder.discard()
            raise
        except BaseException:  # SystemExit, and whatever stands in for a kill: the checkpoint stays, to resume
            tracker.fail("FAILED")
            raise
        if owner:
            remove_checkpoint(ckpt)
    return final


def keeps_divergence(cfg: RunConfig, history: list[dict[str, Any]]) -> bool:
    """Whether a run whose loss diverged is kept as a result: at its paper's setting in ledger mode record or retrain,
    with an epoch before the divergence. Run again on that kind of machine it diverges again: a result of the method,
    which a count of runs that fell must include."""
    subset = ledger_.prepared_subset(cfg)
    return cfg.ledger in ("record", "retrain") and bool(history) and not ledger_.departures(cfg, subset)


def record_divergence(
    cfg: RunConfig,
    tracker: RunTracker | NoTracker,
    recorder: Recorder,
    data_digest: str,
    final: dict[str, float],
    error: str,
) -> None:
    """Write a diverged run's epochs before the divergence as its outputs and ledger entry, `diverged_epoch` in its
    final metrics, and finish its MLflow run with them (FINISHED, as its entry's import would be: the record is whole,
    and `diverged_epoch` says where it stopped). The method's run figures are left out: its state counts the epoch
    that diverged, which the history lacks. Aggregation counts the run as one that ended at chance."""
    path = finish_run(cfg, tracker, recorder, data_digest, recorder.history, final)
    print(
        f"warning: {error} Its {len(recorder.history)} epochs before it are kept as its outputs and ledger entry "
        f"({path}), with diverged_epoch {int(final['diverged_epoch'])}: the report counts it as a run that ended at "
        "chance.",
        file=sys.stderr,
    )


def resume_state(
    cfg: RunConfig, ckpt: Path, ident: dict[str, str], owner: bool, tracker: RunTracker | NoTracker
) -> dict[str, Any] | None:
    """The checkpoint to resume, if this process owns one that fits; a misfit is discarded with a warning."""
    if not owner:
        print(
            f"warning: {cfg.name}: another process is training the same configuration and holds its checkpoint "
            f"{ckpt}; this one trains without checkpoints (it cannot resume if interrupted)",
            file=sys.stderr,
        )
        return None
    resume, problem = read_checkpoint(ckpt, ident)
    if problem:
        print(f"warning: {cfg.name}: discarding the checkpoint {ckpt}: {problem}; starting afresh", file=sys.stderr)
        ckpt.unlink()
        if resume and resume.get("run_id"):
            tracker.abandon(resume["run_id"], f"its checkpoint was discarded: {problem}")
        return None
    return resume
