"""InfoBatch: candidates below the mean score, the share left out, seeded draws, the weights, annealing, params, exact
resume, and the loss_weights hook of the training loop (synthetic data, LeNet, a few epochs on CPU)."""

import io

import pytest
import torch

from cheaptrain import ConfigError
from cheaptrain.config import Recipe, RunConfig
from cheaptrain.methods import Method, RunContext, create_method
from cheaptrain.methods.infobatch import InfoBatch
from cheaptrain.methods.infobatch_unweighted import InfoBatchUnweighted
from cheaptrain.trainer import fit

from conftest import synthetic_split


def ready(num_samples: int = 1000, epochs: int = 10, seed: int = 0, name: str = "infobatch", **params) -> InfoBatch:
    """The method after setup(), as the loop leaves it, on CPU."""
    method = create_method(name, params)
    method.setup(RunContext(None, num_samples, epochs, torch.device("cpu"), seed, lambda epoch: 0.1))
    return method


def low_and_high(method: InfoBatch, low: int) -> None:
    """Scores 1.0 for the first `low` samples, 5.0 for the rest: the first `low` are below the mean."""
    method.scores.fill_(5.0)
    method.scores[:low] = 1.0


def left_out(method: InfoBatch, trained: torch.Tensor) -> torch.Tensor:
    mask = torch.ones(method.ctx.num_samples, dtype=torch.bool)
    mask[trained] = False
    return mask.nonzero().squeeze(1)


# --- selection and weights -----------------------------------------------------------------------------------------


def test_epoch_1_has_no_candidate_and_trains_every_sample_unweighted():
    method = ready()
    assert method.on_epoch_start(1, 0.1) is None  # every score equal: none is below the mean
    assert method.loss_weights(torch.arange(10)) is None
    assert method.epoch_metrics() | {"selection_s": 0} == {
        "pruned_samples": 0, "candidates": 0, "upweighted_samples": 0, "selection_s": 0,
    }  # fmt: skip


@pytest.mark.parametrize(("ratio", "kept"), [(0.5, 200), (0.3, 280), (0.9, 40)])
def test_the_ratio_leaves_out_a_share_of_the_candidates_below_the_mean_not_of_the_set(ratio, kept):
    method = ready(prune_ratio=ratio)
    method.scores.copy_(torch.tensor([1.0] * 400 + [3.0] * 200 + [5.0] * 400))  # mean 3: 400 candidates
    trained = method.on_epoch_start(2, 0.1)
    pruned = left_out(method, trained)
    assert len(pruned) == 400 - kept  # int((1 - ratio) * 400) kept, 0.9: exactly 0.1 * 400 (the reference's floor)
    assert pruned.max() < 400  # only candidates are left out; a score at the mean is not below it
    assert trained.tolist() == sorted(set(trained.tolist()))
    metrics = method.epoch_metrics()
    assert (metrics["candidates"], metrics["upweighted_samples"], metrics["pruned_samples"]) == (400, kept, 400 - kept)


def test_kept_candidates_weigh_one_over_the_keep_ratio_and_every_other_sample_one():
    method = ready(prune_ratio=0.3)
    low_and_high(method, 600)
    trained = method.on_epoch_start(2, 0.1)
    weights = method.loss_weights(trained)
    candidate = trained < 600
    assert torch.equal(weights[candidate], torch.full((420,), 1 / 0.7))
    assert torch.equal(weights[~candidate], torch.ones(400))
    batch = trained[torch.randperm(len(trained))[:32]]  # a batch: its own samples' weights, in its order
    assert torch.equal(method.loss_weights(batch), torch.where(batch < 600, 1 / 0.7, 1.0).float())


def test_the_draw_comes_from_the_runs_seed():
    def pruned(seed: int, epochs: int = 1) -> list[list[int]]:
        method = ready(seed=seed, prune_ratio=0.5)
        low_and_high(method, 600)
        return [left_out(method, method.on_epoch_start(2 + e, 0.1)).tolist() for e in range(epochs)]

    first = pruned(0)
    assert pruned(0) == first
    assert pruned(1) != first
    torch.manual_seed(123)  # the global generator plays no part
    assert pruned(0) == first
    again, later = pruned(0, epochs=2)
    assert [again] == first and later != again  # the generator moves on: another draw each epoch


