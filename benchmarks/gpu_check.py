"""GPU check: what a CUDA machine shows of this project's training, in one command (meant to take under 10 minutes
on one H100). Needs PyTorch with numpy, PyYAML and tqdm; pytest only for the tests; no MLflow, no DVC.

    python benchmarks/gpu_check.py OUT [--device cuda] [--quick] [--models lenet resnet18 ...] [--threads N]
                                       [--sections tests throughput methods concurrency profile tuning skip]
                                       [--tests-k EXPR]

Writes under the folder OUT, and prints:
  cuda_tests.log   `pytest -m cuda -v tests/test_gpu.py` (or those --tests-k selects), each test's result written as
                   it ends (skipped, saying why, without CUDA or without pytest)
  throughput.csv   training images per second per model (lenet, alexnet, vgg11, vgg16, resnet18, wrn16) at batch
                   128, eager and compiled (train.compile), fp32 and bf16 autocast (train.amp; "fp32" convolutions
                   run in TF32, PyTorch's default), and on CUDA compiled as CUDA graphs in bf16 (train.compile:
                   reduce-overhead): this project's loop (trainer.train_epoch: batches gathered,
                   cropped and flipped on the device, per-sample losses, SGD) on synthetic images, in steady state:
                   after an untimed first epoch (compiling, allocating), the median of the timed epochs, each timed
                   between two device synchronisations; graphs_skipped: the graphs inductor ran without CUDA
                   graphs though asked for them (its reasons printed beside the rate)
  methods.csv      every registered method for 2 epochs of LeNet (trainer.fit, with evaluation), eager and compiled,
                   under the device's default autocast: per epoch its samples, pruning, phase, loss, accuracy, time,
                   and the graphs compiled so far
  concurrency.csv  the aggregate training images per second of N processes training at once on the one device
                   (N = 1, 2, 4, 8), each eager with the device's default autocast and cores / N CPU threads (or
                   --threads), for the small models (lenet, alexnet); timed from the first process's start to the
                   last one's end, after all have warmed up
  profile.csv      (section `profile`, on request) per model (default resnet18): images per second of one compiled
                   epoch under torch.profiler, the device's busy share (its kernels' time over the epoch's: well
                   below 1 when the device waits on the host) and the kernels launched per batch
  profile.txt      the top 25 ops of each profiled model by device time and by host time
  tuning.csv       (section `tuning`, on request) per model (default resnet18): images per second of the runs'
                   setting and of changes to it, each against it, as throughput measures them: the train.compile
                   modes max-autotune (CUDA only) and reduce-overhead (CUDA graphs), train.cudnn_benchmark (CUDA
                   only), train.fused_sgd, and a 4x batch; graphs_skipped as in throughput.csv
  skip.csv         (section `skip`, on request) per model (default resnet18): WUS's skip step against a normal
                   step, without augmentation as the WUS recipe trains, in the fastest setting measured on an H100
                   (CUDA graphs, fused SGD, cudnn.benchmark; eager on a CPU): each phase's images per second in
                   steady state (as throughput), the skip phase's against the normal one's, the graphs run without
                   CUDA graphs, and of one more epoch under torch.profiler the device's busy share and kernels per
                   batch. Whether a skip epoch saves time on the device, and if not, why: it runs without CUDA
                   graphs, or the host's part of a step is as long as a normal step's
  skip.txt         the top 25 ops of each phase by device time and by host time
  gpu_check.txt    everything printed, appended: each command's lines after a header line (its date and command)
  errors.log       the traceback of each setting, method or model that failed (written only where one did),
                   appended under the failing command's header line
The line "<model>: N = k pays" names the smallest N within 5% of the best aggregate throughput. A setting, method or
model that fails is printed as FAILED, with an empty rate in its row, and the check goes on to the next; each table
is rewritten after every row, so a check stopped midway leaves what it measured (a section run again rewrites its
own). The exit status is 1 when the cuda tests fail (or take over 8 minutes) or anything failed. `--sections` runs
some of the parts (default: all but `profile`, `tuning` and `skip`), to fit a machine that limits each command's
time: e.g. `--sections tests`, `--sections throughput`, then `--sections methods concurrency`, all into one OUT;
`--sections profile tuning` says where a step's time goes and what would win it back, `--sections skip` what a WUS
skip epoch costs.

`--device cpu --quick` checks the script itself on a CPU in about a minute: LeNet only, batch 32, a few batches,
N = 1, 2.
"""

