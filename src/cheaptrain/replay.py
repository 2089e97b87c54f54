"""Replay a ledger entry's first epochs with this checkout's training code and compare them with the recorded ones.

The ledger keeps entries trained by earlier versions of the training code (run.json: `code_version`, `git_commit`),
and the report counts them beside newer ones. The version changes with any edit of a file the training imports, so
it cannot say whether an edit changed results; a replay can. On a CPU with the entry's thread count, training is
deterministic: code that trains the same reproduces the recorded epochs digit for digit (history.csv writes floats
exactly). Every column but the times and the thread count (the machine's) is compared: losses, accuracies,
learning rate, samples, FLOPs, and a method's own counts and phases. By default the replay runs through the second
epoch in which the method acted (DFP pruned, WUS skipped), so that its choices are compared too; a change that acts
only later needs `--epochs`.
Nothing is written: no checkpoint, no ledger entry, no MLflow run.

    python -m cheaptrain.replay ledger/wus/cifar10-lenet-wus-s0 --epochs 3
    python -m cheaptrain.replay --stale     # every entry trained by another code version than this checkout's

It exits with status 1 when an epoch differs. The replay trains on the CPU: an entry trained on a GPU cannot be
replayed (`--stale` lists it as not replayable here, named it is an error). A replay needs the entry's prepared data
(`data/prepared/<dataset>`, the same digest) and, to be exact, its kind of CPU, thread count and torch version (another
CPU may take other vector code paths, which round differently from the first epoch on; two CPUs of one name may too,
so run.json records the vector instructions torch's kernels used, `cpu_capability`): on another it says so and still
compares.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from cheaptrain import UserError
from cheaptrain.cli import run_command
from cheaptrain.config import Recipe, RunConfig
from cheaptrain.data import load_split, prepared_digest
from cheaptrain.ledger import Entry, entries, read_entry
from cheaptrain.methods import METHODS, create_method, implementation
from cheaptrain.runner import run_code_version
from cheaptrain.tracking import device_name, project_root
from cheaptrain.trainer import Training, prepare, run_epoch

ACTS = ("pruned_samples", "phase")  # a method acted in an epoch where one is above 0: DFP pruned, WUS skipped
ARCHIVES = {"cifar10": "../shared/datasets/cifar10-jpg.tar.gz"}  # the JPEG archive the ledger's entries trained on


def timing(column: str) -> bool:
    """Seconds (`*_s`) and threads: the machine's, not the run's."""
    return column.endswith("_s") or column == "threads"


def default_epochs(history: list[dict[str, float]]) -> int:
    """Through the second epoch in which the method acted (at least 2): its choices are replayed too."""
    acting = [int(row["epoch"]) for row in history if any(row.get(c, 0) > 0 for c in ACTS)]
    return max([2, *acting[:2]])


@dataclass
class Replay:
    """What replaying an entry found: `difference` is None when every compared value matched."""

    entry: Entry
    epochs: int
    code_now: str
    caveats: list[str]
    difference: str | None

    def line(self) -> str:
        recorded = self.entry.info.get("code_version")
        code = "same code version" if recorded == self.code_now else f"code {recorded} -> {self.code_now}"
        verdict = "identical" if self.difference is None else f"DIFFERS: {self.difference}"
        caveats = "".join(f"; {c}" for c in self.caveats)
        return f"{self.entry.study}/{self.entry.name} ({code}), epochs 1-{self.epochs}: {verdict}{caveats}"


def entry_config(entry: Entry) -> RunConfig:
    """The entry's resolved configuration, to train on this machine's CPU without checkpoints or a ledger."""
    config, recipe = dict(entry.info["config"]), dict(entry.info["config"]["recipe"])
    unknown = sorted(config.keys() - {f.name for f in fields(RunConfig)})
    unknown += sorted(f"recipe.{k}" for k in recipe.keys() - {f.name for f in fields(Recipe)})
    if unknown:
        raise UserError(f"{entry.path}: run.json has settings this code does not know: {', '.join(unknown)}")
    del config["recipe"]
    recipe["milestones"] = tuple(recipe.get("milestones", ()))
    threads = entry.info.get("threads") or [1]
    config |= {"device": "cpu", "threads": threads[0], "ledger": "ignore", "processes": 1}
    return RunConfig(recipe=Recipe(**recipe), **config)


def code_now(entry: Entry, cfg: RunConfig) -> str:
    """This checkout's code version of the entry's method; a UserError names a method this checkout lacks."""
    if (method := implementation(cfg.method, cfg.method_args)) not in METHODS:
        raise UserError(f"{entry.path}: method {method!r} is unknown to this checkout (it has {', '.join(METHODS)})")
    return run_code_version(cfg)


def gpu_device(entry: Entry) -> str | None:
    """The GPU the entry trained on; None for a CPU."""
    device = str(entry.info.get("device", "cpu"))
    return None if device.startswith("cpu") else device


def prepare_command(dataset: str) -> str:
    """The command that prepares `dataset` as the ledger's entries were trained on it."""
    source = f"{dataset.upper()}_SOURCE={ARCHIVES[dataset]} " if dataset in ARCHIVES else ""
    return f"`{source}python stages/download.py --dataset {dataset} --no-mlflow`"


