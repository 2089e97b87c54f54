"""`train.compile` and bf16 autocast on CPU, through the real loop on small synthetic data: every method decides
under compile and bf16 as it does in eager fp32 (InfoBatch, whose candidates follow from the losses: in the same
epochs, each time exactly its own scores below their mean, in numbers within the spread of seeds), reaches the same
accuracy, and compiles each kind of epoch once.

Each setting's run trains once (cached) and is read by several tests. The recipe (LeNet, batch 32, lr 0.01 halved
every 2 epochs, 600 samples of 4 classes) learns the synthetic task to 100% test accuracy by epoch 4, before WUS
starts skipping, so a setting that trains worse falls visibly short of it.
"""

import contextlib
import copy
import dataclasses
import functools
import logging

import pytest
import torch
from torch._dynamo.utils import counters

from cheaptrain.methods import create_method
from cheaptrain.methods.wus import SKIP
from cheaptrain.trainer import fit

from conftest import small_config, synthetic_split

METHODS = ("baseline", "dfp", "random_prune", "wus", "wus_lr")  # what they decide follows from the epoch and the lr
ALL_METHODS = (*METHODS, "infobatch")  # infobatch's candidates follow from the losses: checked by check_infobatch
# 600 = 18 batches of 32 + 24: every full epoch ends with a partial batch; a DFP pruning epoch 500 = 15 x 32 + 20.
# 4 of the model's 10 classes, far apart in colour: LeNet learns them from any seed (with all 10, some seeds stall
# for epochs with two close colours confused, and a perturbed run then ends elsewhere).
TRAIN, TEST = synthetic_split(600, num_classes=4, seed=1), synthetic_split(200, num_classes=4, seed=2)
PRUNING = dict(window=3, starting_point=1, attenuation=1.0, block=2, count=1, prune_num=100)  # prunes epochs 2, 4, 8
# Two accuracies in [0, 100] never spread 100 points, so every epoch from the second is stable: the phases follow from
# the epoch and the lr alone. Initial epoch 4; wus skips from epoch 5 (patience 100 never runs out in 8 epochs);
# wus_lr falls back for each epoch whose lr changed (5 and 7): N N N N N S N S.
ALWAYS_STABLE = dict(std_window=2, std_threshold=100.0)
KNOBS = {
    "dfp": PRUNING,
    "random_prune": PRUNING,
    "wus": ALWAYS_STABLE | dict(patience=100),
    "wus_lr": ALWAYS_STABLE | dict(lr_fallback="one_epoch"),
    "infobatch": dict(prune_ratio=0.5, delta=0.75),  # prunes epochs 2-6 (floor(0.75 * 8)), trains 7-8 whole
}
INFOBATCH_PRUNES = [False, True, True, True, True, True, False, False]
# Eager fp32 runs of seeds 7-12 prune, epoch by epoch, counts up to 13% of the set apart (78 of 600, epoch 4; 211-280
# in epoch 6; test_infobatch_counts_spread_with_the_seed prints them): the share of scores below the mean is a noisy
# figure of a run. bf16 moves it as much as a seed does (an H100: 211 against 274 in epoch 6), so the runs' counts
# agree within a margin over the seeds' spread.
INFOBATCH_SPREAD = 0.2
# what a method decides and what the loop counts
DECISIONS = ("epoch", "lr", "trained_samples", "train_flops", "pruned_samples", "phase", "updated_params")
# one graph each: normal training, evaluation, skip training, evaluation in the skip phase (a shorter last batch runs
# uncompiled)
MAX_GRAPHS = 4


