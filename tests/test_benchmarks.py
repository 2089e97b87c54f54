"""The benchmark scripts: they run on the training code as it is, and bad input is a usage error, not a traceback."""

import importlib.util
import json
import math
import re
import statistics
import subprocess
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch

from cheaptrain.aggregate import T975, t_quantile
from cheaptrain.prepare import write_prepared

from conftest import run_script, synthetic_split, write_run

REPO = Path(__file__).resolve().parents[1]


def benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args], capture_output=True, text=True, cwd=REPO
    )


def benchmark_here(monkeypatch: pytest.MonkeyPatch, script: str, *args: str) -> subprocess.CompletedProcess:
    """`benchmark`, in this process (`run_script`): seconds sooner where the script imports torch."""
    monkeypatch.chdir(REPO)
    # glibc's malloc setting, for the whole process: pytest's here
    monkeypatch.setattr("cheaptrain.runner.keep_freed_memory", lambda: None)
    return run_script(REPO / "benchmarks" / f"{script}.py", *args)


def load_benchmark(script: str):
    """A benchmark script as a module, to call its functions (its folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{script}_benchmark", REPO / "benchmarks" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare_tiny(folder: Path, train_size: int | None = None) -> Path:
    """A prepared CIFAR-10 of 64 training and 32 test images (`train_size`: as the quick setting's subset says)."""
    train, test = synthetic_split(64, seed=1), synthetic_split(32, seed=2)
    splits = {"train": (train.images, train.labels), "test": (test.images, test.labels)}
    extra = {"train_subset": {"train_size": train_size}} if train_size else {}
    write_prepared(folder, splits, train.classes, extra)
    return folder


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> str:
    return str(prepare_tiny(tmp_path_factory.mktemp("prepared") / "cifar10"))


@pytest.mark.parametrize(
    "script",
    ["loader", "malloc", "dfp", "wus", "noise", "checkpoint", "guards", "shapes", "clock", "wus_gain", "looks"],
)
def test_a_benchmark_given_no_repeats_says_so_instead_of_a_traceback(monkeypatch, script):
    options = {
        "malloc": "--rounds",
        "wus": "--batches",
        "noise": "--threads",
        "shapes": "--epochs",
        "clock": "--min-seeds",
        "wus_gain": "--min-seeds",
        "looks": "--looks",
    }
    option = options.get(script, "--repeats")
    # malloc's in a process of its own, as a user runs it (it imports no torch: a fraction of a second); the others
    # parse the same way here, without starting Python and importing torch again
    run = benchmark if script == "malloc" else partial(benchmark_here, monkeypatch)
    result = run(script, *(["dfp/cifar10/lenet/dfp"] if script == "looks" else []), option, "0")
    assert result.returncode == 2, result.stderr
    assert f"argument {option}: '0' is not accepted: an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_wus_benchmark_times_every_phase_and_prices_the_ledgers_schedules_at_it(tmp_path):
    """The phases through the training loop; then each WUS configuration of the ledger on the model, its skip share
    (here 3 and 2 skip epochs of 4: 62.5% over two seeds) times 1 - skip/normal as just measured; the same share at
    its runs' own skip/full epoch time (0.4: 37.5), which meets the time they saved where they trained."""
    for seed, skips in ((0, 3), (1, 2)):
        history = [{"epoch": e, "test_acc": 50.0, "epoch_train_s": 1.0 if e <= 4 - skips else 0.4,
                    "trained_samples": 100, "train_flops": 300 if e <= 4 - skips else 100,
                    "phase": int(e > 4 - skips)} for e in range(1, 5)]  # fmt: skip
        metrics = {"final_acc": 50.0, "best_acc": 50.0, "best3_acc": 50.0, "train_time_s": 3.0,
                   "total_trained_samples": 400, "epochs": 4, "skip_epochs": skips}  # fmt: skip
        config = {"study": "wus", "dataset": "cifar10", "model": "lenet", "method": "wus", "seed": seed}
        write_run(tmp_path, "wus", f"cifar10-lenet-wus-s{seed}", history, metrics, config)
    result = benchmark("wus", "--models", "lenet", "--batches", "2", "--ledger", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header, row = (line.split() for line in lines[1:3])
    assert header[:5] == ["model", "batches", "normal", "skip", "forward"]
    assert row[:2] == ["lenet", "2"]
    assert all(float(ms) > 0 for ms in row[2:5])
    assert lines[5].split()[5:9] == ["here", "there", "skip/full", "measured"]
    model, method, seeds, share, here, there, ratio, measured = lines[6].split()[:8]
    assert (model, method, seeds, share) == ("lenet", "wus", "2", "62.5")
    assert float(here) == pytest.approx(62.5 * (1 - float(row[5])), abs=0.6)  # skip/normal as printed, 2 decimals
    assert (there, ratio, measured) == ("37.5", "0.40", "37.5")
    (tmp_path / "empty").mkdir()
    empty = benchmark("wus", "--models", "lenet", "--batches", "1", "--ledger", str(tmp_path / "empty"))
    assert "no WUS entries of lenet in" in empty.stdout


def test_the_checkpoint_benchmark_times_epochs_without_a_checkpoint_and_with_one_each_way():
    result = benchmark("checkpoint", "--model", "lenet", "--epoch-s", "0.05", "--epochs", "2", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    title, *ways, ratio = result.stdout.splitlines()
    assert title.startswith("lenet: a ") and "checkpoint after each epoch of about 0.05 s" in title
    assert re.search(rf", torch {re.escape(torch.__version__)}, \d+ threads$", title), title
    assert [line.split()[0] for line in ways] == ["none", "in", "behind"]
    assert ways[0].endswith("+0.0% on an epoch without") and ratio.startswith("behind / in line: ")


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("dfp", ["--model", "nope"], "model 'nope': unknown"),
        ("dfp", ["--fraction", "1.5"], "--fraction 1.5: a pruning epoch leaves out a fraction in (0, 1)"),
        ("dfp", ["--device", "foo"], "--device foo: not a device name"),
        pytest.param(
            "dfp", ["--device", "cuda"], "--device cuda: CUDA is not available here",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA"),
        ),
        ("loader", ["--model", "nope"], "model 'nope': unknown"),
        ("wus", ["--models", "nope"], "model 'nope': unknown"),
        ("shapes", ["--device", "foo"], "--device foo: not a device name"),
        ("checkpoint", ["--epochs", "1"], "--epochs 1: at least 2"),
    ],
)  # fmt: skip
def test_bad_input_to_a_benchmark_is_an_error_line_and_status_2_not_a_traceback(
    monkeypatch, tiny_data, script, args, message
):
    data = ["--data", tiny_data] if script in ("dfp", "loader") else []  # past the data check, to the bad input
    # wus's in a process of its own, as a user runs it: run_main's error line and exit status (wus imports the least
    # of those that reach it); the others here, without starting Python and importing torch again
    run = benchmark if script == "wus" else partial(benchmark_here, monkeypatch)
    result = run(script, *data, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_the_guards_benchmark_names_the_exit_status_of_a_process_that_died_without_a_word(monkeypatch):
    guards = load_benchmark("guards")
    killed = subprocess.CompletedProcess([], returncode=-9, stdout="", stderr="")  # as the OOM killer leaves it
    monkeypatch.setattr(guards.subprocess, "run", lambda *args, **kwargs: killed)
    monkeypatch.setattr(sys, "argv", ["guards.py", "--repeats", "1"])
    with pytest.raises(SystemExit, match=r"^every tensor checked: the process exited with status -9$"):
        guards.main()


@pytest.mark.parametrize(
    ("script", "args"), [("malloc", ["--rounds", "1", "--epochs", "1"]), ("loader", ["--repeats", "1"])]
)
def test_malloc_and_loader_benchmarks_state_the_torch_version_and_thread_count(tiny_data, script, args):
    result = benchmark(script, "--data", tiny_data, *args)
    assert result.returncode == 0, result.stderr
    stated = re.search(rf"torch {re.escape(torch.__version__)}, (\d+) (threads?), ", result.stdout)
    assert stated, result.stdout
    assert stated[2] == ("thread" if stated[1] == "1" else "threads"), stated[0]


def test_the_loader_benchmarks_bare_model_trains_on_the_batches_of_the_training_loop(tiny_data):
    """Its split of this loop's overhead (making the batches, the rest) holds only if the bare loops, batches made
    beforehand or in the loop, see the very inputs train_epoch trains on: images, layout and labels."""
    loader = load_benchmark("loader")
    from cheaptrain.config import load_params, resolve_run
    from cheaptrain.data import load_split
    from cheaptrain.methods import Method
    from cheaptrain.trainer import prepare, train_epoch

    class Indices(Method):
        def on_batch_end(self, indices, losses):
            trained.append(indices)

    params = load_params(REPO / "params.yaml")
    cfg = replace(resolve_run(params, "dfp", "cifar10", "lenet", "baseline", 0), device="cpu")
    cfg = replace(cfg, recipe=replace(cfg.recipe, batch_size=24))  # 64 images: a shorter last batch too
    splits = [load_split(Path(tiny_data), s) for s in ("train", "test")]
    t, inputs, trained = prepare(cfg, *splits, Indices()), [], []
    t.model.register_forward_pre_hook(lambda module, args: inputs.append(args[0].clone()))
    train_epoch(t, 1, cfg.recipe.lr)
    loop = [(x, t.train_data.labels[i]) for x, i in zip(inputs, trained, strict=True)]
    assert [len(y) for _, y in loop] == [24, 24, 16]
    for made in (loader.epoch_batches, lambda t: list(loader.batches_in_loop(t))):
        batches = made(prepare(cfg, *splits, Method()))
        assert len(batches) == len(loop)
        for (x0, y0), (x1, y1) in zip(loop, batches, strict=True):
            assert torch.equal(x0, x1) and torch.equal(y0, y1)
            assert x0.stride() == x1.stride()  # the same memory layout: channels_last as the recipe asks


@pytest.mark.parametrize(("train_size", "prepared_again"), [(32, True), (None, False)])
def test_gpu_ledger_prepares_cifar10_again_unless_it_holds_every_training_image(tmp_path, train_size, prepared_again):
    """The quickstart's half would fail every run's check_prepared: gpu-ledger prepares the full set first."""
    prepare_tiny(tmp_path / "data/prepared/cifar10", train_size)
    (tmp_path / "src").symlink_to(REPO / "src")
    python = tmp_path / "python"  # runs the data check, and records the stages it is asked to run
    python.write_text(f'#!/bin/sh\ncase "$1" in -c) exec {sys.executable} "$@";; esac\necho "$1" >> stages.log\n')
    python.chmod(0o755)
    make = ["make", "-f", str(REPO / "Makefile"), "gpu-ledger", "STUDY=dfp", "MODEL=lenet", "METHODS=baseline"]
    done = subprocess.run([*make, f"PYTHON={python}"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    stages = (tmp_path / "stages.log").read_text().split()
    assert stages == ["stages/download.py"] * prepared_again + ["stages/train.py"]


def write_entry(root: Path, method: str, seed: int, history: list[dict[str, float]]) -> None:
    """A results-ledger entry of the DFP study's LeNet (the three files the train stage writes)."""
    metrics = {"final_acc": 60.0, "best_acc": 60.0, "best3_acc": 60.0, "epochs": len(history),
               "train_time_s": sum(r["epoch_train_s"] for r in history),
               "total_trained_samples": sum(r["trained_samples"] for r in history),
               "total_train_flops": sum(r["train_flops"] for r in history)}  # fmt: skip
    config = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": method, "seed": seed}
    write_run(root, "dfp", f"cifar10-lenet-{method}-s{seed}", history, metrics, config)


def test_the_clock_benchmark_prints_both_savings_with_both_clocks_over_the_seeds(monkeypatch, tmp_path):
    """InfoBatch's shape (pruned epochs at 0.8 of the work, full epochs last) on a machine at half speed until epoch
    30, its baseline hours earlier on a machine 1.5x slower still: with the wall clock the own saving is far below the
    17% of work saved and the paired one far above; the evaluation clock reads 17.0 for both. The same shape trained
    1.1x slower per evaluation second than its baseline (`random_prune`) is what the clock cannot see: its own saving
    stays 17.0, its paired one reads 100 - 83 x 1.1, and the ratio gap says +10.0."""
    for seed in range(3):
        for method, pruned, load, train_slower in (
            ("baseline", range(0), 1.5, 1.0),
            ("infobatch", range(2, 36), 1.0, 1.0),
            ("random_prune", range(2, 36), 1.0, 1.1),
        ):
            history = []
            for e in range(1, 41):
                work, machine = (0.8 if e in pruned else 1.0), (2.0 if e <= 30 else 1.0) * load * (1 + 0.01 * seed)
                history.append({"epoch": e, "test_acc": 50.0, "epoch_train_s": 5.0 * work * machine * train_slower,
                                "trained_samples": 50000 * work, "train_flops": 1e6 * work,
                                "eval_s": 0.5 * machine})  # fmt: skip
            write_entry(tmp_path, method, seed, history)
    result = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[2:]}
    assert list(rows) == ["dfp/cifar10/lenet/infobatch", "dfp/cifar10/lenet/random_prune"]  # method configurations
    seeds, paired, compute, own_wall, _, own_clock, own_sd, paired_wall, _, paired_clock, paired_sd, gap = rows[
        "dfp/cifar10/lenet/infobatch"
    ]
    assert (seeds, paired, compute) == ("3", "3", "17.0")
    assert float(own_wall) < 0 and float(paired_wall) > 40  # the slow machine's epochs priced as the method's
    assert (own_clock, own_sd, paired_clock, paired_sd, gap) == ("17.0", "0.0", "17.0", "0.0", "+0.0")
    *_, own_clock, own_sd, _, _, paired_clock, paired_sd, gap = rows["dfp/cifar10/lenet/random_prune"]
    assert (own_clock, own_sd, paired_clock, paired_sd, gap) == ("17.0", "0.0", "8.7", "0.0", "+10.0")
    short = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--min-seeds", "4")
    assert short.returncode == 2 and "no method configuration has 4 entries or more" in short.stderr
    missing = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no results ledger there" in missing.stderr
    by_seed = benchmark_here(
        monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/random_prune"
    )
    assert by_seed.returncode == 0, by_seed.stderr
    seeds = [line.split() for line in by_seed.stdout.splitlines()[2:]]
    assert [row[0] for row in seeds] == ["0", "1", "2", "mean", "sd"]
    _, full, _, own_clock, _, paired_clock, ours, theirs, gap = seeds[0]
    assert full == "5.50"  # a full epoch as measured: epochs 36-40, 5 s at full speed, 1.1x slower to train
    assert (own_clock, paired_clock, gap) == ("17.0", "8.7", "+10.0")  # the table's figures, for one seed
    assert float(ours) == pytest.approx(1.1 * float(theirs), abs=0.01)  # trains 1.1x longer per evaluation second
    _, full, _, own_clock, _, paired_clock, _, _, gap, *why = seeds[
        3
    ]  # the mean row: the table's, over the paired seeds
    assert (own_clock, paired_clock, gap, " ".join(why)) == ("17.0", "8.7", "+10.0", "over the 3 paired seeds")
    assert full == "5.55" and float(seeds[4][1]) > 0  # each seed's machine 1% slower than the last's: its seconds
    assert seeds[4][2:] == ["0.0", "0.0", "0.0", "0.0", "0.00", "0.00", "0.0"]  # but no ratio moves; unsigned
    for seed in range(3):  # a method that saves more work the higher its seed: the mean and sd are the seeds'
        history = [{"epoch": e, "test_acc": 50.0, "epoch_train_s": 5.0 * (1 - 0.1 * seed * (e % 2)),
                    "trained_samples": 50000.0, "train_flops": 1e6 * (1 - 0.1 * seed * (e % 2)),
                    "eval_s": 0.5} for e in range(1, 41)]  # fmt: skip
        write_entry(tmp_path, "dfp", seed, history)
    spread = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/dfp")
    rows = [line.split() for line in spread.stdout.splitlines()[2:]]
    own = [float(row[3]) for row in rows[:3]]
    assert own[0] < own[1] < own[2]
    assert float(rows[3][3]) == pytest.approx(statistics.fmean(own), abs=0.05)
    assert float(rows[4][3]) == pytest.approx(statistics.stdev(own), abs=0.05)
    two = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/random_prune",
                         "--seed-range", "1-2")  # fmt: skip
    assert [line.split()[0] for line in two.stdout.splitlines()[2:]] == ["1", "2", "mean", "sd"]
    assert "over the 2 paired seeds" in two.stdout
    none = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/random_prune",
                          "--seed-range", "5-9")  # fmt: skip
    assert none.returncode == 2 and "no entry with a seed in 5-9" in none.stderr
    alone = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seed-range", "1-2")
    assert alone.returncode == 2 and "--seed-range needs --seeds" in alone.stderr
    empty = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/random_prune",
                           "--seed-range", "3-1")  # fmt: skip
    assert empty.returncode == 2 and "the range is empty" in empty.stderr
    unknown = benchmark_here(monkeypatch, "clock", "--ledger", str(tmp_path), "--seeds", "dfp/cifar10/lenet/nope")
    assert unknown.returncode == 2 and "--seeds dfp/cifar10/lenet/nope: no such method configuration" in unknown.stderr