import argparse
import csv
import importlib.util
import logging
import multiprocessing
import os
import queue
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

try:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from cheaptrain import positive_int
    from cheaptrain.config import Recipe, RunConfig
    from cheaptrain.data import Split
    from cheaptrain.methods import METHODS, Method, create_method
    from cheaptrain.methods.wus import SKIP, WeightUpdateSkipping
    from cheaptrain.trainer import Training, fit, prepare, train_epoch
except ModuleNotFoundError as missing:  # the project's light dependencies: no MLflow, no DVC
    sys.exit(f"error: gpu_check needs PyTorch, numpy, PyYAML and tqdm: {missing}")

MODELS = ("resnet18", "lenet", "alexnet", "vgg11", "vgg16", "wrn16")  # resnet18 first: the target
SMALL_MODELS = ("lenet", "alexnet")  # the concurrency measurement: models too small to fill the device alone
FOCUS_MODEL = "resnet18"  # the profile, tuning and skip sections' model, unless --models names others
METHOD_KNOBS = {  # a pruning epoch (epoch 1) within 2 epochs; WUS cannot skip before epoch 5, so it trains normally
    "dfp": dict(window=2, starting_point=1, attenuation=1.0, block=1, count=1, prune_num=0.3),
    "random_prune": dict(window=2, starting_point=1, attenuation=1.0, block=1, count=1, prune_num=0.3),
    "wus": dict(std_window=2),
    "wus_lr": dict(std_window=2),
    "infobatch": dict(delta=1.0),  # epoch 1 has no candidate (equal scores); epoch 2 prunes, weighted
    "infobatch_unweighted": dict(delta=1.0),
}
# (train.compile, train.amp) of the throughput table; the last on CUDA only (on a CPU it is the compiled bf16 row)
THROUGHPUT_SETTINGS = ((False, "off"), (False, "bf16"), (True, "off"), (True, "bf16"), ("reduce-overhead", "bf16"))
SECTIONS = ("tests", "throughput", "methods", "concurrency", "profile", "tuning", "skip")
DEFAULT_SECTIONS = SECTIONS[:4]  # profile, tuning and skip on request: they explain a rate rather than check one
TESTS_TIMEOUT_S = 480  # the cuda tests, so that a hung test leaves time for the report
CUDA_TESTS = "tests/test_gpu.py"
WAIT_S = 300  # the longest a concurrency worker waits for the others, or the parent for a worker
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
PAYS_WITHIN = 0.95  # the smallest N whose aggregate throughput is within 5% of the best


@dataclass(frozen=True)
class Sizes:
    batch: int
    batches: int  # per epoch
    timed_epochs: int
    method_samples: int
    processes: tuple[int, ...]


FULL = Sizes(batch=128, batches=50, timed_epochs=3, method_samples=4096, processes=(1, 2, 4, 8))
QUICK = Sizes(batch=32, batches=2, timed_epochs=2, method_samples=80, processes=(1, 2))


def synthetic_split(n: int, seed: int) -> Split:
    """Random images whose mean colour carries the label (as tests/conftest.py's): learnable, no download."""
    generator = torch.Generator().manual_seed(seed)
    palette = torch.randint(0, 256, (10, 3), generator=torch.Generator().manual_seed(12345))
    labels = torch.randint(0, 10, (n,), generator=generator)
    noise = 40 * torch.randn(n, 32, 32, 3, generator=generator)
    images = (palette[labels][:, None, None, :] + noise).clamp(0, 255).to(torch.uint8)
    return Split(images=images.numpy(), labels=labels.numpy(), classes=[f"c{i}" for i in range(10)])


def config(
    model: str, device: str, compile: bool | str, amp: str, batch: int, epochs: int = 1, method: str = "baseline"
) -> RunConfig:
    """The DFP recipe's optimizer and augmentation (SGD with momentum, crop and flip), at a constant lr."""
    recipe = Recipe(epochs=epochs, batch_size=batch, lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=False,
                    schedule="multistep", augment=True)  # fmt: skip
    return RunConfig(study="gpu_check", dataset="cifar10", model=model, method=method, seed=0, recipe=recipe,
                     method_args=METHOD_KNOBS.get(method, {}), device=device, amp=amp, compile=compile)  # fmt: skip


def runs_config(model: str, device: torch.device, batch: int) -> RunConfig:
    """The GPU runs' setting on `device`: compiled on CUDA (eager on a CPU, where compiling costs more than it
    tells), the device's default autocast."""
    return config(model, str(device), device.type == "cuda", "auto", batch)