def test_annealing_starts_after_floor_delta_times_epochs_as_in_the_reference():
    for epochs, delta, last in [(200, 0.875, 175), (10, 0.875, 8), (10, 0.5, 5), (7, 1.0, 7)]:
        method = ready(num_samples=100, epochs=epochs, delta=delta)
        low_and_high(method, 60)
        pruning = [e for e in range(1, epochs + 1) if method.on_epoch_start(e, 0.1) is not None]
        assert pruning == list(range(1, last + 1)), (epochs, delta)  # scores set: epoch 1 prunes here too
        assert method.run_metrics()["annealing_epochs"] == epochs - last
        assert method.run_metrics()["pruning_epochs"] == last


def test_an_annealing_epoch_drops_the_last_pruning_epochs_weights():
    method = ready(num_samples=100, epochs=10, delta=0.5)
    low_and_high(method, 60)
    assert method.loss_weights(method.on_epoch_start(5, 0.1)).max() == 2.0
    assert method.on_epoch_start(6, 0.1) is None
    assert method.loss_weights(torch.arange(100)) is None
    assert method.epoch_metrics()["candidates"] == 0


# --- params --------------------------------------------------------------------------------------------------------

BAD = [
    ({"prune_ratio": 0}, "methods.infobatch.prune_ratio: 0 is invalid; accepted: a number in (0, 0.9]"),
    ({"prune_ratio": 0.95}, "methods.infobatch.prune_ratio: 0.95 is invalid"),
    ({"prune_ratio": "half"}, "methods.infobatch.prune_ratio: 'half' is invalid"),
    ({"prune_ratio": True}, "methods.infobatch.prune_ratio: True is invalid"),
    ({"delta": 0}, "methods.infobatch.delta: 0 is invalid; accepted: a number in (0, 1]"),
    ({"delta": 1.5}, "methods.infobatch.delta: 1.5 is invalid"),
    ({"ratio": 0.5}, "methods.infobatch.ratio: unknown parameter (accepted: prune_ratio, delta)"),
]


@pytest.mark.parametrize(("params", "expected"), BAD, ids=[b[1][18:40] for b in BAD])
def test_bad_params_are_one_line_each(params, expected):
    with pytest.raises(ConfigError) as info:
        create_method("infobatch", params)
    (problem,) = info.value.problems
    assert problem.startswith(expected), problem


def test_defaults_are_the_reference_codes_and_a_named_configuration_keeps_its_name():
    assert {k: p.default for k, p in InfoBatch.PARAMS.items()} == {"prune_ratio": 0.5, "delta": 0.875}
    named = create_method("infobatch_r30", {"method": "infobatch", "prune_ratio": 0.3})
    assert type(named) is InfoBatch and named.name == "infobatch_r30" and named.params["prune_ratio"] == 0.3
    with pytest.raises(ConfigError, match=r"methods\.infobatch_r30\.delta: 2 is invalid"):
        create_method("infobatch_r30", {"method": "infobatch", "delta": 2})


def test_a_run_where_no_epoch_can_prune_fails_before_any_work():
    context = RunContext(None, 300, 10, torch.device("cpu"), 0, lambda epoch: 0.1)
    assert create_method("infobatch", {"delta": 0.2}).check_run(context) == []  # epochs 1 and 2
    (problem,) = create_method("infobatch", {"delta": 0.15}).check_run(context)
    assert problem.startswith("methods.infobatch.delta: 0.15 lets no epoch prune in this run's 10 epochs")


# --- through the training loop -------------------------------------------------------------------------------------

TRAIN, TEST = synthetic_split(300, seed=1), synthetic_split(100, seed=2)
TIMINGS = ("epoch_train_s", "eval_s", "selection_s")