def test_the_wus_gain_analysis_relates_each_seeds_gain_to_the_climb_its_skip_epochs_sat_out(monkeypatch, tmp_path):
    """Baselines whose training loss climbs at the end of the first lr phase (epochs 1-3 at 0.1): runs whose skip
    epochs start inside it keep their loss from before the climb and gain, those that start after gain nothing; a
    seed whose baseline ended at chance is left out, as the report leaves it out."""
    baseline_loss = [1.0, 0.8, 1.2, 0.5, 0.4, 0.3]
    seeds = {0: (2, 0.8, 62.0), 1: (2, 1.0, 61.0), 2: (5, 1.2, 60.0), 3: (5, 1.2, 59.5), 4: (2, 0.8, 62.0)}
    for seed, (first_skip, loss_at_3, final) in seeds.items():
        for method, losses, acc, skips_from in (
            ("baseline", baseline_loss, 10.0 if seed == 4 else 60.0, 7),
            ("wus", [*baseline_loss[:2], loss_at_3, *baseline_loss[3:]], final, first_skip),
        ):
            history = [{"epoch": e, "lr": 0.1 if e <= 3 else 0.01, "train_loss": loss, "test_acc": acc,
                        "phase": int(e >= skips_from)} for e, loss in enumerate(losses, 1)]  # fmt: skip
            metrics = {"final_acc": acc, "best_acc": acc, "best3_acc": acc, "train_time_s": 6.0,
                       "total_trained_samples": 6.0, "epochs": 6, "skip_epochs": 7 - skips_from}  # fmt: skip
            config = {"study": "wus", "dataset": "cifar10", "model": "alexnet", "method": method, "seed": seed}
            write_run(tmp_path, "wus", f"cifar10-alexnet-{method}-s{seed}", history, metrics, config)
    result = benchmark_here(monkeypatch, "wus_gain", "--ledger", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2].split() == ["s0", "3", "2", "0.800", "1.200"]  # last epoch of the phase, lowest loss's, losses
    assert len(lines[2 : lines.index("")]) == 4  # seed 4's baseline collapsed
    rows = lines[lines.index("") + 2 :]
    assert [r.split() for r in rows[:4]] == [  # seed, first skip, skips, loss gap, Δ
        ["s0", "2", "5", "+0.400", "+2.00"],
        ["s1", "2", "5", "+0.200", "+1.00"],
        ["s2", "5", "2", "+0.000", "+0.00"],
        ["s3", "5", "2", "+0.000", "-0.50"],
    ]
    assert rows[4].strip() == "Pearson r (loss gap, Δ): 0.98 over 4 seeds"
    assert rows[5].strip() == "mean Δ, first skip inside the first lr phase: +1.50 (2 seeds); after it: -0.25 (2 seeds)"
    short = benchmark_here(monkeypatch, "wus_gain", "--ledger", str(tmp_path), "--min-seeds", "5")
    assert short.returncode == 2 and "no wus configuration of alexnet has 5 seeds paired" in short.stderr
    missing = benchmark_here(monkeypatch, "wus_gain", "--ledger", str(tmp_path / "none"))
    assert missing.returncode == 2 and "no results ledger there" in missing.stderr


