"""One run end to end: load the prepared data, start (or resume) its MLflow run, train, write the outputs.

Outputs of run `<study>/<dataset>-<model>-<method>-s<seed>` under `runs/`:
    history.csv   one row per epoch (every per-epoch metric)
    metrics.json  the final metrics (DVC metrics)
    run.json      the resolved configuration, the MLflow run id, the tags

A checkpoint is written atomically after every epoch to `checkpoints/<study>/<name>-<fingerprint>.pt` at the
repository root, outside the outputs (DVC deletes a stage's outputs before running it). Re-running an interrupted
run resumes from it and continues the same MLflow run, which receives each epoch exactly once. The checkpoint is
written before the epoch is logged, so the store is never ahead of it; it is deleted when the run completes.
A checkpoint resumes only the run that wrote it: the file name carries the configuration's fingerprint, and one
written by other training code, from other prepared data or on another kind of device is discarded (with a
warning), as is an unreadable one. Of several processes training the same configuration at once, only the first
uses the checkpoint (a lock file beside it).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import hashlib
import io
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from cheaptrain import atomic_write
from cheaptrain.config import RunConfig
from cheaptrain.methods import create_method
from cheaptrain.prepare import load_split
from cheaptrain.tracking import RunTracker, project_root, run_tags
from cheaptrain.trainer import TrainingDiverged, final_metrics, fit, resolve_device

# The package files that decide a run's results: the train stages' code deps in dvc.yaml (a test keeps them equal).
TRAINING_CODE = (
    "__init__.py",
    "config.py",
    "data.py",
    "methods",
    "models.py",
    "prepare.py",
    "runner.py",
    "tracking.py",
    "trainer.py",
)
IDENTITY_NAMES = {"config": "configuration", "code": "training code", "data": "prepared data", "device": "device"}


def checkpoint_path(cfg: RunConfig) -> Path:
    return project_root() / "checkpoints" / cfg.study / f"{cfg.name}-{cfg.fingerprint()}.pt"


def code_version() -> str:
    """Hash of the training code (TRAINING_CODE), so that a checkpoint never mixes two versions in one run."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for entry in TRAINING_CODE:
        files = sorted((root / entry).rglob("*.py")) if (root / entry).is_dir() else [root / entry]
        for path in files:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def identity(cfg: RunConfig) -> dict[str, str]:
    """What a checkpoint must match to be resumed."""
    manifest = (cfg.data_dir / "manifest.json").read_bytes()  # names the source archive and its checksum
    return {
        "config": cfg.fingerprint(),
        "code": code_version(),
        "data": hashlib.sha256(manifest).hexdigest()[:16],
        "device": resolve_device(cfg.device).type,
    }


@contextlib.contextmanager
def checkpoint_owner(lock_path: Path) -> Iterator[bool]:
    """Whether this process owns the checkpoint of its configuration. Of several processes that train the same
    configuration at once (queued DVC experiments that share a run, say) the first does; the others train without
    one, rather than resume or overwrite each other's state."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by the kernel when the process dies
        except BlockingIOError:
            yield False
            return
        yield True


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(path, buffer.getvalue())


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


def train_run(cfg: RunConfig) -> dict[str, float]:
    """Train one configuration (resuming from its checkpoint if one exists); returns its final metrics."""
    started = time.perf_counter()
    tracker = RunTracker(cfg.study)  # fails here, before any work, if the store is unusable
    method = create_method(cfg.method, cfg.method_args)
    train_split, test_split = load_split(cfg.data_dir, "train"), load_split(cfg.data_dir, "test")
    ckpt, ident = checkpoint_path(cfg), identity(cfg)
    with checkpoint_owner(ckpt.with_suffix(".lock")) as owner:
        resume, problem = read_checkpoint(ckpt, ident) if owner else (None, None)
        if not owner:
            print(
                f"warning: {cfg.name}: another process is training the same configuration and holds its checkpoint "
                f"{ckpt}; this one trains without checkpoints (it cannot resume if interrupted)",
                file=sys.stderr,
            )
        if problem:
            print(f"warning: {cfg.name}: discarding the checkpoint {ckpt}: {problem}; starting afresh", file=sys.stderr)
            ckpt.unlink()
            if resume:
                tracker.abandon(resume["run_id"], f"its checkpoint was discarded: {problem}")
            resume = None
        elapsed_before = resume["wall_s"] if resume else 0.0
        logged = tracker.start(cfg.name, cfg.to_dict(), run_tags(cfg.study, cfg.device), resume and resume["run_id"])
        done = len(resume["history"]) if resume else 0
        if resume:
            print(f"{cfg.name}: resuming after epoch {done} ({ckpt}), MLflow run {tracker.run_id}", file=sys.stderr)
            tracker.note_resume(done)
            for row in resume["history"]:  # epochs checkpointed but not yet in the store (a crash between the two)
                if row["epoch"] > logged:
                    tracker.log_epoch(row)
        elif owner:  # no epoch yet, but the run id: a crash in epoch 1 continues this MLflow run, not a second one
            save_checkpoint(ckpt, {"identity": ident, "run_id": tracker.run_id, "wall_s": 0.0, "history": []})

        def on_epoch_end(history: list[dict[str, Any]], state: dict[str, Any]) -> None:
            nonlocal done
            wall_s = elapsed_before + time.perf_counter() - started
            if owner:
                save_checkpoint(ckpt, state | {"identity": ident, "run_id": tracker.run_id, "wall_s": wall_s})
            done = history[-1]["epoch"]
            if done > logged:  # the store follows the checkpoint, and never gets an epoch twice
                tracker.log_epoch(history[-1])

        def kept() -> str:
            return f"the checkpoint of epoch {done} is kept in {ckpt}" if done and owner else "no checkpoint is kept"

        try:
            history = fit(cfg, train_split, test_split, method, resume if done else None, on_epoch_end)
        except TrainingDiverged as e:  # deterministic: the same params resume and diverge again, so say what helps
            tracker.fail("FAILED")
            raise TrainingDiverged(
                f"{e} The MLflow run {tracker.run_id} is marked FAILED; {kept()}. Running again with the same params "
                "diverges again; changed params start afresh."
            ) from None
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see stages/train.py)
            tracker.fail("KILLED")
            again = "resume" if done and owner else "start over"
            print(f"{cfg.name}: interrupted; {kept()}: run again to {again}.", file=sys.stderr)
            raise
        except BaseException:
            tracker.fail("FAILED")
            raise

        # wall_time_s: the time of every attempt up to its last checkpoint, plus this one
        final = final_metrics(history) | method.run_metrics()
        final["wall_time_s"] = elapsed_before + time.perf_counter() - started
        out = cfg.out_dir
        atomic_write(out / "history.csv", history_csv(history))
        atomic_write(
            out / "run.json",
            json.dumps({"name": cfg.name, "config": cfg.to_dict(), "mlflow_run_id": tracker.run_id}, indent=2) + "\n",
        )
        atomic_write(out / "metrics.json", json.dumps(final, indent=2) + "\n")
        tracker.finish(final, [out / "history.csv", out / "run.json"])
        if owner:
            ckpt.unlink(missing_ok=True)
            ckpt.with_suffix(".lock").unlink(missing_ok=True)
    return final
