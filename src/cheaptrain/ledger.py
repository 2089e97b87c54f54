"""The results ledger: runs at a paper's setting, kept in the repository as the pipeline wrote them.

    ledger/<study>/<dataset>-<model>-<method>-s<seed>/   one entry: the run's run.json, metrics.json, history.csv
    ledger/metrics.json                                    every entry's final figures (`dvc metrics show`)

An entry is written by the train stage, never by hand, when params `train.ledger` is `record` (or `retrain`) and the run
is at its paper's setting (200 epochs, the paper's recipe; `papers.paper_setting`): the three output files of the
finished run, copied as they are; of a run whose loss became NaN, its epochs before, `diverged_epoch` in its metrics
(the report counts it as a run that ended at chance). run.json names what was trained (the resolved configuration) and
where and how (training-code version, git commit, prepared data's digest, device, its CPU kernels' vector instructions,
torch version, CPU threads). Training needs neither MLflow nor DVC to write one: on a rented GPU machine with PyTorch
alone, `python stages/train.py ... --no-mlflow` trains and records, and the entry is committed from there.

In `record` mode a run whose entry matches is not trained again: the entry becomes the stage's outputs (and its
MLflow run, imported if the store lacks it). It matches when it trained the same experiment (study, dataset, model,
method, seed, recipe, method and model parameters: RunConfig.experiment()) on the same prepared data (its digest) with
the same training code; where it ran (device, threads, autocast) is recorded, not matched. An entry that does not
match stops the stage with an error naming each difference: retrain it (`train.ledger: retrain`, which replaces the
entry) or remove it. A run on part of the training images (`download.<dataset>.train_size`) is not at its paper's
setting: the ledger neither matches nor records it.
`ignore` neither reads nor writes the ledger (the quick setting).

    python -m cheaptrain.ledger list       # the entries, with seeds, device and final accuracy
    python -m cheaptrain.ledger import     # every entry into the MLflow store (once: importing again adds nothing)
    python -m cheaptrain.ledger index      # rewrite ledger/metrics.json from the entries
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fcntl
import hashlib
import itertools
import json
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cheaptrain import UserError, atomic_write, is_int
from cheaptrain.cli import run_command
from cheaptrain.config import RunConfig, prepared_train_size
from cheaptrain.papers import paper_setting
from cheaptrain.tracking import INTERRUPTS, machines_text, project_root

FILES = ("run.json", "metrics.json", "history.csv")
INDEX = "metrics.json"


def ledger_root() -> Path:
    """ledger/ at the real repository root (DVC's temporary experiment copies record into the workspace too)."""
    return project_root() / "ledger"


@dataclass
class Entry:
    path: Path
    info: dict[str, Any]  # run.json
    metrics: dict[str, float]
    history: list[dict[str, float]]

    @property
    def study(self) -> str:
        return self.info["config"]["study"]

    @property
    def name(self) -> str:
        return self.info["name"]

    @property
    def id(self) -> str:
        """The entry's content hash: an MLflow run imported from it carries it (tag `ledger_entry`)."""
        digest = hashlib.sha256()
        for name in FILES:
            digest.update((self.path / name).read_bytes())
        return digest.hexdigest()[:16]


def read_entry(path: Path) -> Entry:
    """One entry; a UserError names the file and what is wrong with it."""
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise UserError(f"ledger entry {path}: missing {', '.join(missing)}; an entry holds {', '.join(FILES)}")
    try:
        info = json.loads((path / "run.json").read_text())
        metrics = json.loads((path / "metrics.json").read_text())
        with open(path / "history.csv", newline="") as f:
            history = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    except (json.JSONDecodeError, ValueError) as e:
        raise UserError(f"ledger entry {path}: unreadable ({e}); restore it from git") from e
    if not isinstance(info, dict) or "config" not in info or "name" not in info or not history:
        raise UserError(f"ledger entry {path}: run.json lacks its config or name, or history.csv is empty")
    if problems := entry_problems(info, metrics):
        raise UserError(f"ledger entry {path}: {'; '.join(problems)}; restore it from git")
    return Entry(path, info, metrics, history)


def entry_problems(info: dict[str, Any], metrics: Any) -> list[str]:
    """What in an entry's run.json and metrics.json is not of the type the ledger's commands read."""
    problems = [] if isinstance(info["name"], str) else ["run.json name is not a string"]
    config = info["config"]
    if not isinstance(config, dict):
        problems.append("run.json config is not a mapping")
    else:
        problems += [
            f"run.json config lacks {key} or it is not a string"
            for key in ("study", "dataset", "model", "method")
            if not isinstance(config.get(key), str)
        ]
    machines = info.get("machines", [])  # older entries lack it
    if not isinstance(machines, list) or not all(isinstance(m, dict) and is_int(m.get("from_epoch")) for m in machines):
        problems.append("run.json machines is not a list of mappings, each with its from_epoch")
    if not isinstance(metrics, dict):
        return [*problems, "metrics.json is not a mapping"]
    return problems + [
        f"metrics.json {key} is not a number"
        for key, value in metrics.items()
        if isinstance(value, bool) or not isinstance(value, int | float)
    ]


def grid_runs(params: dict[str, Any]) -> Iterator[tuple[str, str, str, str, int]]:
    """(study, dataset, model, method, seed) of every run the DVC grid trains, whose entries the ledger keeps."""
    for study, grid in (params.get("grid") or {}).items():
        yield from (
            (study, *combo)
            for combo in itertools.product(grid["datasets"], grid["models"], grid["methods"], grid["seeds"])
        )


def divergence(metrics: dict[str, Any]) -> str | None:
    """'loss diverged in epoch 6' for a run whose loss became NaN or infinite (`diverged_epoch`), else None."""
    return f"loss diverged in epoch {int(metrics['diverged_epoch'])}" if "diverged_epoch" in metrics else None


def entries(root: Path | None = None) -> list[Entry]:
    """Every entry of the ledger, by study and name; dot-names (a write's staging folder) are not entries."""
    root = root or ledger_root()
    found = sorted(root.glob("*/*/run.json"))
    return [read_entry(p.parent) for p in found if not p.parent.name.startswith(".")]


def entry_path(cfg: RunConfig) -> Path:
    return ledger_root() / cfg.study / cfg.name


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """{'recipe': {'lr': 0.1}} -> {'recipe.lr': 0.1}; lists compare as lists (JSON has no tuples)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= flat(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): list(value) if isinstance(value, tuple | list) else value}


def differences(entry: Entry, cfg: RunConfig, code: str, data: str | None = None) -> list[str]:
    """How the entry differs from the run `cfg` would train now: each setting, the prepared data (`data`, its digest;
    None: not compared), then the training code. Of the recipe's model arguments only the run's own model's count
    (`model_args`): another network's do not change this run."""
    wanted = flat(json.loads(json.dumps(cfg.experiment())))
    kept = flat({k: entry.info["config"].get(k) for k in cfg.experiment()})
    lines = [
        f"{key}: {kept.get(key)!r} in the entry, {wanted.get(key)!r} now"
        for key in sorted(wanted.keys() | kept.keys())
        if kept.get(key) != wanted.get(key) and not key.startswith("recipe.model_args.")
    ]
    if data is not None and entry.info.get("data_digest") != data:
        lines.append(f"prepared data: digest {entry.info.get('data_digest')} in the entry, {data} in {cfg.data_dir}")
    if entry.info.get("code_version") != code:
        lines.append(
            f"training code: version {entry.info.get('code_version')} (commit {entry.info.get('git_commit')}) in the "
            f"entry, {code} now"
        )
    return lines


def departures(cfg: RunConfig, subset: int | None) -> list[str]:
    """How the run `cfg` departs from its paper's setting (papers.paper_setting: 200 epochs, the paper's recipe), on
    `subset` training images (None: every one); [] when it is at that setting."""
    counted, found = paper_setting(cfg.study, cfg.to_dict()["recipe"], cfg.model)
    found = [] if counted else found
    if subset is not None:
        found.append(f"the first {subset} training images (download.{cfg.dataset}.train_size; paper: every one)")
    return found


def prepared_subset(cfg: RunConfig) -> int | None:
    """How many training images are prepared for `cfg` where they are a subset; None for every one, or where nothing
    readable is prepared (loading the data says so)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return prepared_train_size(cfg.data_dir)
    return None


def lookup(cfg: RunConfig, subset: int | None) -> Entry | None:
    """The entry of `cfg` on `subset` training images (None: every one), matching or not; None when it has none or is
    not at its paper's setting (the ledger is not for it)."""
    path = entry_path(cfg)
    if not (path / "run.json").is_file() or departures(cfg, subset):
        return None
    return read_entry(path)


def find(cfg: RunConfig, code: str, data: str | None) -> Entry | None:
    """The matching entry of `cfg` on the data prepared for it (`data`: its digest, None where none is), None when it
    has none (lookup); an entry that does not match stops with an error."""
    entry = lookup(cfg, prepared_subset(cfg))
    if entry is None:
        return None
    if diffs := differences(entry, cfg, code, data):
        path = entry.path
        listed = "\n".join(f"  - {d}" for d in diffs)
        raise UserError(
            f"{cfg.study}/{cfg.name}: its ledger entry {path} was trained differently:\n{listed}\n"
            f"Retrain it and replace the entry (params train.ledger: retrain, e.g. `dvc exp run -S "
            f"train.ledger=retrain`), or remove the entry (`git rm -r {path}`) to train afresh."
        )
    return entry


def record(out_dir: Path, cfg: RunConfig, run_id: str | None) -> Path | None:
    """Copy a finished run's outputs into its ledger entry (replacing one), then rewrite the index. A run that is not
    at its paper's setting (`departures`: the recipe, every training image) is not recorded: None."""
    if found := departures(cfg, prepared_subset(cfg)):
        print(f"{cfg.study}/{cfg.name}: not recorded in the ledger, which keeps runs at a paper's setting only "
              f"({'; '.join(found)})", file=sys.stderr)  # fmt: skip
        return None
    path = entry_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # the umask's permissions, which the entry keeps (mkdtemp's 0700 would hide it from others)
    replaced = path.parent / f".{path.name}.replaced.{uuid.uuid4().hex[:8]}"  # a dot-name: no entry
    try:
        for name in FILES:
            shutil.copy2(out_dir / name, staging / name)
        # a signal between the two renames would leave no entry at all, and one before the index is rewritten an
        # index without the entry (a later run only reuses it, and never rewrites the index)
        with _lock(), INTERRUPTS.held_back():
            if path.exists():
                path.rename(replaced)  # renamed, not removed here: a reader never sees part of an entry
            staging.rename(path)  # whole or absent: never a half-written entry
            write_index()
    except BaseException:  # a full disk or an interrupt leaves no staging folder behind, and the old entry in place
        shutil.rmtree(staging, ignore_errors=True)
        if replaced.exists() and not path.exists():
            replaced.rename(path)
        raise
    finally:  # the entry replaced is gone once the new one is in place, even where the index then fails
        shutil.rmtree(replaced, ignore_errors=True)
    if run_id:
        _tag_run(run_id, read_entry(path).id)
    print(f"{cfg.study}/{cfg.name}: recorded in the ledger, {path} (commit it)", file=sys.stderr)
    return path


def reuse(entry: Entry, cfg: RunConfig, track: bool) -> dict[str, float]:
    """Make a matching entry the run's outputs, without training; its MLflow run is imported if the store lacks it."""
    run_id = import_entry(entry)[0] if track else ""
    info = entry.info | {"mlflow_run_id": run_id or entry.info.get("mlflow_run_id", ""), "ledger_entry": entry.id}
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.json", "history.csv"):  # the stage's outputs: never half-written
        atomic_write(cfg.out_dir / name, (entry.path / name).read_bytes())
    atomic_write(cfg.out_dir / "run.json", json.dumps(info, indent=2) + "\n")
    print(f"{cfg.study}/{cfg.name}: not trained again: its ledger entry {entry.path} matches", file=sys.stderr)
    return entry.metrics


def write_index(root: Path | None = None) -> None:
    """ledger/metrics.json: per study and run, the final figures and where they came from, for `dvc metrics show`."""
    root = root or ledger_root()
    keep = ("final_acc", "best3_acc", "train_time_s", "total_train_flops", "total_trained_samples", "epochs")
    index: dict[str, dict[str, Any]] = {}
    for entry in entries(root):
        figures = {k: entry.metrics[k] for k in keep if k in entry.metrics}
        index.setdefault(entry.study, {})[entry.name] = figures
    atomic_write(root / INDEX, json.dumps(index, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialise ledger writers (runs finishing at once rewrite the index)."""
    ledger_root().mkdir(parents=True, exist_ok=True)
    with open(ledger_root() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# --- MLflow ----------------------------------------------------------------------------------------------------


def _tag_run(run_id: str, entry_id: str) -> None:
    """Mark a live run as the source of an entry, so that importing the entry into the same store adds nothing."""
    from cheaptrain.tracking import store_client

    store_client().set_tag(run_id, "ledger_entry", entry_id)


def import_entry(entry: Entry) -> tuple[str, bool]:
    """The MLflow run of `entry` in the tracking store: (run id, whether it was imported now). A finished run tagged
    with the entry's id (imported before, or the live run that recorded it) is reused, so importing twice adds
    nothing, also from two processes at once (runs that reuse one entry); an import stopped part way is marked FAILED
    and done again."""
    with _lock():  # the store is searched, then written: one importer at a time
        return _import(entry)


def _import(entry: Entry) -> tuple[str, bool]:
    from mlflow.entities import Metric

    from cheaptrain.tracking import DatasetRef, ensure_experiment, flatten, log_dataset, store_client

    experiment_id = ensure_experiment(entry.study)
    client = store_client()
    tagged = client.search_runs([experiment_id], f"tags.ledger_entry = '{entry.id}'")
    for run in tagged:
        if run.info.status == "FINISHED":
            return run.info.run_id, False
    for run in tagged:  # an import stopped part way; a live run that recorded the entry has no imported_from
        if run.info.status == "RUNNING" and "imported_from" in run.data.tags:
            client.set_terminated(run.info.run_id, "FAILED")
    info = entry.info
    tags = {
        "study": entry.study,
        "ledger_entry": entry.id,
        "imported_from": str(entry.path.relative_to(entry.path.parents[2])),
        "git_commit": info.get("git_commit", ""),
        "mlflow.source.git.commit": info.get("git_commit", ""),
        "device": info.get("device", ""),
        "cpu_capability": info.get("cpu_capability", ""),
        "torch_version": info.get("torch_version", ""),
        "trained_mlflow_run_id": info.get("mlflow_run_id", ""),
    }
    if info.get("gpu_uuid"):  # as the live run's tags (machine_here)
        tags["gpu_uuid"] = info["gpu_uuid"]
    if trained_on := machines_text(info.get("machines")):  # resumed on another machine, as the live run's tag says
        tags["machines"] = trained_on
    run = client.create_run(experiment_id, run_name=entry.name, tags=tags)
    run_id = run.info.run_id
    params = [(k, str(v)) for k, v in flatten(info["config"]).items()]
    for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
        client.log_batch(run_id, params=[_param(k, v) for k, v in params[i : i + 100]])
    metrics = [
        Metric(key, float(value), 0, int(row["epoch"]))
        for row in entry.history
        for key, value in row.items()
        if key != "epoch"
    ]
    metrics += [Metric(k, float(v), 0, 0) for k, v in entry.metrics.items() if isinstance(v, int | float)]
    for i in range(0, len(metrics), 1000):  # and at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    config = info["config"]
    source = str(Path(config.get("data_root", "data/prepared")) / config["dataset"])
    log_dataset(client, run_id, DatasetRef(config["dataset"], info.get("data_digest", ""), source))
    for name in ("history.csv", "run.json"):
        client.log_artifact(run_id, str(entry.path / name))
    client.set_terminated(run_id, "FINISHED")
    return run_id, True


def _param(key: str, value: str) -> Any:
    from mlflow.entities import Param as MlflowParam

    return MlflowParam(key, value)


# --- the command -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.ledger", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("list", "import", "index"), help="what to do with the ledger")
    args = parser.parse_args(argv)
    found = entries()
    if args.command == "index":
        with _lock():  # a run that finishes now rewrites it too
            write_index()
        print(f"{ledger_root() / INDEX}: {len(found)} entries")
    elif args.command == "list":
        for entry in found:
            m, i = entry.metrics, entry.info
            where = i.get("device")
            if isinstance(machines := i.get("machines"), list) and len(machines) > 1:  # resumed on another machine
                where = f"{len(machines)} machines, the last {where}"
            stopped = f" ({diverged})" if (diverged := divergence(m)) else ""
            print(f"{entry.study}/{entry.name}: final {m.get('final_acc', float('nan')):.2f}%, best-3 "
                  f"{m.get('best3_acc', float('nan')):.2f}%, {int(m.get('epochs', 0))} epochs{stopped}, {where}, "
                  f"commit {str(i.get('git_commit'))[:10]}")  # fmt: skip
        print(f"{len(found)} entries in {ledger_root()}")
    else:
        imported = [import_entry(entry) for entry in found]
        new = sum(now for _, now in imported)
        print(f"{new} of {len(found)} ledger entries imported into the MLflow store ({len(found) - new} were there)")


if __name__ == "__main__":
    run_command(main)
