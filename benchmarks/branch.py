"""Analysis: branch a ledger run at an epoch, to ask what a method's hooks did to the epochs that came next.

    python benchmarks/branch.py ledger/dfp/cifar10-alexnet-infobatch_r24-s2 --after 27 --epochs 2 --draws 3

Replays the entry's first AFTER epochs on this CPU (`cheaptrain.replay`: with the entry's code, thread count and kind
of CPU it is its recorded state, digit for digit), keeps that state, and from it trains the next EPOCHS epochs once
per arm and draw, everything else as the entry trained:

- `as-trained`: the method as it was;
- `unweighted`: the method's choice of samples, every sample's loss weighing 1 (its `loss_weights` hook off: what
  InfoBatch upweights weighs like any other);
- `method-off`: every sample, unweighted (`on_epoch_start` and `loss_weights` off; the method still sees the losses
  and accuracies): a baseline's epochs from the method's state.

Draw 0 keeps the recorded generators, so `as-trained` at draw 0 must reproduce the entry's epochs, and the script
checks it does: the branch starts from the recorded state and changes nothing else. Draws 1 to DRAWS-1 reseed the
data order and augmentation and the method's own draws (its `generator`, where it has one), to show whether an
arm's outcome is the state's or one draw's. A branch falls when its test accuracy drops to chance (at most
`aggregate.CHANCE_MARGIN` points above 100 / classes, the report's line) or its training loss stops being finite.
Per arm: how many draws fell, and per branch each epoch's training loss and test accuracy. Each branch costs EPOCHS
of the run's epochs (AlexNet: about 45 s each on one thread of this CPU); nothing is written. It exits with status 1
when the replay or draw 0 as-trained does not reproduce the entry, whose record then is not the state branched from.
The arms act on the hooks of methods that choose samples or weigh losses (DFP, random pruning, InfoBatch); `method-off`
is refused for WUS, whose `on_epoch_start` sets which parameters train.
"""

import argparse
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tqdm import tqdm

from cheaptrain import UserError, positive_int
from cheaptrain.aggregate import chance_line
from cheaptrain.cli import run_command
from cheaptrain.ledger import Entry, read_entry
from cheaptrain.replay import checked, first_difference, torch_threads, training
from cheaptrain.trainer import Training, TrainingDiverged, checkpoint_state, restore, run_epoch

# per arm, the method's hooks it turns off and what they return instead
ARMS: dict[str, dict[str, Callable[..., Any]]] = {
    "as-trained": {},
    "unweighted": {"loss_weights": lambda indices: None},
    "method-off": {"loss_weights": lambda indices: None, "on_epoch_start": lambda epoch, lr: None},
}


def reseed(t: Training, draw: int) -> None:
    """Other draws than the recorded ones: the data order and augmentation, and the method's own (its generator)."""
    for generator in (t.generator, getattr(t.method, "generator", None)):
        if generator is not None:
            generator.manual_seed(1_000_033 * draw + t.cfg.seed)


def branch(t: Training, state: dict[str, Any], arm: str, draw: int, epochs: range) -> list[dict[str, Any]]:
    """Train `epochs` from `state` under `arm` and `draw`: their history rows; a row with an infinite loss and no
    accuracy ends a branch whose loss stopped being finite."""
    restore(t, copy.deepcopy(state))  # a restored optimizer may share the state's tensors and change them in place
    if draw:
        reseed(t, draw)
    for hook, replacement in ARMS[arm].items():
        setattr(t.method, hook, replacement)
    rows = []
    try:
        for epoch in epochs:
            rows.append(run_epoch(t, epoch))
    except TrainingDiverged:
        rows.append({"epoch": epoch, "train_loss": float("inf"), "test_acc": None})
    finally:
        for hook in ARMS[arm]:
            delattr(t.method, hook)  # the class's hook again
    return rows


def fell_in(rows: list[dict[str, Any]], line: float) -> int | None:
    """The first epoch whose test accuracy is at chance (at most `line`) or whose loss stopped being finite."""
    return next((int(r["epoch"]) for r in rows if r["test_acc"] is None or r["test_acc"] <= line), None)


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    accuracy = "—" if row["test_acc"] is None else f"{row['test_acc']:.2f}"
    return f"{row['train_loss']:.4g} / {accuracy}"


@dataclass
class Branched:
    """What branching an entry found: per (arm, draw) the epochs' rows, and whether the replay to the branch and draw
    0 as-trained reproduced the entry (None: identical; else the first difference, in words)."""

    entry: Entry
    after: int
    epochs: range
    draws: int
    threads: int
    caveats: list[str]
    chance: float
    replayed: str | None
    rows: dict[tuple[str, int], list[dict[str, Any]]]

    def as_trained_again(self) -> str | None:
        """Where draw 0 as-trained first differs from the entry; None where identical or not branched."""
        if ("as-trained", 0) not in self.rows:
            return None
        recorded = self.entry.history[self.epochs.start - 1 : self.epochs.stop - 1]
        return first_difference(recorded, self.rows["as-trained", 0])