def config(method: str = "infobatch", epochs: int = 5, **method_args) -> RunConfig:
    recipe = Recipe(
        epochs=epochs, batch_size=32, lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=False,
        schedule="multistep", milestones=(3,), gamma=0.2, augment=True,
    )  # fmt: skip
    return RunConfig(
        study="test", dataset="cifar10", model="lenet", method=method, seed=3, recipe=recipe,
        method_args={"prune_ratio": 0.5, "delta": 0.8} | method_args, device="cpu",
    )  # fmt: skip


def strip(history):
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]


class Watched(InfoBatch):
    """infobatch, recording per epoch the scores at selection, the samples trained, their weights and losses."""

    def on_epoch_start(self, epoch, lr):
        self.seen = getattr(self, "seen", {})
        self.seen[epoch] = {"scores": self.scores.clone(), "batches": []}
        self.seen[epoch]["trained"] = super().on_epoch_start(epoch, lr)
        return self.seen[epoch]["trained"]

    def loss_weights(self, indices):
        weights = super().loss_weights(indices)
        self.seen[max(self.seen)]["batches"].append([indices.clone(), weights, None])
        return weights

    def on_batch_end(self, indices, losses):  # after the epoch's last step, batch by batch in order
        batches = self.seen[max(self.seen)]["batches"]
        unseen = next(b for b in batches if b[2] is None)
        assert torch.equal(unseen[0], indices)
        unseen[2] = losses.clone()
        super().on_batch_end(indices, losses)


def test_in_the_loop_pruning_epochs_train_the_kept_samples_weighted_and_annealing_every_sample():
    cfg = config()  # 5 epochs, delta 0.8: epochs 2-4 prune, epoch 5 anneals
    method = Watched(**cfg.method_args)
    history = fit(cfg, TRAIN, TEST, method)
    for row in history:
        seen = method.seen[row["epoch"]]
        indices = torch.cat([i for i, _, _ in seen["batches"]])
        assert len(indices) == len(set(indices.tolist())) == row["trained_samples"] == 300 - row["pruned_samples"]
        below = seen["scores"] < seen["scores"].mean()
        if row["epoch"] in (2, 3, 4):
            assert row["candidates"] == below.sum() > 0
            assert row["pruned_samples"] == row["candidates"] - row["candidates"] // 2  # int(0.5 * candidates) kept
            assert sorted(indices.tolist()) == seen["trained"].tolist()
            weights = torch.cat([w for _, w, _ in seen["batches"]])
            assert torch.equal(weights, torch.where(below[indices], 2.0, 1.0))  # kept candidates weigh 1 / 0.5
            assert below[left_out(method, seen["trained"])].all()  # only candidates are left out
            losses = torch.cat([loss for _, _, loss in seen["batches"]])
            assert row["train_loss"] == pytest.approx((losses * weights).mean().item(), rel=1e-5)
        else:
            assert row["pruned_samples"] == 0 and seen["trained"] is None
            assert all(w is None for _, w, _ in seen["batches"])
    last = method.seen[5]["batches"]  # scores: the latest unweighted loss of each sample
    for indices, _, losses in last:
        assert torch.equal(method.scores[indices], losses)
    metrics = method.run_metrics()
    assert metrics["pruning_epochs"] == 3 and metrics["annealing_epochs"] == 1
    assert metrics["pruned_samples_total"] == sum(row["pruned_samples"] for row in history)
    assert metrics["overhead_s"] == pytest.approx(metrics["selection_s_total"] + metrics["monitoring_s"])


def test_resuming_from_a_checkpoint_gives_the_uninterrupted_run():
    saved = {}

    def keep_epoch_3(history, state):
        if len(history) == 3:  # between two pruning epochs
            buffer = io.BytesIO()
            torch.save(state, buffer)
            saved["state"] = buffer.getvalue()

    cfg = config()
    full_method = create_method("infobatch", cfg.method_args)
    full = fit(cfg, TRAIN, TEST, full_method, on_epoch_end=keep_epoch_3)
    resumed_method = create_method("infobatch", cfg.method_args)
    resumed = fit(cfg, TRAIN, TEST, resumed_method, resume=torch.load(io.BytesIO(saved["state"]), weights_only=False))
    assert strip(resumed) == strip(full)
    assert sum(row["pruned_samples"] for row in full[3:]) > 0  # the resumed part pruned
    assert torch.equal(resumed_method.scores, full_method.scores)
    counted = ("pruning_epochs", "pruned_samples_total", "annealing_epochs")
    assert {k: resumed_method.run_metrics()[k] for k in counted} == {k: full_method.run_metrics()[k] for k in counted}