@dataclasses.dataclass
class Run:
    history: list[dict] = dataclasses.field(default_factory=list)
    graphs: list[int | None] = dataclasses.field(default_factory=list)  # compiled so far, after each epoch (None:
    # an epoch trained by an earlier process, before a resume)
    params: list[dict[str, torch.Tensor]] = dataclasses.field(default_factory=list)  # after each epoch
    counts: list[torch.Tensor] = dataclasses.field(default_factory=list)  # DFP's dropping counts after each epoch
    states: list[dict] = dataclasses.field(default_factory=list)  # the checkpoint state after each epoch
    first_losses: torch.Tensor | None = None  # the per-sample losses of the first batch
    cudagraph_skips: int = 0  # compiled graphs that inductor was asked to run as CUDA graphs and did not
    recompiles: list[list[str]] = dataclasses.field(default_factory=list)  # dynamo's reasons, by epoch (its guard
    # failures: why a call compiled again rather than run a graph it had)


@contextlib.contextmanager
def recompile_reasons():
    """Dynamo's `recompiles` log while in the block: one message per graph compiled after a function's first, each
    naming the guards that failed."""
    reasons: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: reasons.append(record.getMessage())
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles=True)
    logger.addHandler(handler)
    try:
        yield reasons
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()


@functools.cache
def run(
    method: str, compile: bool | str, amp: str, device: str = "cpu", resume_after: int = 0, seed: int = 7, **knobs
) -> Run:
    """8 epochs of `method` (its KNOBS, updated by `knobs`) from `seed`, compiled or not (or in a torch.compile mode),
    under `amp`; compiling from an empty in-memory cache. `resume_after` N: the same run's epochs after N, resumed in a
    fresh process's state (no graph compiled) from the checkpoint state of epoch N; its earlier rows are the run's."""
    cfg = small_config(
        epochs=8, method=method, seed=seed, lr=0.01, schedule="step", step_size=2, gamma=0.5, milestones=()
    )
    cfg = dataclasses.replace(cfg, compile=compile, amp=amp, device=device)
    trainer = create_method(method, KNOBS.get(method, {}) | knobs)
    result, resume = Run(), None
    if resume_after:
        whole = run(method, compile, amp, device, seed=seed, **knobs)
        resume = whole.states[resume_after - 1]
        result.params, result.counts = whole.params[:resume_after], whole.counts[:resume_after]
        result.graphs, result.states = [None] * resume_after, whole.states[:resume_after]
        result.recompiles = [[] for _ in range(resume_after)]
    hook = trainer.on_batch_end

    def keep_first_losses(indices, losses):
        if result.first_losses is None:
            result.first_losses = losses.clone()
        hook(indices, losses)

    def record(history, state):
        nonlocal seen
        result.graphs.append(counters["stats"]["unique_graphs"] - graphs_before)
        result.recompiles.append([reason for reason in reasons[seen:] if reason.startswith("Recompiling")])
        seen = len(reasons)
        result.params.append({k: v.detach().clone() for k, v in state["model"].items()})
        result.states.append(copy.deepcopy(state))
        if hasattr(trainer, "counts"):
            result.counts.append(trainer.counts.clone())

    trainer.on_batch_end = keep_first_losses
    torch._dynamo.reset()  # forgets the graphs of earlier runs (the counters keep counting)
    graphs_before, skips_before = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a compiled CPU kernel's threads wait for each other: 20x slower on a busy machine
    seen = 0
    try:
        # no silent fall-back to eager
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), recompile_reasons() as reasons:
            result.history = fit(cfg, TRAIN, TEST, trainer, resume=resume, on_epoch_end=record)
        result.cudagraph_skips = counters["inductor"]["cudagraph_skips"] - skips_before
    finally:
        torch.set_num_threads(threads)
        torch._dynamo.reset()
    return result


def decisions(history: list[dict]) -> list[dict]:
    return [{k: row[k] for k in DECISIONS if k in row} for row in history]


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return (b / a - 1).abs().max().item()


def check_each_kind_of_epoch_compiles_once(compiled: Run, most: int = MAX_GRAPHS) -> None:
    """No graph compiled in an epoch whose kind (samples trained, phase) ran before; `most` graphs in all."""
    kinds = [(row["trained_samples"], row.get("phase")) for row in compiled.history]
    for epoch in range(1, len(kinds)):
        if kinds[epoch] in kinds[:epoch]:
            assert compiled.graphs[epoch] == compiled.graphs[epoch - 1], f"epoch {epoch + 1} recompiled"
    assert 1 <= compiled.graphs[-1] <= most


