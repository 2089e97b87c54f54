"""The training loop on small synthetic data: determinism, what the hooks see, train and eval modes, the lr schedule,
an epoch's FLOPs, divergence, exact resume."""

import dataclasses
import io
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cheaptrain.cost import step_flops
from cheaptrain.methods import Method
from cheaptrain.models import create_model
from cheaptrain.trainer import TrainingDiverged, evaluate, final_metrics, fit, prepare, run_epoch, train_epoch

from conftest import small_config, synthetic_split

TIMINGS = ("epoch_train_s", "eval_s")


def without_timings(history):
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]


TRAIN, TEST = synthetic_split(300, seed=1), synthetic_split(100, seed=2)


def test_same_seed_gives_identical_metrics_and_a_schedule_per_epoch():
    first = fit(small_config(), TRAIN, TEST, Method())
    second = fit(small_config(), TRAIN, TEST, Method())
    assert without_timings(first) == without_timings(second)
    assert [row["epoch"] for row in first] == [1, 2, 3]
    assert [row["lr"] for row in first] == pytest.approx([0.05, 0.05, 0.005])
    assert all(row["trained_samples"] == 300 for row in first)
    assert all(row["epoch_train_s"] > 0 and row["eval_s"] > 0 for row in first)
    other_seed = fit(small_config(seed=8), TRAIN, TEST, Method())
    assert without_timings(other_seed) != without_timings(first)


@pytest.mark.parametrize("benchmark", [True, False])
def test_the_run_decides_whether_cudnn_times_its_algorithms(monkeypatch, benchmark):
    """train.cudnn_benchmark, not whatever ran before in the process."""
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not benchmark)
    prepare(dataclasses.replace(small_config(), cudnn_benchmark=benchmark), TRAIN, TEST, Method())
    assert torch.backends.cudnn.benchmark is benchmark


def test_fused_sgd_is_the_runs_choice_and_trains_as_pytorchs_default_step():
    """train.fused_sgd: one fused kernel for the SGD step; the same update as PyTorch's default implementation, so the
    same epochs up to float rounding."""
    fused = prepare(dataclasses.replace(small_config(), fused_sgd=True), TRAIN, TEST, Method())
    default = prepare(small_config(), TRAIN, TEST, Method())
    assert fused.optimizer.defaults["fused"] is True and not default.optimizer.defaults["fused"]
    histories = [fit(dataclasses.replace(small_config(), fused_sgd=f), TRAIN, TEST, Method()) for f in (True, False)]
    for a, b in zip(*histories, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1)


def test_learns_the_synthetic_task():
    history = fit(small_config(epochs=5, milestones=(4,), lr=0.02), TRAIN, TEST, Method())
    assert history[-1]["test_acc"] > 50  # 10 classes: chance is 10%


class Recorder(Method):
    """Trains only the even samples, and records everything the loop hands to the hooks."""

    def setup(self, ctx):
        super().setup(ctx)
        self.calls = []
        self.batches: dict[int, list] = {}

    def on_epoch_start(self, epoch, lr):
        self.calls.append(("start", epoch, lr))
        self.batches[epoch] = []
        return torch.arange(0, self.ctx.num_samples, 2)

    def on_batch_end(self, indices, losses):
        assert indices.shape == losses.shape and not losses.requires_grad
        self.batches[len(self.batches)].append((indices.clone(), losses.clone()))

    def on_validation_end(self, epoch, accuracy, lr):
        self.calls.append(("validation", epoch, accuracy, lr))

    def epoch_metrics(self):
        return {"recorded_batches": len(self.batches[len(self.batches)])}

    def run_metrics(self):
        return {"epochs_seen": len(self.batches)}


