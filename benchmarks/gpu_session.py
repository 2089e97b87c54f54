"""GPU session: a short lease of a GPU machine used in one command that ends before its time limit (docs/gpu.md). It
picks the fastest setting, trains into the ledger the runs that can end before its deadline, and packs their entries.
Needs what gpu_check needs (PyTorch, numpy, PyYAML, tqdm); no MLflow, no DVC. Run it from the repository root:

    python3 benchmarks/gpu_session.py OUT [--minutes 9] [--runs STUDY:MODEL:METHOD[:SEED] ...] [--parallel 2]
                                          [--setting race|eager|graphs|graphs-fused] [--params params.yaml]
                                          [--cifar10 carry/cifar10-jpg.tar.gz] [--collect]
                                          [--return-after MINUTES [--workdir /tmp/gpu-session]]

A lent machine keeps nothing once it goes back, and one command ends within 10 minutes: a run that has not ended by
then is lost (its checkpoint is far too large to bring back). So, within --minutes of the command's start:
1. data: CIFAR-10 prepared from --cifar10 unless data/prepared/cifar10 holds it;
2. race: the first pending run's model, its training images/s in each candidate setting (eager; CUDA graphs; CUDA
   graphs with fused SGD and cudnn.benchmark; each in the device's default autocast, bf16 on CUDA), as gpu_check
   measures it (steady state after an untimed first epoch, which compiles and records the graphs). The fastest trains
   every run of the session; another model is measured in it when a run of that model is next, nothing trains, and
   a run of it would end in time at 1.5x the fastest rate measured yet. Each measurement is a row of race.csv.
   `--setting NAME` skips the race and measures that setting alone: the runs of a study that earlier leases trained
   keep their setting, so that their times compare;
3. train: the pending runs (those without a ledger entry; with `--retrain-stale` also those whose entry other training
   code or settings trained on this kind of device, each replacing its entry; a method's run whose baseline entry
   trained on a device of another name is left for that device, but for --any-device) in order, at most --parallel at
   once. A run starts only if it ends before the deadline, estimated at its model's rate for the samples its epochs
   train (every sample, or the share its method's entries in the ledger trained: DFP's schedule leaves the same 12.75%
   out on every network), plus what a run spends outside its epochs (START_S, FIRST_EPOCH), or for a run alone from
   its model's baseline entry if one trained here in this setting and took less (KNOWN_MARGIN), and if every run
   training now still does (at its own pace, once it has one). Runs at once count as sharing one device, each at its
   rate / the number of runs: on an H100 two ResNet-18 runs at once took 2.7 s an epoch each, one alone 1.4 s. When a
   run's pace needs over 1.25x the time left, the newest run is stopped, so that the device serves the older ones (a
   run alone goes on);
4. pack, into OUT: ledger.tar.gz (the entries of the runs that ended: `tar xzf` it in the repository, then commit
   the entries), logs.tar.gz (each run's log), race.csv, session.txt (everything printed).
Runs still training at the deadline go on, detached, as long as the machine stays: `--collect` waits for them (up to
--minutes), packing again as each one ends. Each run is `stages/train.py ... --no-mlflow -S train.compile=...`: the
setting is recorded in its entry. On a CPU (`--device cpu`, eager only, `--quick` sizes) the script checks itself.

A lease longer than one command (15 minutes against 10): `--return-after M` runs the session, to its --minutes, in a
process of its own, in a copy of the checkout under --workdir (outside it: the next command's fresh copy of the
working tree cannot touch a run's files while it trains), and returns after M minutes with what it has packed so far;
`--collect` in the next command waits for the session and its runs, then packs everything.
"""

# ruff: noqa: E402 (the clock first: importing torch takes seconds on a cold machine, and counts against the command)
import time

STARTED = time.monotonic()

import argparse
import contextlib
import csv
import gc
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check, beside this file
from gpu_check import (
    FULL,
    QUICK,
    REPO,
    Rate,
    Sizes,
    Variant,
    checked_device,
    device_name,
    runs_config,
    skipped,
    steady_rate,
)

from cheaptrain import UserError, atomic_write
from cheaptrain.config import RunConfig, load_params, prepared_train_size, resolve_run, train_size, validate_grid
from cheaptrain.ledger import differences, read_entry
from cheaptrain.papers import paper_setting
from cheaptrain.runner import run_code_version
from cheaptrain.tracking import device_name as tracked_device