def check_a_new_phase_compiles_its_own_graphs(compiled: Run) -> None:
    """The first epoch of a phase (its own trainable parameters) compiles graphs: it must not run another phase's,
    whose backward computes gradients that phase does not train (a skip epoch's cost) or lacks those it does (a
    normal epoch's weights left untrained)."""
    phases, graphs = [row["phase"] for row in compiled.history], compiled.graphs
    mine = [e for e, g in enumerate(graphs) if g is not None]  # the epochs this process trained
    firsts = [e for e in mine if phases[e] not in [phases[f] for f in mine if f < e]]
    assert len(firsts) >= 2, "no phase change to check"
    for epoch in firsts:
        before = graphs[epoch - 1] if epoch - 1 in mine else 0
        assert graphs[epoch] > before, f"epoch {epoch + 1} ran another phase's graphs"


def check_skip_epochs_change_only_the_kept_bias(run: Run) -> None:
    """A skip epoch changes the classifier's bias alone, bitwise; every other epoch changes every parameter."""
    for epoch in range(1, len(run.history)):
        before, after = run.params[epoch - 1], run.params[epoch]
        changed = {name for name in after if not torch.equal(before[name], after[name])}
        expected = {"classifier.bias"} if run.history[epoch]["phase"] == SKIP else set(after)
        assert changed == expected, f"epoch {epoch + 1}"


@pytest.mark.parametrize("method", METHODS)
def test_each_method_decides_under_compile_and_bf16_as_in_eager_fp32(method):
    """Pruning epochs and numbers, phases and updated parameters follow from the epoch, the lr and the schedule here
    (KNOBS), so they must be identical; so must the samples and FLOPs the loop counts."""
    eager, compiled = run(method, False, "off"), run(method, True, "bf16")
    assert decisions(compiled.history) == decisions(eager.history)
    if method in ("dfp", "random_prune"):
        assert [row["pruned_samples"] for row in compiled.history] == [0, 100, 0, 100, 0, 0, 0, 100]
    if method == "wus":
        assert [row["phase"] for row in compiled.history] == [0, 0, 0, 0, 1, 1, 1, 1]
    if method == "wus_lr":
        assert [row["phase"] for row in compiled.history] == [0, 0, 0, 0, 0, 1, 0, 1]


SETTINGS = [(m, True, "bf16") for m in ALL_METHODS] + [("dfp", False, "bf16"), ("dfp", True, "off")]


@pytest.mark.parametrize(("method", "compile", "amp"), SETTINGS)
def test_compile_and_bf16_reach_the_eager_fp32_accuracy(method, compile, amp):
    """Within 3 points (6 of the 200 test images) at the last epoch. bf16 rounds the inputs of every matrix product
    to 8 significant bits, so the runs drift apart like two slightly different runs, but both reach 100% on this
    task; a setting that trains worse (no learning, frozen or diverging weights) ends tens of points lower."""
    eager, other = run(method, False, "off"), run(method, compile, amp)
    assert eager.history[-1]["test_acc"] >= 95  # the reference learns the task
    assert other.history[-1]["test_acc"] == pytest.approx(eager.history[-1]["test_acc"], abs=3)
    assert other.history[-1]["train_loss"] < 0.1 * other.history[0]["train_loss"]