def test_hooks_see_selected_samples_per_sample_losses_and_accuracy():
    method = Recorder()
    history = fit(small_config(), TRAIN, TEST, method)
    assert method.ctx.num_samples == 300 and method.ctx.epochs == 3
    assert method.calls[0] == ("start", 1, 0.05)
    assert [c[0] for c in method.calls] == ["start", "validation"] * 3
    for row, (_, epoch, accuracy, lr) in zip(history, method.calls[1::2], strict=True):
        assert (epoch, accuracy, lr) == (row["epoch"], row["test_acc"], row["lr"])
        assert row["trained_samples"] == 150
        assert row["recorded_batches"] == 5  # ceil(150 / 32)
        seen = torch.cat([i for i, _ in method.batches[epoch]])
        assert sorted(seen.tolist()) == list(range(0, 300, 2))  # each selected sample exactly once
        losses = torch.cat([loss for _, loss in method.batches[epoch]])
        assert (losses >= 0).all()
        assert losses.mean().item() == pytest.approx(row["train_loss"], rel=1e-5)  # the losses that trained
    assert final_metrics(history)["total_trained_samples"] == 450
    assert method.run_metrics() == {"epochs_seen": 3}
    orders = [torch.cat([i for i, _ in method.batches[e]]).tolist() for e in (1, 2)]
    assert orders[0] != orders[1]  # reshuffled every epoch


def test_training_runs_in_train_mode_and_evaluation_in_eval_mode_every_epoch():
    """BatchNorm normalises a training batch by the batch's statistics and moves its running ones; evaluation uses
    the running statistics and leaves them as they are, and the next epoch trains in train mode again."""
    t = prepare(small_config(model="vgg11"), TRAIN, TEST, Method())
    norm = next(m for m in t.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    modes = []
    norm.register_forward_pre_hook(lambda module, _: modes.append(module.training))
    for epoch in (1, 2):
        modes.clear()
        before = norm.running_mean.clone()
        train_epoch(t, epoch, t.cfg.recipe.lr_at(epoch))
        assert modes and all(modes) and not torch.equal(norm.running_mean, before)
        modes.clear()
        trained = norm.running_mean.clone()
        evaluate(t, t.test_data)
        assert modes and not any(modes) and torch.equal(norm.running_mean, trained)


def test_each_epoch_trains_at_its_scheduled_learning_rate():
    t = prepare(small_config(), TRAIN, TEST, Method())  # lr 0.05, and 0.005 after the milestone at epoch 2
    for epoch in (1, 2, 3):
        run_epoch(t, epoch)
        assert [group["lr"] for group in t.optimizer.param_groups] == [pytest.approx(t.cfg.recipe.lr_at(epoch))]
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)


def test_an_epochs_flops_count_a_shorter_last_batch_at_its_size():
    t = prepare(small_config(), TRAIN, TEST, Method())  # 300 samples in batches of 32: 9 full ones, then 12
    full, last = (step_flops(t.model, size, t.cfg.channels_last) for size in (32, 12))
    assert last * 32 == full * 12  # a step's multiplies and convolutions scale with the batch
    assert run_epoch(t, 1)["train_flops"] == 9 * full + last


def test_a_step_whose_parameters_are_frozen_but_the_last_bias_costs_its_forward_pass_alone():
    """WUS's skip batch: autograd stops at the trained bias, so no backward pass through the network is counted."""
    model = create_model("lenet", 10)
    trained = {"classifier.bias"}
    assert trained <= dict(model.named_parameters()).keys()
    full = step_flops(model, 128, channels_last=False)
    with FlopCounterMode(display=False) as counter:
        model.to("meta")(torch.empty(128, 3, 32, 32, device="meta"))
    forward = counter.get_total_flops()
    model = create_model("lenet", 10)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    assert step_flops(model, 128, channels_last=False) == forward
    assert full > 2 * forward  # every weight's gradient, and every layer's input gradient but the first's


class Everything(Recorder):
    """Records what Recorder records, training every sample."""

    def on_epoch_start(self, epoch, lr):
        super().on_epoch_start(epoch, lr)  # records; its even samples are not passed on
        return None  # every sample