# The WUS runs in the GPU issue's order, then the DFP paper's other networks, each a baseline and a dfp run (one claim
# pair), the fastest on an H100 first, so that a lease's last minutes still fit a run: in `graphs-fused` WRN-10 46,354
# images/s, VGG-13 40,357, VGG-16 34,948, VGG-19 28,044, ResNet-34 24,557, ResNet-50 15,303 (h100-2026-11-27), WRN-16
# 29,362 (h100-2026-11-27c); WRN-22, not measured, the most training FLOPs an image (14.7 G). Runs in the ledger,
# AlexNet's from a CPU among them, are skipped
WUS_MODELS = ("resnet18", "vgg11", "alexnet", "vgg16")
DFP_MODELS = ("resnet18", "wrn10", "vgg13", "vgg16", "wrn16", "vgg19", "resnet34", "resnet50", "wrn22")
DEFAULT_RUNS = [f"wus:{model}:{method}" for model in WUS_MODELS for method in ("baseline", "wus", "wus_lr")] + [
    f"dfp:{model}:{method}" for model in DFP_MODELS for method in ("baseline", "dfp")
]
CANDIDATES = {  # --setting's names
    "eager": Variant("eager", compile=False),
    "graphs": Variant("CUDA graphs", compile="reduce-overhead"),
    "graphs-fused": Variant("graphs, fused, benchmark", "reduce-overhead", cudnn_benchmark=True, fused_sgd=True),
}
EVALUATION = 1.1  # an epoch's evaluation (the test split, forward only) on top of its training
# A run's time outside its epochs' training and evaluation: the process start, the data onto the device, a checkpoint
# after every epoch, written while the next epoch trains (wall_time_s - train_time_s - eval_time_s of the two H100
# runs that wrote them so, the WUS and WUS+LR ResNet-18 entries: 29.6 and 29.9 s; 54-56 s written in line).
START_S = 35
# A run's first epoch against the race's first epoch of the same graphs, on an H100: beside a second run compiling,
# 40.9 against 21.5 s; alone, the inductor cache warm from the race, 10.4-12.4 against 18.1-27.1 s (0.44-0.69, the
# VGG-11 and VGG-16 entries' history.csv against their leases' race.csv)
FIRST_EPOCH = {"alone": 1.0, "at once": 2.0}
# A run alone whose model's baseline is in the ledger, trained here before (this recipe, a device of this name, this
# setting), is estimated from that entry's wall time: two leases' H100s raced VGG-16 at 36,756 and 33,372 images/s, yet
# its baseline and WUS runs took 1.42 and 1.43 s a full epoch, and the race's estimate was 402 s for a WUS run of 290.
# The margin covers a slower machine; the start, what the process does before its wall clock starts (imports, the
# device, the data loaded) and the session's poll.
KNOWN_MARGIN = 1.05
KNOWN_START_S = 20  # VGG-16's WUS run, h100-2026-11-27c: at most 310 s from its start to its end seen, 290 of wall time
# run.json's settings that change a run's time on one device
KNOWN_KEYS = ("dataset", "recipe", "model_args", "amp", "channels_last", "compile", "cudnn_benchmark", "fused_sgd",
              "processes", "eval_batch_size")  # fmt: skip
STOP_AT = 1.25  # a run whose pace needs this many times the time left stops the newest run
# measuring a model: it is measured only if this is left and, while a run of a measured model would end in time
# instead, this and a run at MEASURE_FASTER x the fastest rate fit (else the device has nothing else to do)
MEASURE_S = 60
# A model not measured yet may train faster than any measured: in one H100 session VGG-16 raced at 34,948 images/s,
# VGG-13 at 40,357 and WRN-10 at 46,354 (1.33x), in `graphs-fused` (h100-2026-11-27)
MEASURE_FASTER = 1.5
PACE_EPOCHS = 3  # spans between epochs seen, after its first epoch, that give a run's own pace (then its estimate)
PACE_WINDOW = 5  # the most recent spans its pace counts
POLL_S = 5
STATE = Path("gpu-session")  # the runs started (state.json) and their logs: what --collect reads
DETACHED = STATE / "detached.json"  # where a session started with --return-after goes on: what --collect reads first
RETURNED = "returned"  # in a --workdir: every entry its session trained has come back in a command's OUT


@dataclass(frozen=True)
class Spec:
    study: str
    model: str
    method: str
    seed: int
    replaces: str | None = field(default=None, compare=False)  # a stale entry's finished_at: the run retrains it

    @property
    def name(self) -> str:
        return f"{self.study}/cifar10-{self.model}-{self.method}-s{self.seed}"

    @property
    def entry(self) -> Path:
        return Path("ledger") / self.name

    @property
    def log(self) -> Path:
        return STATE / f"{self.name.replace('/', '-')}.log"

    @property
    def text(self) -> str:
        return f"{self.study}:{self.model}:{self.method}:{self.seed}"

    def done(self) -> bool:
        """Whether the run's entry is in the ledger (for a retrained run: the one that replaced the stale entry)."""
        if self.replaces is None:
            return (self.entry / "metrics.json").is_file()
        try:  # the ledger swaps an entry whole (ledger.record): absent for a moment, never half-written
            return json.loads((self.entry / "run.json").read_text()).get("finished_at", "") != self.replaces
        except (OSError, ValueError):
            return False