def check_infobatch(eager: Run, compiled: Run) -> None:
    """InfoBatch under compile and bf16 prunes in the epochs eager fp32 does, half of its candidates each time, its
    candidates exactly the samples whose score (its own run's, at the epoch's start) is below the mean; trains the
    annealing epochs whole, and compiles nothing after its first epoch, though every pruning epoch ends on another
    partial batch. How many scores fall below the mean moves with the rounding as with the seed, so the two runs'
    counts agree only within INFOBATCH_SPREAD."""
    for run_ in (eager, compiled):
        rows = run_.history
        assert [row["pruned_samples"] > 0 for row in rows] == INFOBATCH_PRUNES
        assert all(row["trained_samples"] + row["pruned_samples"] == len(TRAIN.labels) for row in rows)
        assert all(row["pruned_samples"] == row["candidates"] - row["candidates"] // 2 for row in rows)
        for row, state in zip(rows[1:], run_.states, strict=False):  # the scores as the epoch before left them
            scores = state["method"]["scores"]
            below = int((scores < scores.mean()).sum()) if row["pruned_samples"] else 0  # annealing: no selection
            assert row["candidates"] == below, f"epoch {row['epoch']}"
    for a, b in zip(eager.history, compiled.history, strict=True):
        gap = abs(a["pruned_samples"] - b["pruned_samples"])
        assert gap <= INFOBATCH_SPREAD * len(TRAIN.labels), f"epoch {a['epoch']}"
    sizes = [row["trained_samples"] % 32 for row in compiled.history]
    assert len(set(sizes)) > 3  # last batches of 4+ sizes (batch 32)
    later = [reason for reasons in compiled.recompiles[1:] for reason in reasons]  # dynamo's, naming failed guards
    explained = f"graphs after each epoch: {compiled.graphs}; last batches {sizes}; recompiles:\n" + "\n".join(later)
    assert compiled.graphs[1:] == compiled.graphs[:1] * 7 and not later, explained


def test_infobatch_counts_spread_with_the_seed_within_the_bound_between_settings():
    """INFOBATCH_SPREAD covers what it stands for: eager fp32 runs of six seeds prune counts within it of each other,
    epoch by epoch."""
    counts = [
        [row["pruned_samples"] for row in run("infobatch", False, "off", seed=seed).history] for seed in range(7, 13)
    ]
    spread = [max(epoch) - min(epoch) for epoch in zip(*counts, strict=True)]
    print("pruned samples by epoch, seeds 7-12:", *counts, "spread:", spread, sep="\n")
    assert max(spread) <= INFOBATCH_SPREAD * len(TRAIN.labels), spread


def test_infobatch_under_compile_and_bf16_prunes_as_eager_fp32_and_compiles_nothing_after_its_first_epoch():
    check_infobatch(run("infobatch", False, "off"), run("infobatch", True, "bf16"))


def test_a_shorter_last_batch_of_any_size_runs_uncompiled():
    """Epochs ending on batches of 24 (600 samples), 20 (500) or 1 (577) compile the same graphs, all in the first
    epoch: the full batches' (one size, so inductor specialises its kernels to it) and evaluation's. Compiled, a
    shorter batch would recompile, for its size (a size of 1 apart: PyTorch specialises it) or for a dynamic batch."""
    ones, pruning_by_100 = run("random_prune", True, "off", prune_num=23), run("random_prune", True, "off")
    assert [row["trained_samples"] for row in ones.history] == [600, 577, 600, 577, 600, 600, 600, 577]
    assert [row["trained_samples"] for row in pruning_by_100.history] == [600, 500, 600, 500, 600, 600, 600, 500]
    assert ones.graphs == pruning_by_100.graphs == [2] * 8
    assert not any(reason for reasons in ones.recompiles[1:] for reason in reasons)
    assert decisions(ones.history) == decisions(run("random_prune", False, "off", prune_num=23).history)


def test_a_compile_mode_reaches_inductor_and_the_run_decides_as_in_eager():
    """`train.compile: reduce-overhead` asks inductor for CUDA graphs: on a CPU it compiles each graph without them
    (each counted as a skip, which the default mode never asks for) and trains as the default mode does. On a GPU,
    tests/test_gpu.py checks that the graphs are used."""
    default, graphs = run("dfp", True, "off"), run("dfp", "reduce-overhead", "off")
    assert default.cudagraph_skips == 0 and graphs.cudagraph_skips > 0
    assert decisions(graphs.history) == decisions(default.history) == decisions(run("dfp", False, "off").history)
    assert graphs.history[-1]["test_acc"] == pytest.approx(default.history[-1]["test_acc"], abs=3)
    check_each_kind_of_epoch_compiles_once(graphs)


def test_compiled_fp32_computes_the_eager_losses_up_to_float_rounding():
    """Compiling fuses and reorders float32 arithmetic, nothing else: the first batch (the same weights, the same
    images) gives the same losses to 1e-6, and every epoch's losses stay within 1e-3 relative (rounding differences
    carried from step to step; bf16 moves them by 1e-2 and more) and its accuracy within one test image."""
    eager, compiled = run("dfp", False, "off"), run("dfp", True, "off")
    assert relative_gap(eager.first_losses, compiled.first_losses) < 1e-6
    for a, b in zip(eager.history, compiled.history, strict=True):
        assert (b["train_loss"], b["test_loss"]) == pytest.approx((a["train_loss"], a["test_loss"]), rel=1e-3)
        assert b["test_acc"] == pytest.approx(a["test_acc"], abs=0.5)


def test_compiled_bf16_computes_in_bf16():
    """Autocast reaches the compiled graph: its first batch's losses leave the fp32 ones by more than 1e-5 relative
    (bf16 rounding; the compiled fp32 run's stay within 1e-6), and agree with eager bf16's."""
    eager, compiled, eager_bf16 = run("dfp", False, "off"), run("dfp", True, "bf16"), run("dfp", False, "bf16")
    assert relative_gap(eager.first_losses, compiled.first_losses) > 1e-5
    assert relative_gap(eager_bf16.first_losses, compiled.first_losses) < 1e-5


def test_compiled_dfp_in_fp32_counts_and_prunes_as_eager():
    """From the same data (the same weights up to float rounding, the same batches) the dropping counts after every
    epoch are the same, and so are the samples every pruning epoch leaves out."""
    eager, compiled = run("dfp", False, "off"), run("dfp", True, "off")
    assert len(compiled.counts) == 8 and compiled.counts[-1].sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(eager.counts, compiled.counts, strict=True))