def branch_entry(entry: Entry, after: int, epochs: int, draws: int, arms: list[str]) -> Branched:
    """Replay `entry` through epoch `after`, then train `epochs` epochs from there per arm (in the order given) and
    draw."""
    if after + epochs > len(entry.history):
        raise UserError(f"{entry.path}: it records {len(entry.history)} epochs; branching after {after} for {epochs} "
                        f"needs {after + epochs}, so that draw 0 as-trained can be checked against it")  # fmt: skip
    if "method-off" in arms and "phase" in entry.history[0]:
        raise UserError(
            f"{entry.path}: its method freezes parameters by phase (WUS), which its on_epoch_start sets; method-off "
            "would train with whatever the last branch left frozen: leave that arm out"
        )
    cfg, _, data_dir, caveats = checked(entry, after + epochs)
    span = range(after + 1, after + epochs + 1)
    with torch_threads(int(cfg.threads)):
        t = training(cfg, data_dir)
        replaying = tqdm(range(1, after + 1), desc="replaying", unit="epoch", disable=False)  # in logs too: slow
        history = [run_epoch(t, epoch) for epoch in replaying]
        state = copy.deepcopy(checkpoint_state(t, history))  # the live tensors change as the branches train
        chosen = [(arm, draw) for arm in arms for draw in range(draws)]
        rows = {
            key: branch(t, state, *key, span) for key in tqdm(chosen, desc="branches", unit="branch", disable=False)
        }
    replayed = first_difference(entry.history[:after], history)
    return Branched(entry, after, span, draws, int(cfg.threads), caveats, chance_line(cfg.dataset), replayed, rows)


def report(b: Branched) -> list[str]:
    """The header saying what was measured, a row per branch under the entry's own, the falls per arm."""
    first, last = b.epochs.start, b.epochs.stop - 1
    replayed = "identical to the entry" if b.replayed is None else f"DIFFERS: {b.replayed}"
    lines = [
        f"{b.entry.study}/{b.entry.name}, branched after epoch {b.after}: epochs {first}-{last}, {b.draws} draw(s) per "
        f"arm, on {b.threads} CPU thread(s); the replay to the branch: {replayed}"
        + "".join(f"; {c}" for c in b.caveats),
        f"each epoch: training loss / test accuracy %; fell: at chance (test accuracy <= {b.chance:g}%) or a loss "
        "that stopped being finite",
        f"{'arm':<11} {'draw':>4}  " + "".join(f"{f'epoch {e}':<22}" for e in b.epochs) + "fell",
        f"{'(entry)':<11} {'':>4}  " + "".join(f"{cell(b.entry.history[e - 1]):<22}" for e in b.epochs),
    ]
    falls: dict[str, int] = {}
    for (arm, draw), rows in b.rows.items():
        by_epoch = {int(r["epoch"]): r for r in rows}
        fell = fell_in(rows, b.chance)
        falls[arm] = falls.get(arm, 0) + (fell is not None)
        lines.append(f"{arm:<11} {draw:>4}  " + "".join(f"{cell(by_epoch.get(e)):<22}" for e in b.epochs)
                     + ("no" if fell is None else f"in epoch {fell}"))  # fmt: skip
    lines.append("fell: " + "; ".join(f"{arm}: {n} of {b.draws}" for arm, n in falls.items()))
    if ("as-trained", 0) in b.rows:
        again = b.as_trained_again()
        lines.append(f"as-trained, draw 0 against the entry: {'identical' if again is None else 'DIFFERS: ' + again}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entry", type=Path, help="a ledger entry's folder, e.g. ledger/dfp/cifar10-lenet-dfp-s0")
    parser.add_argument("--after", type=positive_int, required=True, help="the epoch to branch after")
    parser.add_argument("--epochs", type=positive_int, default=2, help="epochs to train per branch (default 2)")
    parser.add_argument(
        "--draws", type=positive_int, default=3, help="draws per arm, the recorded one first (default 3)"
    )
    parser.add_argument(
        "--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="in this order (default: all)"
    )
    args = parser.parse_args(argv)
    arms = list(dict.fromkeys(args.arms))  # each once, in the order given
    branched = branch_entry(read_entry(args.entry), args.after, args.epochs, args.draws, arms)
    print("\n".join(report(branched)))
    if branched.replayed is not None or branched.as_trained_again() is not None:
        sys.exit(1)


if __name__ == "__main__":
    run_command(main)