def parse_run(text: str) -> Spec:
    parts = text.split(":")
    if len(parts) not in (3, 4) or not all(parts) or (len(parts) == 4 and not parts[3].isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected STUDY:MODEL:METHOD or STUDY:MODEL:METHOD:SEED")
    return Spec(*parts[:3], int(parts[3]) if len(parts) == 4 else 0)


@dataclass
class Training:
    """A run started by this session: its process, and its epochs as seen in its log."""

    spec: Spec
    epochs: int
    estimate_s: float  # at its start, for the runs at once then
    process: subprocess.Popen | None  # None for a run found by --collect (its pid in `pid`)
    pid: int
    started: float = field(default_factory=time.monotonic)
    seen: list[tuple[float, int]] = field(default_factory=list)  # (time, epoch) at each new epoch seen
    since: int = 1  # the epoch its pace counts from: not before its first, which compiles
    stopped: bool = False
    exited: bool = False  # its process's end said in the session's lines

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return alive(self.pid)

    def epoch(self) -> int:
        """The last epoch its log reports (the train stage writes a line per epoch where no progress bar shows), never
        less than one seen before: a burst of warnings can push every epoch line out of the log's tail."""
        known = self.seen[-1][1] if self.seen else 0
        found = re.findall(r": epoch (\d+)/\d+ ", self.tail())
        return max(known, int(found[-1])) if found else known

    def tail(self) -> str:
        """The last 4 KB of its log ("" if it has none)."""
        try:
            with open(self.spec.log, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def last_line(self) -> str:
        """Its log's last non-empty line, a progress bar's updates split at carriage returns: why it failed, if it
        did."""
        lines = [line.strip() for line in re.split(r"[\r\n]", self.tail()) if line.strip()]
        return lines[-1][:300] if lines else "(its log is empty)"

    def observe(self, now: float) -> None:
        epoch = self.epoch()
        if not self.seen or self.seen[-1][1] != epoch:
            self.seen.append((now, epoch))

    def pace(self) -> float | None:
        """Seconds an epoch over its last spans between epochs seen since `since` (PACE_EPOCHS at least, PACE_WINDOW
        at most), the slowest left out: a new phase's first epoch compiles its graphs (11.4 s against 1.4 s for a WUS
        run's first skip epoch on an H100), which says nothing of the epochs after it."""
        seen = [seen for seen in self.seen if seen[1] >= self.since][-PACE_WINDOW - 1 :]
        spans = [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(seen)]
        if len(spans) < PACE_EPOCHS:
            return None
        spans.remove(max(spans, key=lambda span: span[0] / span[1]))
        return sum(seconds for seconds, _ in spans) / sum(epochs for _, epochs in spans)

    def settle(self) -> None:
        """Measure its pace anew from its next epoch on (the runs beside it changed)."""
        self.since = max(self.since, self.seen[-1][1] if self.seen else 1)

    def late(self, now: float, time_left: float) -> bool:
        """Whether its own pace needs over STOP_AT x the time left (never before it has a pace)."""
        return self.pace() is not None and self.left_s(now) > STOP_AT * time_left

    def left_s(self, now: float) -> float:
        """Seconds to its end: at its own pace once it has one, else what its estimate leaves."""
        self.observe(now)
        pace = self.pace()
        if pace is not None:
            return (self.epochs - self.seen[-1][1]) * pace
        return max(0.0, self.estimate_s - (now - self.started))


class Session:
    def __init__(self, out: Path, deadline: float) -> None:
        self.out, self.deadline, self.lines, self.race = out, deadline, [], []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        atomic_write(self.out / "session.txt", "\n".join(self.lines) + "\n")  # a follower never reads half of it

    def record(self, row: list) -> None:
        """A row of race.csv, which is rewritten whole, as session.txt is."""
        self.race.append(row)
        text = io.StringIO()
        header = ["model", "setting", "images_per_s", "first_epoch_s", "graphs_skipped", "device"]
        csv.writer(text, lineterminator="\n").writerows([header, *self.race])
        atomic_write(self.out / "race.csv", text.getvalue())

    def left(self) -> float:
        return self.deadline - time.monotonic()


def resolve(args: argparse.Namespace) -> dict[Spec, RunConfig]:
    """Each run's configuration, checked as the train stage checks it, and that the ledger records it: a mistake
    fails here, in seconds, before the data, the race or a detached session, not in every run."""
    params = load_params(args.params)
    validate_grid(params)
    configs = {}
    for spec in args.runs:
        cfg = resolve_run(params, spec.study, "cifar10", spec.model, spec.method, spec.seed)
        counted, departures = paper_setting(spec.study, cfg.to_dict()["recipe"], spec.model)
        if not counted:
            raise UserError(f"{spec.name} is not at its paper's setting ({'; '.join(departures)}) in {args.params}: "
                            "the ledger keeps only those, so it would come back without an entry")  # fmt: skip
        if cfg.ledger == "ignore":
            raise UserError(f"train.ledger is ignore in {args.params}: no run would come back with an entry; set it "
                            "to record")  # fmt: skip
        configs[spec] = cfg
    return configs


def to_train(
    session: Session,
    configs: dict[Spec, RunConfig],
    retrain_stale: bool,
    device: torch.device,
    any_device: bool = False,
) -> dict[Spec, RunConfig]:
    """The runs to train, each other run said with why: those without a ledger entry, and with `retrain_stale` those
    whose entry older training code or other settings trained on this kind of device (a CPU's entry retrained on a GPU
    would mix two devices' times in one network's seeds), each to replace its entry. A method's run whose baseline
    entry trained on a device of another name waits for that device (`any_device`: trains here too)."""
    pending = {}

    def waits(spec: Spec) -> bool:
        elsewhere = None if any_device else baseline_elsewhere(spec, pending, device)
        if elsewhere:
            session.say(f"{spec.name}: not trained here: its baseline trained on {elsewhere}, and its time saved "
                        "pairs with its baseline's on one device (--any-device trains it here)")  # fmt: skip
        return bool(elsewhere)

    for spec, cfg in configs.items():
        if not spec.done():
            if not waits(spec):
                pending[spec] = cfg
            continue
        try:
            entry = read_entry(spec.entry)
        except UserError as error:
            session.say(f"{spec.name}: not trained: {error}")
            continue
        diffs = "; ".join(differences(entry, cfg, run_code_version(cfg)))
        where = entry.info.get("device", "")
        if not diffs:
            session.say(f"{spec.name}: in the ledger already")
        elif not retrain_stale:
            session.say(f"{spec.name}: in the ledger, trained differently ({diffs}): --retrain-stale trains it again")
        elif where.startswith("cpu") != (device.type == "cpu"):
            session.say(f"{spec.name}: in the ledger, trained differently on {where}: retrained on that kind of "
                        "device alone")  # fmt: skip
        elif not waits(spec):
            session.say(f"{spec.name}: in the ledger, trained differently ({diffs}): trains again, to replace it")
            pending[replace(spec, replaces=entry.info.get("finished_at", ""))] = cfg
    return pending


def baseline_elsewhere(spec: Spec, pending: dict[Spec, RunConfig], device: torch.device) -> str | None:
    """The device of another name on which the baseline entry of `spec`'s seed trained, unless this session trains
    that baseline again; None for a baseline, or with no such entry."""
    baseline = replace(spec, method="baseline", replaces=None)
    if spec.method == "baseline" or baseline in pending or not baseline.done():
        return None
    try:
        where = read_entry(baseline.entry).info.get("device") or ""
    except UserError:
        return None  # not an entry the ledger can read: nothing to pair with
    return where if where and where != tracked_device(str(device)) else None


def prepare_data(session: Session, archive: Path | None) -> None:
    prepared = Path("data/prepared/cifar10")
    if (prepared / "manifest.json").is_file() and prepared_train_size(prepared) is None:
        return  # every training image (the quick setting's half is prepared again)
    if archive is None or not archive.is_file():
        raise UserError(f"data/prepared/cifar10 lacks CIFAR-10's training images and --cifar10 {archive} is not a "
                        "file: copy the CIFAR-10 archive into the checkout (carry/) and name it")  # fmt: skip
    session.say(f"preparing CIFAR-10 from {archive}")
    command = [sys.executable, str(REPO / "stages/download.py"), "--dataset", "cifar10", "--no-mlflow"]
    done = subprocess.run(command, env=os.environ | {"CIFAR10_SOURCE": str(archive)}, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"preparing CIFAR-10 failed: {(done.stderr or done.stdout).strip()[-1000:]}")


def measure(session: Session, model: str, variant: Variant, device: torch.device, sizes: Sizes) -> Rate | None:
    """`model`'s steady training rate in `variant` (None if it failed: the reason printed), a row of race.csv."""
    rate = None
    try:
        rate = steady_rate(runs_config(model, device, sizes.batch), sizes, variant)
    except Exception as error:  # the next candidate still runs
        session.say(f"{model:10} {variant.name:26} FAILED: {type(error).__name__}: {str(error).strip()[:200]}")
    finally:
        torch._dynamo.reset()  # its compiled graphs and CUDA graph pools: their memory goes to the runs
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the runs, other processes, get the device's memory
    figures = [round(rate.images_per_s, 1), round(rate.first_epoch_s, 2), rate.graphs_skipped] if rate else ["", "", ""]
    session.record([model, variant.name, *figures, device_name(device)])
    if rate is not None:
        session.say(f"{model:10} {variant.name:26} {rate.images_per_s:10.0f} {rate.first_epoch_s:8.1f}"
                    f"{skipped(rate, device)}")  # fmt: skip
    return rate


def settings(variant: Variant, device: torch.device) -> list[str]:
    """The -S overrides that train a run in `variant` on `device`."""
    compile = {False: "false", True: "true"}.get(variant.compile, variant.compile)  # type: ignore[arg-type]
    values = [f"train.compile={compile}", f"train.fused_sgd={str(variant.fused_sgd).lower()}",
              f"train.cudnn_benchmark={str(variant.cudnn_benchmark).lower()}"]  # fmt: skip
    return values + ([f"train.device={device}", "train.threads=1"] if device.type != "cuda" else [])


def estimate_s(epochs: int, train_size: int, rate: Rate, at_once: int, share: float = 1.0) -> float:
    """A run's seconds at its model's rate shared by `at_once` runs, its epochs training `share` of the samples (1:
    every epoch full; `sample_share`)."""
    first_epoch = FIRST_EPOCH["alone" if at_once == 1 else "at once"] * rate.first_epoch_s
    return START_S + first_epoch + share * epochs * train_size * at_once / rate.images_per_s * EVALUATION


def sample_share(spec: Spec, cfg: RunConfig) -> float:
    """The share of every epoch's samples that a run of `spec`'s method trains, as the ledger says: the most that its
    method's entries trained in this study, dataset, number of epochs and method settings, on any network (DFP's
    schedule leaves 12.75% out of each); 1 without such an entry, and for a method that trains every sample."""
    wanted = json.loads(json.dumps(cfg.to_dict()))  # as run.json holds it: lists, not tuples
    shares = []
    for path in Path("ledger", spec.study).glob(f"{cfg.dataset}-*-{spec.method}-s*"):
        try:
            entry = read_entry(path)
        except UserError:
            continue  # not an entry the ledger can read: it says nothing
        config, trained = entry.info["config"], entry.metrics.get("total_trained_samples")
        every = len(entry.history) * max(row.get("trained_samples", 0.0) for row in entry.history)
        if (trained and every and all(config.get(key) == wanted[key] for key in ("method", "method_args", "dataset"))
                and (config.get("recipe") or {}).get("epochs") == wanted["recipe"]["epochs"]):  # fmt: skip
            shares.append(trained / every)
    return min(1.0, max(shares, default=1.0))


def need_s(
    spec: Spec,
    cfg: RunConfig,
    estimate: float,
    at_once: int,
    variant: Variant,
    device: torch.device,
    share: float = 1.0,
) -> float:
    """A run's estimate: `estimate` (its model's rate), or, for a run alone, what its baseline's entry says if less."""
    known = known_s(spec, cfg, variant, device, share) if at_once == 1 else None
    return estimate if known is None else min(estimate, known)


def known_s(spec: Spec, cfg: RunConfig, variant: Variant, device: torch.device, share: float = 1.0) -> float | None:
    """What the ledger says a run of `spec` takes alone here (KNOWN_MARGIN, KNOWN_START_S): the longest wall time of
    its model's baseline entries trained in its recipe on a device of this name in `variant`, their training cut to
    `share` of the samples (`sample_share`); None without one. A method only makes epochs cheaper (DFP's leave samples
    out, WUS's update a bias), so its baseline bounds it."""
    baselines = sorted(Path("ledger", spec.study).glob(f"cifar10-{spec.model}-baseline-s*"))
    if not baselines:
        return None
    setting = json.loads(json.dumps(variant.config(cfg).to_dict()))  # as run.json holds it: lists, not tuples
    samples = cfg.recipe.epochs * train_size(cfg.data_root, cfg.dataset)  # on as many images as this run's
    walls, here = [], tracked_device(str(device))
    for path in baselines:
        try:
            entry = read_entry(path)
        except UserError:
            continue  # not an entry the ledger can read: the race's estimate stands
        wall, config = entry.metrics.get("wall_time_s"), entry.info["config"]
        if (wall is not None and entry.info.get("device") == here
                and entry.metrics.get("total_trained_samples") == samples
                and all(config.get(key) == setting[key] for key in KNOWN_KEYS)):  # fmt: skip
            walls.append(wall - (1 - share) * entry.metrics.get("train_time_s", 0.0))
    return KNOWN_MARGIN * max(walls) + KNOWN_START_S if walls else None


def pack(session: Session, started: list[Spec]) -> int:
    """The finished runs' entries and every run's log into OUT; rewritten each time, so an early stop keeps them."""
    ended = [spec for spec in started if spec.done()]
    for name, paths in (("ledger.tar.gz", [spec.entry for spec in ended]),
                        ("logs.tar.gz", [spec.log for spec in started if spec.log.is_file()])):  # fmt: skip
        tmp = session.out / f".{name}.tmp"  # renamed when whole: a copy taken meanwhile gets the last one
        with tarfile.open(tmp, "w:gz") as tar:
            for path in paths:
                tar.add(path)
        tmp.replace(session.out / name)
    names = ", ".join(spec.name for spec in ended) or "none"
    session.say(f"-> {session.out / 'ledger.tar.gz'}: the entries of {len(ended)} runs ({names})")
    return len(ended)


def pack_new(session: Session, runs: list[Training], packed: int) -> int:
    """Pack again when more of `runs` have ended than the `packed` last time, so that a command cut off keeps each
    run as it ends; how many are packed now."""
    if sum(run.spec.done() for run in runs) > packed:
        return pack(session, [run.spec for run in runs])
    return packed


def train(
    session: Session, args: argparse.Namespace, configs: dict[Spec, RunConfig], device: torch.device, sizes: Sizes
) -> None:
    """Race the settings on the first pending run's model (or measure the one named), then train the runs that fit,
    `args.parallel` at once."""
    pending = list(configs)
    shares = {spec: sample_share(spec, cfg) for spec, cfg in configs.items()}
    for spec in pending:
        if shares[spec] < 1:
            session.say(f"{spec.name}: estimated at {100 * shares[spec]:.2f}% of every epoch's samples, as its "
                        "method's entries in the ledger trained")  # fmt: skip
    session.say(f"race: training images/s at batch {sizes.batch}, steady state ({sizes.batches} batches an epoch); "
                "first s: its untimed first epoch (compiling)")  # fmt: skip
    session.say(f"{'model':10} {'setting':26} {'images/s':>10} {'first s':>8}")
    first = pending[0].model
    race = {variant: measure(session, first, variant, device, sizes) for variant in candidates(args.setting, device)}
    fine = {variant: rate for variant, rate in race.items() if rate is not None}
    if not fine:
        raise UserError(f"every setting failed on {first}: nothing to train with")
    best = max(fine, key=lambda variant: fine[variant].images_per_s)
    # a setting raced after another compiled the same graphs in this process: its first epoch is the first one's
    rates = {first: replace(fine[best], first_epoch_s=max(rate.first_epoch_s for rate in fine.values()))}
    session.say(f"-> every run trains as '{best.name}': {' '.join(f'-S {s}' for s in settings(best, device))}")
    runs: list[Training] = []
    queue, packed = list(pending), 0

    def alone_s(spec: Spec, rate: Rate) -> float:
        """A run of `spec` alone at `rate`: estimate_s."""
        cfg = configs[spec]
        return estimate_s(cfg.recipe.epochs, train_size(cfg.data_root, cfg.dataset), rate, 1, shares[spec])

    write_state(runs)
    while True:
        now = time.monotonic()
        active = [run for run in runs if not run.stopped and run.alive()]
        for run in active:
            run.observe(now)
        say_exited(session, runs)
        stop = to_stop(active, now, session.left())
        if stop:
            newest, late = stop
            active.remove(newest)
            session.say(f"{newest.spec.name}: stopped at epoch {newest.epoch()}: {late.spec.name} needs about "
                        f"{late.left_s(now):.0f} s, {session.left():.0f} s left")  # fmt: skip
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                os.killpg(newest.pid, signal.SIGTERM)  # its group: the train stage, and torchrun's workers if any
            newest.stopped = True
            write_state(runs)
            for run in active:
                run.settle()
        packed = pack_new(session, runs, packed)
        for spec in list(queue):
            if len(active) >= args.parallel:
                break
            if spec not in queue:
                continue  # dropped with its model, whose measurement failed
            cfg = configs[spec]
            epochs, size = cfg.recipe.epochs, train_size(cfg.data_root, cfg.dataset)
            if spec.model not in rates:
                if active:
                    continue  # measured only while nothing trains
                fastest = max(rates.values(), key=lambda rate: rate.images_per_s)
                hoped = replace(fastest, images_per_s=MEASURE_FASTER * fastest.images_per_s)
                waiting = [other for other in queue if other.model in rates]  # runs that may use the time instead
                in_time = [other for other in waiting if alone_s(other, rates[other.model]) <= session.left()]
                if session.left() < MEASURE_S or (in_time and session.left() < MEASURE_S + alone_s(spec, hoped)):
                    continue  # it would not end in time even that fast, and another run would: not worth measuring
                rate = measure(session, spec.model, best, device, sizes)
                if rate is None:
                    dropped = [other for other in queue if other.model == spec.model]
                    for other in dropped:
                        queue.remove(other)
                    session.say(f"{spec.model}: its measurement failed: not trained "
                                f"({', '.join(other.name for other in dropped)})")  # fmt: skip
                    continue
                rates[spec.model] = rate
            at_once = len(active) + 1  # sharing the device with the runs training now
            estimate = estimate_s(epochs, size, rates[spec.model], at_once, shares[spec])
            need = need_s(spec, cfg, estimate, at_once, best, device, shares[spec])
            if not can_start(need, active, now, session.left()):
                continue  # perhaps later, with fewer runs at once
            queue.remove(spec)
            active.append(start(session, args, spec, cfg.recipe.epochs, need, settings(best, device)))
            runs.append(active[-1])
            write_state(runs)
        if not active:
            break
        if session.left() <= 0:
            session.say(f"deadline: {', '.join(run.spec.name for run in active)} still training (--collect waits)")
            break
        time.sleep(POLL_S)
    for spec in queue:
        session.say(f"{spec.name}: not started: it would not end in time")
    report(session, runs)


def candidates(setting: str, device: torch.device) -> list[Variant]:
    """The settings to measure: the one named, or the race's (eager alone on a CPU, where compiling takes minutes)."""
    if setting != "race":
        return [CANDIDATES[setting]]
    return list(CANDIDATES.values()) if device.type == "cuda" else [CANDIDATES["eager"]]


def can_start(need_s: float, active: list[Training], now: float, time_left: float) -> bool:
    """Whether a run estimated at `need_s` ends in time, and every run of `active` still does once it shares the
    device with one run more (each slowed by the number of runs at once)."""
    slowed = (len(active) + 1) / max(1, len(active))
    return need_s <= time_left and all(run.left_s(now) * slowed <= time_left for run in active)


def to_stop(active: list[Training], now: float, time_left: float) -> tuple[Training, Training] | None:
    """(the run to stop, the run that is late) when a run is late: the newest goes, the last in order and the one
    whose start may have slowed the others. A run alone goes on: stopping it frees the device for none, and a run
    past the deadline goes on for --collect."""
    if len(active) < 2:
        return None
    late = next((run for run in active if run.late(now, time_left)), None)
    return (active[-1], late) if late else None


def start(
    session: Session, args: argparse.Namespace, spec: Spec, epochs: int, need: float, overrides: list[str]
) -> Training:
    """Start `spec`'s train stage, detached: the run outlives this command while the machine stays."""
    STATE.mkdir(exist_ok=True)
    overrides = [*overrides, *(["train.ledger=retrain"] if spec.replaces is not None else [])]  # replaces the entry
    command = [sys.executable, str(REPO / "stages/train.py"), "--study", spec.study, "--dataset", "cifar10",
               "--model", spec.model, "--method", spec.method, "--seed", str(spec.seed), "--params", args.params,
               "--no-mlflow", *[word for s in overrides for word in ("-S", s)]]  # fmt: skip
    with open(spec.log, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    session.say(f"{spec.name}: started, about {need:.0f} s ({session.left():.0f} s left), log {spec.log}")
    return Training(spec, epochs, need, process, process.pid)


def say_exited(session: Session, runs: list[Training]) -> None:
    """For each run whose process has ended without its entry, and not stopped, its log's last line, once."""
    for run in runs:
        if not run.exited and not run.stopped and not run.alive() and not run.spec.done():
            run.exited = True
            session.say(f"{run.spec.name}: exited without its entry; its log ends: {run.last_line()}")


def write_state(runs: list[Training]) -> None:
    STATE.mkdir(exist_ok=True)
    state = [{"run": r.spec.text, "replaces": r.spec.replaces, "pid": r.pid, "epochs": r.epochs,
              "estimate_s": r.estimate_s, "stopped": r.stopped} for r in runs]  # fmt: skip
    atomic_write(STATE / "state.json", json.dumps(state, indent=1) + "\n")


def report(session: Session, runs: list[Training]) -> None:
    for run in runs:
        status = "ended" if run.spec.done() else "stopped" if run.stopped else "training" if run.alive() else "failed"
        session.say(f"{run.spec.name}: {status} at epoch {run.epoch()}/{run.epochs}")
    pack(session, [run.spec for run in runs])


def collect(session: Session) -> bool:
    """Wait for the runs a session started and left training, until they end or the deadline; pack. True when none
    trains on: every entry is in OUT."""
    path = STATE / "state.json"
    if not path.is_file():
        raise UserError(f"{path} is missing: no session started runs here")
    runs = [Training(replace(parse_run(item["run"]), replaces=item.get("replaces")), item["epochs"],
                     item["estimate_s"], None, item["pid"], stopped=item.get("stopped", False))
            for item in json.loads(path.read_text())]  # fmt: skip
    packed = pack(session, [run.spec for run in runs])
    # a run with its entry has ended, though its process may linger as a zombie where nothing reaps orphans
    say_exited(session, runs)
    while any(run.alive() and not run.spec.done() for run in runs) and session.left() > 0:
        time.sleep(POLL_S)
        packed = pack_new(session, runs, packed)
        say_exited(session, runs)
    report(session, runs)
    return not any(run.alive() for run in runs)


def detach(session: Session, args: argparse.Namespace) -> int:
    """The session in a copy of the checkout under --workdir, in a process that outlives this command while the
    machine stays; its lines printed until it ends or --return-after passes, then what it packed copied to OUT."""
    work = args.workdir.resolve()
    if Path.cwd().resolve().is_relative_to(work):
        raise UserError(f"--workdir {work} holds the checkout: name a folder outside it")
    if work.exists() and any(work.iterdir()) and not (work / "session.log").is_file():
        raise UserError(f"--workdir {work} holds files but no earlier session (session.log): name another folder")
    if (work / "repo" / STATE / "state.json").is_file() and not (work / RETURNED).is_file():
        raise UserError(f"the earlier session in {work} trained runs whose entries no command has brought back: "
                        "--collect first (it packs them into its OUT), or name another --workdir")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)  # an earlier session's copy
    left_out = {Path.cwd() / ".git", Path.cwd() / STATE, args.out, work}  # OUT and the copy may lie in the checkout

    def skip(folder: str, names: list[str]) -> list[str]:
        return [name for name in names if Path(folder, name).resolve() in left_out]

    shutil.copytree(Path.cwd(), work / "repo", symlinks=True, ignore=skip)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    env = os.environ | ({"DVC_EXP_BASELINE_REV": commit} if commit else {})  # the entries' commit: the copy has no .git
    minutes_left = args.minutes - (time.monotonic() - STARTED) / 60
    command = [sys.executable, str(work / "repo/benchmarks/gpu_session.py"), str(work / "out"),
               "--minutes", f"{minutes_left:.3f}", "--runs", *[spec.text for spec in args.runs],
               "--parallel", str(args.parallel), "--setting", args.setting,
               *(["--retrain-stale"] if args.retrain_stale else []), *(["--any-device"] if args.any_device else []),
               "--cifar10", in_copy(args.cifar10, work / "repo"), "--params", in_copy(Path(args.params), work / "repo"),
               "--device", args.device, *(["--quick"] if args.quick else [])]  # fmt: skip
    with open(work / "session.log", "w") as log:
        process = subprocess.Popen(command, cwd=work / "repo", stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
    STATE.mkdir(exist_ok=True)
    DETACHED.write_text(json.dumps({"workdir": str(work), "pid": process.pid}) + "\n")
    until = STARTED + 60 * args.return_after
    follow(session, work, lambda: process.poll() is None and time.monotonic() < until)
    if process.poll() is None:
        session.say(f"returning: the session goes on in {work} (pid {process.pid}); --collect waits for it")
        return 0
    if not still_training([work / "repo" / STATE / "state.json"]):  # it packed every entry, copied into OUT
        (work / RETURNED).touch()
    return process.returncode


def in_copy(path: Path, repo: Path) -> str:
    """`path` for the session that runs in `repo`, a copy of the checkout: the copy's file where it lies in the
    checkout (the next command's copy of the working tree cannot touch it), else absolute."""
    path, checkout = path.resolve(), Path.cwd().resolve()
    return str(repo / path.relative_to(checkout) if path.is_relative_to(checkout) else path)


def still_training(states: list[Path]) -> list[str]:
    """The runs listed in these state.json files whose processes still run, each as 'NAME (pid N)'."""
    found = []
    for path in dict.fromkeys(states):
        if path.is_file():
            items = json.loads(path.read_text())
            found += [f"{parse_run(i['run']).name} (pid {i['pid']})" for i in items if alive(i["pid"])]
    return found


def follow(session: Session, work: Path, going: Callable[[], bool]) -> None:
    """Print the lines of the session under `work` as it writes them, and copy what it packs into OUT, while
    `going()`, then the rest, and its whole output (detached.log: what it printed, tracebacks included)."""
    seen, path = 0, work / "out/session.txt"
    while True:
        more = going()
        lines = path.read_bytes().decode(errors="replace").splitlines() if path.is_file() else []
        for line in lines[seen:]:
            session.say(line)
        seen = max(seen, len(lines))
        for name in ("ledger.tar.gz", "logs.tar.gz", "race.csv"):  # each replaced whole by the session
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(work / "out" / name, session.out / name)
        if not more:
            with contextlib.suppress(FileNotFoundError):
                shutil.copy2(work / "session.log", session.out / "detached.log")
            return
        time.sleep(1)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not reaped where nothing reaps orphans, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for what comes back: the entries, logs, race, session.txt")
    parser.add_argument("--minutes", type=float, default=9.0,
                        help="the session's time: this command's, or the detached session's with --return-after "
                        "(default: %(default)s)")  # fmt: skip
    parser.add_argument("--runs", nargs="+", type=parse_run, default=[parse_run(r) for r in DEFAULT_RUNS],
                        help="STUDY:MODEL:METHOD[:SEED], in order, each at its paper's setting in --params "
                             "(default: WUS's ResNet-18, VGG-11, AlexNet, VGG-16 runs, then DFP's networks; those in "
                             "the ledger skipped, but for --retrain-stale)")  # fmt: skip
    parser.add_argument("--retrain-stale", action="store_true",
                        help="also train the runs whose entry older training code or other settings trained on this "
                             "kind of device (GPU or CPU), replacing it")  # fmt: skip
    parser.add_argument("--any-device", action="store_true",
                        help="also train a method's run whose baseline entry trained on a device of another name "
                             "(its accuracy pairs with the baseline's, its time does not)")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=2, help="most runs at once (default: %(default)s)")
    parser.add_argument("--setting", choices=["race", *CANDIDATES], default="race",
                        help="the setting of every run: the race's fastest, or one named (default: race)")  # fmt: skip
    parser.add_argument("--cifar10", type=Path, default=Path("carry/cifar10-jpg.tar.gz"),
                        help="the CIFAR-10 archive, used if data/prepared/cifar10 is missing")  # fmt: skip
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="gpu_check's tiny race sizes: checks this script")
    parser.add_argument("--collect", action="store_true", help="only wait for the runs left training, and pack")
    parser.add_argument("--return-after", type=float, metavar="MINUTES",
                        help="return after this long, the session going on detached to --minutes (above)")  # fmt: skip
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-session"),
                        help="where --return-after copies the checkout and trains (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    if not (math.isfinite(args.minutes) and args.minutes > 0):
        parser.error(f"--minutes {args.minutes}: a number of minutes more than 0")
    if args.return_after is not None and (args.collect or not 0 < args.return_after < args.minutes):
        parser.error("--return-after: more than 0 and less than --minutes, and not with --collect")
    device = checked_device(parser, args.device, " (--device cpu --quick checks the script)")
    args.out = args.out.resolve()
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file of that name, or one above it
        parser.error(f"OUT {args.out}: not a folder ({error.strerror})")
    session = Session(args.out, STARTED + 60 * args.minutes)
    session.say(f"gpu_session on {device_name(device)}: torch {torch.__version__}, {args.minutes:g} minutes")
    try:
        if args.collect:
            work = None
            if DETACHED.is_file():  # a session started with --return-after: its runs are in its copy
                detached = json.loads(DETACHED.read_text())
                work = Path(detached["workdir"])
                follow(session, work, lambda: alive(detached["pid"]) and session.left() > 0)
                ended = not alive(detached["pid"]) and (work / "session.log").is_file()
                if ended and not (work / "repo" / STATE / "state.json").is_file():
                    raise UserError(f"the session in {work} ended before it started runs (it failed, or had nothing "
                                    f"to train): what it printed is in {session.out / 'detached.log'}")  # fmt: skip
                os.chdir(work / "repo")
            if collect(session) and work is not None:  # the copy's entries are in OUT: a new session may empty it
                (work / RETURNED).touch()
            return
        if DETACHED.is_file() and alive(pid := json.loads(DETACHED.read_text())["pid"]):  # its runs have the device
            raise UserError(f"the session started earlier (pid {pid}) still runs: --collect waits for it")
        # an earlier session's runs, here or in a copy under a --workdir (which --return-after empties), have the device
        workdirs = [Path(json.loads(DETACHED.read_text())["workdir"])] if DETACHED.is_file() else []
        workdirs += [args.workdir.resolve()] if args.return_after is not None else []
        if running := still_training([STATE / "state.json", *(w / "repo" / STATE / "state.json" for w in workdirs)]):
            raise UserError(f"runs of an earlier session still train: {', '.join(running)}: --collect waits for them, "
                            "or `kill -- -PID` stops one (its process group)")  # fmt: skip
        DETACHED.unlink(missing_ok=True)  # this session trains here
        configs = resolve(args)
        if args.return_after is not None:
            sys.exit(detach(session, args))
        prepare_data(session, args.cifar10)
        configs = to_train(session, configs, args.retrain_stale, device, args.any_device)
        if not configs:
            session.say("nothing to train")
            return
        train(session, args, configs, device, QUICK if args.quick else FULL)
    except UserError as error:
        session.say(f"error: {error}")
        sys.exit(1)
    except Exception:  # into session.txt, which the command that started a detached session prints
        session.say(traceback.format_exc().rstrip())
        sys.exit(1)


if __name__ == "__main__":
    main()
