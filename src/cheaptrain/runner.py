"""One run end to end: load the prepared data, start (or resume) its MLflow run, train, write the outputs.

Outputs of run `<study>/<dataset>-<model>-<method>-s<seed>` under `runs/`:
    history.csv   one row per epoch (every per-epoch metric)
    metrics.json  the final metrics (DVC metrics)
    run.json      the resolved configuration, the MLflow run id, the tags

A checkpoint is written atomically after every epoch to `checkpoints/<study>/<name>-<fingerprint>.pt` at the
repository root; re-running an interrupted run resumes from it and continues the same MLflow run. It is deleted
when the run completes. The fingerprint covers the whole configuration, so changed params never resume old state.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cheaptrain.config import RunConfig
from cheaptrain.methods import create_method
from cheaptrain.prepare import load_split
from cheaptrain.tracking import RunTracker, project_root, run_tags
from cheaptrain.trainer import final_metrics, fit


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write via a temporary file and a rename: readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def checkpoint_path(cfg: RunConfig) -> Path:
    return project_root() / "checkpoints" / cfg.study / f"{cfg.name}-{cfg.fingerprint()}.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write(path, buffer.getvalue())


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


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
    ckpt = checkpoint_path(cfg)
    resume = load_checkpoint(ckpt)
    elapsed_before = resume["wall_s"] if resume else 0.0
    logged = tracker.start(cfg.name, cfg.to_dict(), run_tags(cfg.study, cfg.device), resume and resume["run_id"])
    if resume:  # epochs checkpointed but not yet in the store (a crash between the two writes)
        for row in resume["history"]:
            if row["epoch"] > logged:
                tracker.log_epoch(row)

    def on_epoch_end(history: list[dict[str, Any]], state: dict[str, Any]) -> None:
        wall_s = elapsed_before + time.perf_counter() - started
        save_checkpoint(ckpt, state | {"run_id": tracker.run_id, "wall_s": wall_s})  # first: the store follows
        tracker.log_epoch(history[-1])

    try:
        history = fit(cfg, train_split, test_split, method, resume, on_epoch_end)
    except KeyboardInterrupt:
        tracker.fail("KILLED")
        raise
    except BaseException:
        tracker.fail("FAILED")
        raise

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
    ckpt.unlink(missing_ok=True)
    return final