@dataclass(frozen=True)
class Rate:
    """A steady-state training rate, and the graphs inductor was asked to run as CUDA graphs but ran without."""

    images_per_s: float
    first_epoch_s: float  # the untimed first epoch: compiling, allocating
    graphs_skipped: int  # on a CPU every such graph (none outside reduce-overhead); on CUDA, see `skip_reasons`
    skip_reasons: tuple[str, ...]  # inductor's own words, on CUDA


def dynamo_counters() -> dict:
    """torch._dynamo's counters, imported on first use: dynamo takes seconds to import, and gpu_session's commands
    that train nothing (--collect, a detached session's start) never need it."""
    from torch._dynamo.utils import counters

    return counters


class GraphSkips(logging.Handler):
    """While entered, counts the graphs inductor runs without CUDA graphs though asked for them, and keeps the
    reasons it logs (on CUDA; a CPU has no CUDA graphs, so there it skips each one without a word)."""

    LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"  # the `cudagraphs` log artifact

    def __enter__(self) -> "GraphSkips":
        self.before, self.count, self.reasons = dynamo_counters()["inductor"]["cudagraph_skips"], 0, []
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage())

    def __exit__(self, *exc: object) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)
        self.count = dynamo_counters()["inductor"]["cudagraph_skips"] - self.before


def steady_rate(cfg: RunConfig, sizes: Sizes, variant: "Variant | None" = None, t: "Training | None" = None) -> Rate:
    """cfg's training loop in steady state (changed by `variant` if given): images per second, the median of the
    timed epochs after an untimed first one. `t`: a run prepared with cfg already (the baseline's, if not given)."""
    variant = variant or Variant("as configured")
    cfg = variant.config(cfg)
    with GraphSkips() as skips:
        t = t or prepare(cfg, synthetic_split(cfg.recipe.batch_size * sizes.batches, seed=1),
                         synthetic_split(sizes.batch, seed=2), Method())  # fmt: skip
        first = train_epoch(t, 1, cfg.recipe.lr)["epoch_train_s"]
        rows = [train_epoch(t, epoch, cfg.recipe.lr) for epoch in range(2, 2 + sizes.timed_epochs)]
    rate = statistics.median(row["trained_samples"] / row["epoch_train_s"] for row in rows)
    return Rate(rate, first, skips.count, tuple(dict.fromkeys(skips.reasons)))


def skipped(rate: Rate, device: torch.device) -> str:
    """What the report says of graphs that ran without CUDA graphs: nothing where none did."""
    if not rate.graphs_skipped:
        return ""
    why = "; ".join(rate.skip_reasons) or ("a CPU has no CUDA graphs" if device.type != "cuda" else "no reason logged")
    graphs = f"{rate.graphs_skipped} graph{'s' if rate.graphs_skipped > 1 else ''}"
    return f"  ({graphs} without CUDA graphs: {why})"


@dataclass(frozen=True)
class Variant:
    """A change to the GPU runs' setting, measured here: train settings the trainer takes, or a larger batch."""

    name: str
    compile: bool | str | None = None  # train.compile; None: the runs' own (compiled on CUDA, default mode)
    cudnn_benchmark: bool = False  # train.cudnn_benchmark
    fused_sgd: bool = False  # train.fused_sgd
    batch_factor: int = 1  # a larger batch than the recipe's: how far one run is from filling the device

    def config(self, cfg: RunConfig) -> RunConfig:
        """The run's setting under this variant (the batch is the caller's)."""
        return replace(cfg, compile=cfg.compile if self.compile is None else self.compile,
                       cudnn_benchmark=self.cudnn_benchmark, fused_sgd=self.fused_sgd)  # fmt: skip


VARIANTS = (
    Variant("as the runs"),
    Variant("fused SGD", fused_sgd=True),
    Variant("cudnn.benchmark", cudnn_benchmark=True),
    Variant("max-autotune", compile="max-autotune-no-cudagraphs"),
    Variant("CUDA graphs", compile="reduce-overhead"),  # on a CPU: compiled, without graphs
    Variant("CUDA graphs, fused SGD", compile="reduce-overhead", fused_sgd=True),
    Variant("graphs, fused, benchmark", compile="reduce-overhead", fused_sgd=True, cudnn_benchmark=True),
    Variant("batch x4", batch_factor=4),
)
CUDA_ONLY = ("max-autotune", "cudnn.benchmark")  # autotuning a CPU's kernels takes minutes; a CPU has no cuDNN