def test_the_looks_analysis_follows_a_comparison_seed_by_seed_and_widens_its_interval_for_every_look(
    monkeypatch, tmp_path
):
    """dfp minus its baseline over seeds 0-4 (seed 5 has no baseline): the first K seeds' mean, the report's 95%
    t-interval, the seeds ahead and whether it is a finding; then all seeds' interval widened for the looks, a
    (1 - 0.05 / looks) t-interval."""
    history = [{"epoch": 1, "test_acc": 60.0, "epoch_train_s": 1.0, "trained_samples": 100.0}]
    lead = {0: 1.0, 1: 2.0, 2: 1.5, 3: 3.0, 4: -0.5, 5: 9.0}
    for method, seeds in (("baseline", range(5)), ("dfp", range(6)), ("random_prune", range(2))):
        for seed in seeds:
            acc = 60.0 + (lead[seed] if method == "dfp" else 0.0)
            metrics = {
                "final_acc": acc,
                "best_acc": acc,
                "best3_acc": acc,
                "epochs": 1,
                "train_time_s": 1.0,
                "total_trained_samples": 100.0,
            }
            config = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": method, "seed": seed}
            write_run(tmp_path, "dfp", f"cifar10-lenet-{method}-s{seed}", history, metrics, config)
    result = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--ledger", str(tmp_path), "--at", "3", "5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("dfp/cifar10/lenet/dfp minus baseline (best3_acc, points)")
    assert "first K of their 5 shared seeds, in seed order" in lines[0]  # no entry says when it finished
    first, every = lines[2].split(), lines[3].split()
    assert first[:3] == ["3", "2", "+1.50"]  # K, its last seed, the mean of +1, +2, +1.5
    half = T975[1] * 0.5 / math.sqrt(3)  # the report's interval: sd 0.5 over 3 seeds
    assert first[3:5] == [f"[{1.5 - half:+.2f},", f"{1.5 + half:+.2f}]"] and first[5:] == ["3", "of", "3", "yes"]
    assert every[:3] == ["5", "4", "+1.40"] and every[5:] == ["4", "of", "5", "no"]
    differences = [1.0, 2.0, 1.5, 3.0, -0.5]
    wide = 3.4954 * statistics.stdev(differences) / math.sqrt(5)  # t at 1 - 0.0125, 4 degrees of freedom
    assert lines[4] == (f"all 5 seeds, widened for 2 looks (Bonferroni: a 97.5% t-interval): [{1.4 - wide:+.2f}, "
                        f"{1.4 + wide:+.2f}], contains 0")  # fmt: skip
    # a plan's looks at 3 and 4 seeds: its widened figure is the fourth seed's, whatever came in since
    earlier = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--ledger", str(tmp_path), "--at", "3", "4")
    wide = 4.1765 * statistics.stdev(differences[:4]) / math.sqrt(4)  # t at 1 - 0.0125, 3 degrees of freedom
    mean = statistics.fmean(differences[:4])
    assert earlier.stdout.splitlines()[4] == (
        f"the first 4 of 5 seeds, widened for 2 looks (Bonferroni: a 97.5% t-interval): [{mean - wide:+.2f}, "
        f"{mean + wide:+.2f}], excludes 0"
    )
    behind = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/baseline", "--against", "dfp", "--ledger",
                            str(tmp_path), "--at", "3")  # fmt: skip
    below = ["-1.50", f"[{-1.5 - half:+.2f},", f"{-1.5 + half:+.2f}]", "0", "of", "3", "yes"]  # a finding too
    assert behind.stdout.splitlines()[2].split()[2:] == below
    default = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--ledger", str(tmp_path))
    assert [line.split()[0] for line in default.stdout.splitlines()[2:]] == ["3", "4", "5"]  # no look counted
    # with run.json's finished_at, seeds count in the order their pairs came in: seed 4's pair first (its later entry
    # still the earliest), then 0 and 1; seed 2's dfp entry came in last of all
    times = {0: ("09", "10"), 1: ("11", "08"), 2: ("07", "23"), 3: ("12", "13"), 4: ("06", "05")}
    for seed, (baseline_at, dfp_at) in times.items():
        for method, at in (("baseline", baseline_at), ("dfp", dfp_at)):
            path = tmp_path / "dfp" / f"cifar10-lenet-{method}-s{seed}" / "run.json"
            path.write_text(json.dumps(json.loads(path.read_text()) | {"finished_at": f"2026-11-29T{at}:00:00Z"}))
    ordered = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--ledger", str(tmp_path))
    rows = [line.split() for line in ordered.stdout.splitlines()]
    assert "as their pairs came in" in ordered.stdout.splitlines()[0]
    assert [row[1] for row in rows[2:]] == ["1", "3", "2"]  # the Kth seed: 4, 0, 1, then 3, then 2
    assert rows[2][2] == f"{statistics.fmean([-0.5, 1.0, 2.0]):+.2f}" and rows[3][2] == "+1.38"
    for args, said in (
        (["dfp/cifar10/lenet"], "expected study/dataset/model/method"),
        (["dfp/cifar10/lenet/dfp", "--against", "infobatch"], "lenet/infobatch: no entries"),
        (["dfp/cifar10/lenet/dfp", "--against", "random_prune"], "share 2 seeds; a t-interval needs 3"),
        (["dfp/cifar10/lenet/dfp", "--at", "2", "6"], "--at 2 6: the counts lie in 3-5"),
        (["nope/cifar10/lenet/dfp"], "nope: not a study of the ledger"),
    ):
        failed = benchmark_here(monkeypatch, "looks", *args, "--ledger", str(tmp_path))
        assert failed.returncode == 2 and said in failed.stderr, (args, failed.stderr)
    # seed 6: dfp's network ended at chance, as the report leaves it out, so do the looks, and they say so
    for method, acc in (("baseline", 60.0), ("dfp", 10.0)):
        metrics = {"final_acc": acc, "best_acc": acc, "best3_acc": acc, "epochs": 1, "train_time_s": 1.0,
                   "total_trained_samples": 100.0}  # fmt: skip
        config = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": method, "seed": 6}
        write_run(tmp_path, "dfp", f"cifar10-lenet-{method}-s6", history, metrics, config)
    lost = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--ledger", str(tmp_path)).stdout
    assert lost.splitlines()[1] == "left out, ended at chance: dfp seed 6" and "of their 5 shared seeds" in lost
    assert [row.split()[:3] for row in lost.splitlines()[3:]] == [row[:3] for row in rows[2:]]
    short = benchmark_here(monkeypatch, "looks", "dfp/cifar10/lenet/dfp", "--against", "random_prune", "--ledger",
                           str(tmp_path))  # fmt: skip
    assert "share 2 seeds (left out, ended at chance: dfp seed 6); a t-interval needs 3" in short.stderr