class Drawing(Everything):
    """Also draws from torch's global generator, as a method with randomness of its own might."""

    def on_epoch_start(self, epoch, lr):
        torch.rand(1000)
        return super().on_epoch_start(epoch, lr)


def test_a_methods_draws_from_the_global_generator_leave_the_data_order_alone():
    """The loop shuffles and augments with the run's own generator, so a method that draws random numbers trains on
    the batches its baseline trains on, until it chooses other samples."""
    quiet, drawing = Everything(), Drawing()
    histories = [fit(small_config(), TRAIN, TEST, method) for method in (quiet, drawing)]
    for epoch in (1, 2, 3):
        orders = [torch.cat([i for i, _ in m.batches[epoch]]).tolist() for m in (quiet, drawing)]
        assert sorted(orders[0]) == list(range(300)) and orders[0] == orders[1]
    assert without_timings(histories[0]) == without_timings(histories[1])


class Poison(Method):
    def on_epoch_start(self, epoch, lr):
        if epoch == 2:
            with torch.no_grad():
                next(self.ctx.model.parameters()).fill_(float("nan"))


def test_a_nan_loss_stops_the_run_with_a_clear_error():
    with pytest.raises(TrainingDiverged, match="became nan in epoch 2"):
        fit(small_config(), TRAIN, TEST, Poison())


def test_resuming_from_an_epoch_state_gives_the_uninterrupted_result():
    saved = {}

    def keep_epoch_2(history, state):
        if len(history) == 2:
            buffer = io.BytesIO()
            torch.save(state, buffer)  # what a checkpoint on disk holds
            saved["state"] = buffer.getvalue()

    full = fit(small_config(epochs=4, milestones=(3,)), TRAIN, TEST, Method(), on_epoch_end=keep_epoch_2)
    state = torch.load(io.BytesIO(saved["state"]), weights_only=False)
    resumed = fit(small_config(epochs=4, milestones=(3,)), TRAIN, TEST, Method(), resume=state)
    assert [row["epoch"] for row in resumed] == [1, 2, 3, 4]
    assert without_timings(resumed) == without_timings(full)


def test_final_metrics_use_both_papers_accuracy_measures():
    history = [
        {"test_acc": a, "epoch_train_s": 1.0, "eval_s": 0.5, "trained_samples": 10, "train_flops": 7}
        for a in (50, 70, 60, 65, 55)
    ]
    final = final_metrics(history)
    assert final["final_acc"] == 55
    assert final["best_acc"] == 70
    assert final["best3_acc"] == pytest.approx((70 + 65 + 60) / 3)
    assert final["train_time_s"] == 5.0 and final["eval_time_s"] == 2.5
    assert final["total_train_flops"] == 35 and final["total_trained_samples"] == 50
    assert final_metrics(history[:2])["best3_acc"] == 60  # a run that diverged in epoch 3: the mean of the two it has


# LeNet steps (channels_last, a new batch each) in a fresh process: the page faults of the last 30 steps.
_FAULTS_SCRIPT = """
import resource, sys, torch, torch.nn.functional as F
from cheaptrain.models import create_model
from cheaptrain.runner import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
torch.manual_seed(0)
model = create_model("lenet", 10).to(memory_format=torch.channels_last)  # as the trainer runs it
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def step():
    x = torch.randn(128, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    optimizer.zero_grad()
    F.cross_entropy(model(x), torch.randint(0, 10, (128,))).backward()
    optimizer.step()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(30):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a glibc setting")
def test_keep_freed_memory_stops_each_step_from_faulting_its_memory_in_again() -> None:
    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT, mode], capture_output=True, text=True, check=True)
        return int(done.stdout)

    default, kept = faults("default"), faults("keep")
    # measured over 8 runs each: 0-600 faults with the setting (growth of the heap), 10,000-34,000 without
    assert kept < 30 * 50
    assert 5 * kept < default