class Report:
    """Prints, and appends what it printed to gpu_check.txt; writes the CSV files and the failures' tracebacks. Each
    command's lines and tracebacks follow a header line of their own: docs/gpu.md runs the sections as separate
    commands into one folder, so an earlier command's output stays."""

    def __init__(self, out: Path) -> None:
        self.out, self.log = out, out / "gpu_check.txt"
        self.header = f"== {datetime.now().astimezone().isoformat(timespec='seconds')} {shlex.join(sys.argv)}"
        self.failures = 0
        self.say(self.header)

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        with open(self.log, "a") as f:
            f.write(line + "\n")

    def write(self, name: str, rows: list[dict[str, Any]]) -> None:
        """(Re)write the table `name`: called after every row, so that a check stopped midway keeps its rows."""
        if not rows:
            return
        fields = list(dict.fromkeys(key for row in rows for key in row))  # a failed row adds "error"
        with open(self.out / name, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    def written(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Say where the section's table is (each row was written as it came)."""
        self.say(f"-> {self.out / name}" if rows else f"-> nothing to write to {name}")

    def failed(self, what: str, error: BaseException) -> str:
        """Count the failure, append its traceback to errors.log; return its one-line summary."""
        self.failures += 1
        with open(self.out / "errors.log", "a") as f:
            if self.failures == 1:  # the command's header, once, above its first traceback
                f.write(f"{self.header}\n")
            f.write(f"== {what}\n{''.join(traceback.format_exception(error))}\n")
        first_line = next(iter(str(error).strip().splitlines()), "")
        return f"FAILED: {f'{type(error).__name__}: {first_line}'[:160]} (-> {self.out / 'errors.log'})"


def cuda_tests(report: Report, device: torch.device, select: str | None = None, tests: str = CUDA_TESTS) -> bool:
    """Run the `cuda` tests (those `select` names, as pytest's -k); False only when they ran and failed. Each test's
    result goes to cuda_tests.log as it ends, so that a command stopped midway (a lease's limit) keeps them."""
    if device.type != "cuda":
        report.say("cuda tests: skipped (the device is not CUDA)")
        return True
    if importlib.util.find_spec("pytest") is None:
        report.say("cuda tests: skipped: pytest is not installed (pip install pytest)")
        return True
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-v", "-p", "no:cacheprovider", tests]
    command += ["-k", select] if select else []
    paths = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))  # uninstalled, too
    env = os.environ | {"PYTHONPATH": paths, "PYTHONUNBUFFERED": "1"}  # each line to the log as pytest prints it
    log = report.out / "cuda_tests.log"
    report.say(f"cuda tests: {' '.join(command[1:])} -> {log} (each test as it ends)")
    with open(log, "w") as output:
        try:
            done = subprocess.run(command, cwd=REPO, stdout=output, stderr=subprocess.STDOUT, env=env,
                                  timeout=TESTS_TIMEOUT_S)  # fmt: skip
        except subprocess.TimeoutExpired:
            report.say(f"cuda tests: FAILED: still running after {TESTS_TIMEOUT_S} s -> {log}")
            return False
    summary = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
    report.say(f"cuda tests: {summary} -> {log}")
    return done.returncode == 0


def throughput(report: Report, device: torch.device, models: list[str], sizes: Sizes) -> None:
    report.say(f"training images/s at batch {sizes.batch} (median of {sizes.timed_epochs} epochs of {sizes.batches} "
               "batches after one untimed; first = seconds of that first epoch, compiling included)")  # fmt: skip
    report.say(f"{'model':10} {'setting':16} {'images/s':>10} {'first s':>8}")
    rows = []
    for model in models:
        for compile, amp in THROUGHPUT_SETTINGS[: None if device.type == "cuda" else 4]:
            torch._dynamo.reset()  # each compiled setting starts empty, far from the recompile limit
            kind = {False: "eager", True: "compiled"}.get(compile, "CUDA graphs")
            setting = f"{kind} {'bf16' if amp == 'bf16' else 'fp32'}"
            row = {"model": model, "compile": compile, "amp": "bf16" if amp == "bf16" else "fp32",
                   "batch": sizes.batch, "images_per_s": "", "first_epoch_s": "", "graphs_skipped": "",
                   "device": device_name(device)}  # fmt: skip
            try:
                rate = steady_rate(config(model, str(device), compile, amp, sizes.batch), sizes)
            except Exception as error:  # the next settings still run; the table says which failed
                row["error"] = report.failed(f"throughput: {model} {setting}", error)
                report.say(f"{model:10} {setting:16} {row['error']}")
            else:
                row |= {"images_per_s": round(rate.images_per_s, 1), "first_epoch_s": round(rate.first_epoch_s, 2),
                        "graphs_skipped": rate.graphs_skipped}  # fmt: skip
                report.say(f"{model:10} {setting:16} {rate.images_per_s:10.0f} {rate.first_epoch_s:8.1f}"
                           f"{skipped(rate, device)}")  # fmt: skip
            rows.append(row)
            report.write("throughput.csv", rows)
    report.written("throughput.csv", rows)