class Weighted(Method):
    """The baseline with every loss weighted by `weight`."""

    def __init__(self, weight: float) -> None:
        super().__init__()
        self.weight = weight

    def loss_weights(self, indices):
        return torch.full(indices.shape, self.weight)


def trained(method: Method, epochs: int = 2) -> tuple[list[dict], list[torch.Tensor]]:
    history = fit(config("baseline", epochs=epochs), TRAIN, TEST, method)
    return strip(history), [p.detach().clone() for p in method.ctx.model.parameters()]


def test_the_loss_weights_hook_leaves_unweighted_training_as_the_baseline_trains():
    history, params = trained(Method())
    ones_history, ones_params = trained(Weighted(1.0))  # x * 1.0 is exact in floats: bitwise the same
    assert ones_history == history
    assert all(torch.equal(a, b) for a, b in zip(ones_params, params, strict=True))
    _, doubled_params = trained(Weighted(2.0))  # the weights do reach the objective
    assert not all(torch.equal(a, b) for a, b in zip(doubled_params, params, strict=True))
    # infobatch's epoch 1 has no candidate: no weights, the baseline's batches, bitwise
    infobatch = create_method("infobatch", config().method_args)
    first, first_params = trained(infobatch, epochs=1)
    baseline_first, baseline_params = trained(Method(), epochs=1)
    assert {k: v for k, v in first[0].items() if k in baseline_first[0]} == baseline_first[0]
    assert all(torch.equal(a, b) for a, b in zip(first_params, baseline_params, strict=True))


# --- the ablation without rescaling (infobatch_unweighted) ---------------------------------------------------------


def test_without_rescaling_the_same_samples_are_left_out_and_none_is_weighted():
    weighted, unweighted = ready(prune_ratio=0.3), ready(name="infobatch_unweighted", prune_ratio=0.3)
    assert type(unweighted) is InfoBatchUnweighted and isinstance(unweighted, InfoBatch)
    for method in (weighted, unweighted):
        low_and_high(method, 600)
    for epoch in (2, 3):  # the same generator: the same draw, epoch after epoch
        assert torch.equal(weighted.on_epoch_start(epoch, 0.1), unweighted.on_epoch_start(epoch, 0.1))
        assert weighted.loss_weights(torch.arange(10)) is not None
        assert unweighted.loss_weights(torch.arange(10)) is None
        metrics = unweighted.epoch_metrics()
        assert (metrics["candidates"], metrics["pruned_samples"], metrics["upweighted_samples"]) == (600, 180, 0)
        assert weighted.epoch_metrics()["upweighted_samples"] == 420


def test_without_rescaling_a_run_trains_infobatchs_first_selection_to_the_plain_mean_loss():
    section = {"method": "infobatch_unweighted"} | config().method_args  # a named configuration, as params.yaml's
    unweighted = create_method("infobatch_r24_unweighted", section)
    assert type(unweighted) is InfoBatchUnweighted and unweighted.name == "infobatch_r24_unweighted"
    weighted_history, _ = trained(create_method("infobatch", config().method_args), epochs=3)
    history, _ = trained(unweighted, epochs=3)
    assert history[0] | {"upweighted_samples": 0} == weighted_history[0]  # epoch 1: no candidate, the same epoch
    assert history[0]["upweighted_samples"] == 0
    # epoch 2: the same scores, the same draw, hence the same samples; the losses not weighted, so another loss
    same = ("candidates", "pruned_samples", "trained_samples")
    assert {k: history[1][k] for k in same} == {k: weighted_history[1][k] for k in same}
    assert history[1]["pruned_samples"] > 0 and weighted_history[1]["upweighted_samples"] > 0
    assert history[1]["upweighted_samples"] == 0 and history[1]["train_loss"] != weighted_history[1]["train_loss"]