def first_difference(recorded: list[dict[str, float]], replayed: list[dict[str, Any]]) -> str | None:
    """The first epoch and column where the replayed history differs from the recorded one, in words."""
    for old, new in zip(recorded, replayed, strict=False):
        for column in [*old, *(c for c in new if c not in old)]:  # the entry's order: the first is reported
            if timing(column):
                continue
            if column not in old or column not in new:
                return (
                    f"epoch {int(old['epoch'])}: column {column} only in the {'replay' if column in new else 'entry'}"
                )
            if float(new[column]) != old[column]:
                return f"epoch {int(old['epoch'])}, {column}: recorded {old[column]!r}, now {float(new[column])!r}"
    return None


def checked(entry: Entry, epochs: int) -> tuple[RunConfig, str, Path, list[str]]:
    """What replaying the entry's first `epochs` epochs here needs: its configuration, this checkout's code version
    of it and the prepared data, with the caveats of this machine; a UserError where it cannot be replayed."""
    cfg = entry_config(entry)
    code = code_now(entry, cfg)
    if gpu := gpu_device(entry):
        raise UserError(f"{entry.path}: trained on {gpu}; the replay trains on the CPU only, which cannot reproduce it")
    data_dir, command = project_root() / cfg.data_dir, prepare_command(cfg.dataset)
    if not (data_dir / "manifest.json").is_file():
        raise UserError(f"{entry.path}: no prepared {cfg.dataset} in {data_dir}: run {command} first")
    try:
        digest = prepared_digest(data_dir)
    except OSError as e:
        raise UserError(f"{entry.path}: {data_dir} is incomplete ({e.strerror}: {e.filename}): run {command}") from e
    if digest != entry.info.get("data_digest"):
        raise UserError(
            f"{entry.path}: trained on prepared data {entry.info.get('data_digest')}, {data_dir} holds {digest}: "
            f"run {command} for the data the ledger's entries trained on"
        )
    caveats = []
    first = (entry.info.get("machines") or [entry.info])[0]  # where the epochs replayed trained
    recorded, here = str(first.get("device", "cpu")), device_name("cpu")
    if recorded.rsplit(" x", 1)[0] != here.rsplit(" x", 1)[0]:  # the model, not the core count
        caveats.append(f"recorded on {recorded}, replayed on {here}: another kind of CPU may round differently")
    elif (isa := first.get("cpu_capability")) != (isa_here := torch.backends.cpu.get_cpu_capability()):
        caveats.append(
            f"recorded with {isa} kernels, replayed with {isa_here}: they may round differently"
            if isa
            else f"the entry does not say which vector instructions its kernels used (here {isa_here}): a CPU of "
            "the same name with others may round differently"
        )
    if len(threads := entry.info.get("threads") or []) > 1:
        caveats.append(f"recorded on {threads} threads, replayed on {threads[0]}")
    if (version := entry.info.get("torch_version")) != torch.__version__:
        caveats.append(f"recorded with torch {version}, replayed with {torch.__version__}: it may compute differently")
    for machine in (entry.info.get("machines") or [])[1:]:  # resumed on another machine, within the epochs replayed
        if machine.get("from_epoch", epochs + 1) <= epochs:
            caveats.append(f"epochs from {machine['from_epoch']} trained on {machine.get('device')} with "
                           f"{machine.get('cpu_capability')} kernels: they may round differently")  # fmt: skip
    return cfg, code, data_dir, caveats


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Train on `count` CPU threads, as the entry did; the process's count is set back after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def training(cfg: RunConfig, data_dir: Path) -> Training:
    """The entry's run set up as its first epoch found it: seeded, its method fresh, nothing trained."""
    method = create_method(cfg.method, cfg.method_args)
    return prepare(cfg, load_split(data_dir, "train"), load_split(data_dir, "test"), method)


def replay(entry: Entry, epochs: int | None = None) -> Replay:
    """Train the entry's first `epochs` epochs (default_epochs) with this checkout's code and compare them with its
    history."""
    epochs = min(epochs or default_epochs(entry.history), len(entry.history))
    cfg, code, data_dir, caveats = checked(entry, epochs)
    with torch_threads(int(cfg.threads)):
        t = training(cfg, data_dir)
        history = [run_epoch(t, epoch) for epoch in range(1, epochs + 1)]
    difference = first_difference(entry.history[:epochs], history)
    return Replay(entry, epochs, code, caveats, difference)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("entries", nargs="*", type=Path, help="ledger entry folders, e.g. ledger/dfp/cifar10-...-s0")
    parser.add_argument("--stale", action="store_true", help="every entry trained by another code version")
    parser.add_argument("--epochs", type=int, help="how many of the first epochs to replay (default: through the "
                        "second epoch in which the method acted, at least 2)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs must be at least 1")
    if bool(args.entries) == args.stale:
        parser.error("name entry folders or pass --stale, not both, not neither")
    chosen = [read_entry(path) for path in args.entries]
    if args.stale:
        chosen = [e for e in entries() if e.info.get("code_version") != code_now(e, entry_config(e))]
        print(f"{len(chosen)} entries trained by another code version than this checkout's", file=sys.stderr)
        for entry in [e for e in chosen if gpu_device(e)]:
            print(f"{entry.study}/{entry.name}: not replayable here, trained on {gpu_device(entry)} (the replay "
                  "trains on the CPU)")  # fmt: skip
        chosen = [e for e in chosen if not gpu_device(e)]
    results = []
    for entry in tqdm(chosen, desc="replaying", unit="entry", disable=None if len(chosen) > 1 else True):
        results.append(replay(entry, args.epochs))
        tqdm.write(results[-1].line())
    differ = [r for r in results if r.difference is not None]
    print(f"{len(results) - len(differ)} of {len(results)} entries replayed identically with this checkout's code")
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    run_command(main)