def profile(report: Report, device: torch.device, models: list[str], sizes: Sizes) -> None:
    """Where a step's time goes, in the GPU runs' setting (compiled, the device's default autocast; eager on a CPU):
    one steady-state epoch under torch.profiler, after an untimed one. The device's busy share is its kernels' time
    over the epoch's: well below 1, the device waits on the host (launches, Python), and concurrent runs or fewer
    launches pay; near 1, the kernels themselves are the cost."""
    report.say(f"one {'compiled' if device.type == 'cuda' else 'eager'} epoch of {sizes.batches} batches of "
               f"{sizes.batch} under torch.profiler (the profiler's own cost included)")  # fmt: skip
    report.say(f"{'model':10} {'images/s':>10} {'busy':>6} {'kernels/batch':>14}")
    rows, tables = [], []
    for model in models:
        torch._dynamo.reset()
        cfg = runs_config(model, device, sizes.batch)
        row: dict[str, Any] = {"model": model, "compile": cfg.compile, "batch": sizes.batch, "images_per_s": "",
                               "device_busy_share": "", "kernels_per_batch": "",
                               "device": device_name(device)}  # fmt: skip
        try:
            t = prepare(cfg, synthetic_split(sizes.batch * sizes.batches, seed=1), synthetic_split(8, seed=2), Method())
            train_epoch(t, 1, cfg.recipe.lr)
            figures, top = profiled_epoch(t, 2, sizes)
        except Exception as error:  # the next model still runs
            row["error"] = report.failed(f"profile: {model}", error)
            report.say(f"{model:10} {row['error']}")
        else:
            row |= figures
            report.say(f"{model:10} {row['images_per_s']:10.0f} {row['device_busy_share']!s:>6} "
                       f"{row['kernels_per_batch']!s:>14}")  # fmt: skip
            tables += [f"== {model}, by {sort_by}\n{table}\n" for sort_by, table in top.items()]
            (report.out / "profile.txt").write_text("\n".join(tables))
        rows.append(row)
        report.write("profile.csv", rows)
    report.written("profile.csv", rows)
    if tables:
        report.say(f"-> {report.out / 'profile.txt'} (the top ops of each model)")