def test_the_falls_analysis_names_each_run_that_fell_to_chance_and_weighs_a_methods_falls(monkeypatch, tmp_path):
    """Eight runs of one network: a baseline at chance in its first epoch (not a fall: it had not learned), method x's
    seed 1 at chance in epochs 3-4 and learning again, seed 2 from epoch 4 to its end. Two falls of the network's two
    on x's four of eight runs: Fisher's one-sided p is C(6,2) / C(8,4) = 15/70."""
    accs = {("baseline", 0): [10.5, 40, 50, 55, 60], ("x", 1): [30, 40, 10, 11, 50], ("x", 2): [30, 40, 50, 10, 10]}
    for method in ("baseline", "x"):
        for seed in range(4):
            curve = accs.get((method, seed), [30, 40, 50, 55, 60])
            history = [{"epoch": e, "test_acc": a, "train_loss": 2.0 + (a <= 11) * e} for e, a in enumerate(curve, 1)]
            metrics = {"final_acc": curve[-1], "best_acc": max(curve), "best3_acc": max(curve), "epochs": 5,
                       "train_time_s": 1.0, "total_trained_samples": 100.0}  # fmt: skip
            config = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": method, "seed": seed}
            write_run(tmp_path, "dfp", f"cifar10-lenet-{method}-s{seed}", history, metrics, config)
    result = benchmark_here(monkeypatch, "falls", "--ledger", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dfp/cifar10/lenet: 8 runs, 2 fell to chance (a test accuracy at most 11%)"
    assert lines[2].split() == ["baseline", "4", "0", "0"]
    assert lines[3].split() == ["x", "4", "2", "1", f"{15 / 70:.3g}"]
    assert lines[4] == ("  - x seed 1: at chance in epochs 3-4 (2 of 5), learning again from epoch 5; training loss at "
                        "most 6 (epoch 4); final 50.00%")  # fmt: skip
    assert lines[5].startswith("  - x seed 2: at chance in epochs 4-5 (2 of 5), never learning again;")
    assert benchmark_here(monkeypatch, "falls", "dfp/cifar10/lenet", "--ledger", str(tmp_path)).stdout == result.stdout
    # the planned comparison: x's 2 falls in 4 runs against the baseline's none in 4, the p above (15/70)
    compared = benchmark_here(monkeypatch, "falls", "dfp/cifar10/lenet", "--compare", "x", "baseline", "--ledger",
                              str(tmp_path)).stdout  # fmt: skip
    assert compared.splitlines()[:-1] == lines
    assert compared.splitlines()[-1] == (
        "planned comparison: x fell in 2 of 4 runs, baseline in 0 of 4; one-sided Fisher exact p that the first falls "
        f"more often {15 / 70:.3g} (not under 0.05: not a finding)"
    )
    reverse = benchmark_here(monkeypatch, "falls", "dfp/cifar10/lenet", "--compare", "baseline", "x", "--ledger",
                             str(tmp_path)).stdout  # fmt: skip
    assert reverse.splitlines()[-1].endswith("p that the first falls more often 1 (not under 0.05: not a finding)")
    for args, said in (
        (["dfp/cifar10"], "expected study/dataset/model"),
        (["dfp/cifar10/alexnet"], "dfp/cifar10/alexnet: no entries in"),
        (["--compare", "x", "baseline"], "--compare: name the network too"),
        (["dfp/cifar10/lenet", "--compare", "x", "dfp"], "--compare: dfp/cifar10/lenet has no dfp entries"),
        (["dfp/cifar10/lenet", "--compare", "x", "x"], "--compare: two methods, not x twice"),
    ):
        failed = benchmark_here(monkeypatch, "falls", *args, "--ledger", str(tmp_path))
        assert failed.returncode == 2 and said in failed.stderr, (args, failed.stderr)
    # x's seed 3 diverged in epoch 6, its 5 epochs before above chance (the ledger keeps those, with diverged_epoch):
    # a fall that ended at chance, from the epoch it stopped in
    stopped = tmp_path / "dfp/cifar10-lenet-x-s3/metrics.json"
    stopped.write_text(json.dumps(json.loads(stopped.read_text()) | {"diverged_epoch": 6}))
    diverged = benchmark_here(monkeypatch, "falls", "dfp/cifar10/lenet", "--compare", "x", "baseline", "--ledger",
                              str(tmp_path)).stdout.splitlines()  # fmt: skip
    assert diverged[0] == "dfp/cifar10/lenet: 8 runs, 3 fell to chance (a test accuracy at most 11%)"
    assert diverged[3].split() == ["x", "4", "3", "2", f"{5 / 70:.3g}"]  # three falls on x's four runs: C(5,1) / C(8,4)
    assert diverged[6] == ("  - x seed 3: at chance in epochs 6 (1 of 6), never learning again; training loss at most "
                           "2 (epoch 5); loss diverged in epoch 6, where it stopped")  # fmt: skip
    assert diverged[-1].startswith(f"planned comparison: x fell in 3 of 4 runs, baseline in 0 of 4; one-sided Fisher "
                                   f"exact p that the first falls more often {5 / 70:.3g}")  # fmt: skip
    falls = load_benchmark("falls")
    assert falls.fisher_p(2, 4, 2, 8) == pytest.approx(15 / 70)
    assert falls.fisher_p(1, 12, 1, 36) == pytest.approx(1 / 3) and falls.fisher_p(0, 4, 2, 8) == 1.0
    assert falls.fisher_p(4, 8, 4, 16) == pytest.approx(70 / 1820)  # docs/measured.md's planned threshold: 4 against 0


def test_the_t_quantile_matches_the_tables():
    """Student's t for the Bonferroni interval (aggregate's, which looks.py and the report widen with), against printed
    tables (two-sided 95%, 99%; 97.5% with 4 df)."""
    assert t_quantile(0.025, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.005, 19) == pytest.approx(2.8609, abs=1e-4)
    assert t_quantile(0.0125, 4) == pytest.approx(3.4954, abs=1e-4)
    assert t_quantile(0.025, 200) == pytest.approx(1.9719, abs=1e-4)