@pytest.mark.parametrize("method", ALL_METHODS)
def test_a_kind_of_epoch_seen_before_compiles_nothing(method):
    """The graphs a run compiles stop growing once each kind of epoch (its batch sizes, its trainable parameters)
    has run: DFP's shorter epochs train their full batches in the graph of the full epochs (their last, shorter
    batch uncompiled), and WUS's phase flips find their graphs again; one graph for each phase's training and
    evaluation in all."""
    check_each_kind_of_epoch_compiles_once(run(method, True, "bf16"))


def test_a_compiled_skip_epoch_changes_only_the_kept_biases():
    """Under compile a skip epoch runs graphs of its own, whose backward computes no gradient for the frozen weights:
    SGD leaves them bitwise untouched while the classifier's bias trains, and a normal epoch after skipping changes
    every parameter."""
    compiled = run("wus_lr", True, "bf16")
    check_a_new_phase_compiles_its_own_graphs(compiled)
    check_skip_epochs_change_only_the_kept_bias(compiled)


def test_a_compiled_run_resumed_in_a_skip_phase_trains_every_weight_when_it_falls_back():
    """Resumed before a skip epoch, the process compiles the skip phase's graphs first; the normal epoch after it
    gets graphs of its own and trains every weight (run in the skip phase's graphs, whose backward reaches the kept
    bias alone, it would train nothing else: trainer.step_model says when torch does that)."""
    whole, resumed = run("wus_lr", True, "bf16"), run("wus_lr", True, "bf16", resume_after=5)
    assert [row["phase"] for row in resumed.history] == [0, 0, 0, 0, 0, 1, 0, 1]
    check_skip_epochs_change_only_the_kept_bias(resumed)
    check_a_new_phase_compiles_its_own_graphs(resumed)
    assert decisions(resumed.history) == decisions(whole.history)
    assert resumed.history[-1]["test_acc"] == pytest.approx(whole.history[-1]["test_acc"], abs=3)