def profiled_epoch(t: Training, epoch: int, sizes: Sizes) -> tuple[dict[str, Any], dict[str, str]]:
    """One epoch of `t` under torch.profiler: its images/s, the device's busy share and kernels per batch (empty on
    a CPU), and the top 25 ops by device time (where there are kernels) and by host time."""
    device = t.train_data.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as profiled:
        row = train_epoch(t, epoch, t.cfg.recipe.lr)
    averages = profiled.key_averages()
    kernels = [e for e in profiled.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    figures: dict[str, Any] = {"images_per_s": round(row["trained_samples"] / row["epoch_train_s"], 1),
                               "device_busy_share": "", "kernels_per_batch": ""}  # fmt: skip
    if kernels:
        busy = sum(e.self_device_time_total for e in kernels) / 1e6 / row["epoch_train_s"]  # us -> s
        figures |= {"device_busy_share": round(busy, 3), "kernels_per_batch": round(len(kernels) / sizes.batches)}
    orders = (["self_device_time_total"] if kernels else []) + ["self_cpu_time_total"]
    return figures, {order: averages.table(sort_by=order, row_limit=25) for order in orders}


class SkipFromTheStart(WeightUpdateSkipping):
    """WUS held in its skip phase from the first epoch: the last layer's bias trains, every other parameter is
    frozen."""

    def on_epoch_start(self, epoch: int, lr: float) -> None:
        self.set_phase(SKIP)


SKIP_SETTING = Variant("graphs, fused, benchmark", compile="reduce-overhead", fused_sgd=True, cudnn_benchmark=True)


def skip(report: Report, device: torch.device, models: list[str], sizes: Sizes) -> None:
    """A WUS skip step against a normal step, each phase in steady state, then one epoch of it under the profiler."""
    variant = SKIP_SETTING if device.type == "cuda" else Variant("eager", compile=False)  # a CPU's graphs: minutes
    report.say(f"WUS's skip phase against the normal one, {variant.name}, batch {sizes.batch}, no augmentation: "
               "images/s in steady state, then one epoch under torch.profiler")  # fmt: skip
    report.say(f"{'model':10} {'phase':7} {'images/s':>10} {'x normal':>9} {'busy':>6} {'kernels/batch':>14}")
    rows, tables = [], []
    for model in models:
        normal = None
        for phase, method in (("normal", Method()), ("skip", SkipFromTheStart())):  # `wus`'s defaults
            torch._dynamo.reset()
            row: dict[str, Any] = {"model": model, "phase": phase, "setting": variant.name, "batch": sizes.batch,
                                   "images_per_s": "", "vs_normal": "", "graphs_skipped": "",
                                   "device_busy_share": "", "kernels_per_batch": "",
                                   "device": device_name(device)}  # fmt: skip
            try:
                cfg = variant.config(runs_config(model, device, sizes.batch))
                cfg = replace(cfg, recipe=replace(cfg.recipe, augment=False))  # the WUS recipe's
                t = prepare(cfg, synthetic_split(sizes.batch * sizes.batches, seed=1), synthetic_split(8, seed=2),
                            method)  # fmt: skip
                rate = steady_rate(cfg, sizes, t=t)
                figures, top = profiled_epoch(t, 2 + sizes.timed_epochs, sizes)
            except Exception as error:  # the next phase still runs
                row["error"] = report.failed(f"skip: {model} {phase}", error)
                report.say(f"{model:10} {phase:7} {row['error']}")
            else:
                normal = rate.images_per_s if phase == "normal" else normal
                ratio = round(rate.images_per_s / normal, 2) if normal else ""  # none where the normal phase failed
                row |= {"images_per_s": round(rate.images_per_s, 1), "vs_normal": ratio,
                        "graphs_skipped": rate.graphs_skipped, "device_busy_share": figures["device_busy_share"],
                        "kernels_per_batch": figures["kernels_per_batch"]}  # fmt: skip
                busy, kernels = row["device_busy_share"], row["kernels_per_batch"]
                report.say(f"{model:10} {phase:7} {rate.images_per_s:10.0f} {ratio!s:>9} {busy!s:>6} {kernels!s:>14}"
                           f"{skipped(rate, device)}")  # fmt: skip
                tables += [f"== {model} {phase}, by {sort_by}\n{table}\n" for sort_by, table in top.items()]
                (report.out / "skip.txt").write_text("\n".join(tables))
            rows.append(row)
            report.write("skip.csv", rows)
    report.written("skip.csv", rows)


def tuning(report: Report, device: torch.device, models: list[str], sizes: Sizes) -> None:
    """Images per second of the runs' setting (compiled on CUDA, the device's default autocast) and of each variant
    of it, in steady state as `throughput` measures, each against the runs' setting."""
    report.say(f"variants of the runs' step ({'compiled' if device.type == 'cuda' else 'eager'}, default autocast), "
               f"batch {sizes.batch} unless said: images/s and against the runs' setting")  # fmt: skip
    report.say(f"{'model':10} {'variant':24} {'images/s':>10} {'x runs':>7} {'first s':>8}")
    rows = []
    for model in models:
        base = None
        for variant in VARIANTS:
            torch._dynamo.reset()
            batch = sizes.batch * variant.batch_factor
            row: dict[str, Any] = {"model": model, "variant": variant.name, "batch": batch, "images_per_s": "",
                                   "vs_runs": "", "first_epoch_s": "", "graphs_skipped": "",
                                   "device": device_name(device)}  # fmt: skip
            if device.type != "cuda" and variant.name in CUDA_ONLY:
                report.say(f"{model:10} {variant.name:24} skipped: CUDA only")
                continue
            try:
                rate = steady_rate(runs_config(model, device, batch), sizes, variant)
            except Exception as error:  # the next variants still run
                row["error"] = report.failed(f"tuning: {model} {variant.name}", error)
                report.say(f"{model:10} {variant.name:24} {row['error']}")
            else:
                if variant == VARIANTS[0]:  # the runs' own setting
                    base = rate.images_per_s
                ratio = round(rate.images_per_s / base, 2) if base else ""  # none where the runs' setting failed
                row |= {"images_per_s": round(rate.images_per_s, 1), "vs_runs": ratio, "first_epoch_s":
                        round(rate.first_epoch_s, 2), "graphs_skipped": rate.graphs_skipped}  # fmt: skip
                report.say(f"{model:10} {variant.name:24} {rate.images_per_s:10.0f} {ratio!s:>7} "
                           f"{rate.first_epoch_s:8.1f}{skipped(rate, device)}")  # fmt: skip
            rows.append(row)
            report.write("tuning.csv", rows)
    report.written("tuning.csv", rows)


def methods(report: Report, device: torch.device, sizes: Sizes) -> None:
    """Every registered method, 2 epochs, eager then compiled (the graphs: compiled in this run so far)."""
    train, test = synthetic_split(sizes.method_samples, seed=1), synthetic_split(sizes.method_samples // 4, seed=2)
    report.say(f"every method, 2 epochs of LeNet on {len(train.labels)} samples, batch {sizes.batch}")
    report.say(f"{'method':14} {'setting':9} epoch samples pruned phase  loss   acc  train s graphs")
    rows = []
    for compile in (False, True):
        torch._dynamo.reset()
        for name in METHODS:
            graphs_before = dynamo_counters()["stats"]["unique_graphs"]
            setting = "compiled" if compile else "eager"
            cfg = config("lenet", str(device), compile, "auto", sizes.batch, epochs=2, method=name)
            try:
                for epoch in fit(cfg, train, test, create_method(name, cfg.method_args)):
                    graphs = dynamo_counters()["stats"]["unique_graphs"] - graphs_before  # compiled in this run, so far
                    row = {"method": name, "compile": compile, "batch": sizes.batch, "epoch": epoch["epoch"],
                           "samples": epoch["trained_samples"], "pruned": epoch.get("pruned_samples", 0),
                           "phase": epoch.get("phase", ""), "train_loss": round(epoch["train_loss"], 4),
                           "test_acc": epoch["test_acc"], "epoch_train_s": round(epoch["epoch_train_s"], 3),
                           "graphs": graphs if compile else "", "device": device_name(device)}  # fmt: skip
                    rows.append(row)
                    report.write("methods.csv", rows)
                    report.say(f"{name:14} {setting:9} {row['epoch']:5} {row['samples']:7} {row['pruned']:6} "
                               f"{row['phase']!s:5} {row['train_loss']:6.3f} {row['test_acc']:5.1f} "
                               f"{row['epoch_train_s']:8.3f} {row['graphs']!s:>6}")  # fmt: skip
            except Exception as error:  # the next methods still run
                failure = report.failed(f"methods: {name} {setting}", error)
                rows.append({"method": name, "compile": compile, "batch": sizes.batch, "device": device_name(device),
                             "error": failure})  # fmt: skip
                report.write("methods.csv", rows)
                report.say(f"{name:14} {setting:9} {failure}")
    report.written("methods.csv", rows)


def worker(model: str, device: str, sizes: Sizes, threads: int, barrier: Any, results: Any) -> None:
    """One of N training processes: warm up, wait for the others, train the timed epochs, report."""
    try:
        torch.set_num_threads(threads)
        train = synthetic_split(sizes.batch * sizes.batches, seed=1)
        cfg = config(model, device, False, "auto", sizes.batch)
        t = prepare(cfg, train, synthetic_split(sizes.batch, seed=2), Method())
        train_epoch(t, 1, cfg.recipe.lr)
        barrier.wait(timeout=WAIT_S)
        start = time.monotonic()  # one clock for all processes (CLOCK_MONOTONIC)
        samples = sum(train_epoch(t, e, cfg.recipe.lr)["trained_samples"] for e in range(2, 2 + sizes.timed_epochs))
        results.put({"samples": samples, "start": start, "end": time.monotonic()})
    except BaseException:
        barrier.abort()  # the others stop waiting
        results.put({"error": traceback.format_exc()})


def aggregate_rate(model: str, device: torch.device, sizes: Sizes, n: int, threads: int) -> float:
    """Training images per second of `n` processes at once, each with `threads` CPU threads, from the first start to
    the last end."""
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    barrier, results = context.Barrier(n), context.Queue()
    processes = [context.Process(target=worker, args=(model, str(device), sizes, threads, barrier, results))
                 for _ in range(n)]  # fmt: skip
    for process in processes:
        process.start()
    try:
        reports = [results.get(timeout=WAIT_S) for _ in processes]
    except queue.Empty:
        reports = [{"error": f"no result within {WAIT_S} s (a process died or hung)"}]
    for process in processes:
        process.join(timeout=WAIT_S)
        if process.is_alive():
            process.terminate()
    if errors := [r["error"] for r in reports if "error" in r]:
        raise RuntimeError(f"a training process of {model} (N = {n}) failed:\n{errors[0]}")
    span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    return sum(r["samples"] for r in reports) / span


def concurrency(report: Report, device: torch.device, models: list[str], sizes: Sizes, threads: int | None) -> None:
    report.say(f"N training processes at once on {device_name(device)}: aggregate images/s (batch {sizes.batch}, "
               "eager, the device's default autocast)")  # fmt: skip
    rows = []
    per_process = {n: threads or max(1, CORES // n) for n in sizes.processes}  # CPU threads of each process
    for model in models:
        try:
            rates = {n: aggregate_rate(model, device, sizes, n, per_process[n]) for n in sizes.processes}
        except Exception as error:  # the next model still runs
            report.say(f"{model}: {report.failed(f'concurrency: {model}', error)}")
            continue
        pays = min(n for n, rate in rates.items() if rate >= PAYS_WITHIN * max(rates.values()))
        for n, rate in rates.items():
            rows.append({"model": model, "processes": n, "batch": sizes.batch, "threads": per_process[n],
                         "images_per_s": round(rate, 1), "vs_one_process": round(rate / rates[1], 2),
                         "pays": n == pays, "device": device_name(device)})  # fmt: skip
        report.write("concurrency.csv", rows)
        line = ", ".join(f"N = {n}: {rate:.0f} ({rate / rates[1]:.2f}x)" for n, rate in rates.items())
        report.say(f"{model}: {line}")
        report.say(f"{model}: N = {pays} pays ({rates[pays] / rates[1]:.2f}x the images/s of one process)")
    report.written("concurrency.csv", rows)


def checked_device(parser: argparse.ArgumentParser, text: str, hint: str = "") -> torch.device:
    """`--device`'s value as a device; a usage error where it names none, or CUDA that this machine lacks (`hint`:
    what to do instead)."""
    try:
        device = torch.device(text)
    except RuntimeError:
        parser.error(f"--device {text}: not a device name (accepted: cuda, cuda:N, cpu)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {text}: CUDA is not available here{hint}")
    return device


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="folder for the CSV files and the log (created)")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, LeNet only: checks this script")
    parser.add_argument("--models", nargs="+", choices=MODELS,
                        help="of throughput (all), profile, tuning and skip (resnet18); --quick: lenet")  # fmt: skip
    parser.add_argument("--threads", type=positive_int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(DEFAULT_SECTIONS),
                        help="the parts to run (default: all but profile, tuning and skip)")  # fmt: skip
    parser.add_argument("--tests-k", metavar="EXPR",
                        help="of the cuda tests, those pytest's -k EXPR selects (e.g. infobatch)")  # fmt: skip
    args = parser.parse_args()
    device = checked_device(parser, args.device, " (--device cpu --quick checks the script)")
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    models = args.models or (["lenet"] if args.quick else list(MODELS))
    focus = args.models or (["lenet"] if args.quick else [FOCUS_MODEL])
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    report.say(f"gpu_check on {device_name(device)}: torch {torch.__version__}, CUDA {torch.version.cuda}")
    started = time.perf_counter()
    passed = cuda_tests(report, device, args.tests_k) if "tests" in args.sections else True
    sections = {
        "throughput": lambda: throughput(report, device, models, sizes),
        "methods": lambda: methods(report, device, sizes),
        "concurrency": lambda: concurrency(
            report, device, [m for m in SMALL_MODELS if m in models] or ["lenet"], sizes, args.threads
        ),
        "profile": lambda: profile(report, device, focus, sizes),
        "tuning": lambda: tuning(report, device, focus, sizes),
        "skip": lambda: skip(report, device, focus, sizes),
    }
    for name, section in sections.items():
        if name in args.sections:
            report.say(f"({time.perf_counter() - started:.0f} s so far)")
            report.say()
            section()
    report.say(f"({time.perf_counter() - started:.0f} s in all)")
    if report.failures:
        report.say(f"{report.failures} failed: their tracebacks are in {report.out / 'errors.log'}")
    sys.exit(0 if passed and not report.failures else 1)


if __name__ == "__main__":
    main()
