"""Weight Update Skipping (`wus`, `wus_lr`): the tensors a skip epoch trains, freezing through the real loop, the
backward pass it leaves out, the phase machine on scripted accuracies and learning rates, params, resume, and the
quick pipeline's runs in MLflow."""

import collections
import contextlib
import copy
import io
import math
import statistics

import pytest
import torch
import yaml
from torch import nn
from torch.profiler import ProfilerActivity, profile

from cheaptrain import ConfigError
from cheaptrain.config import Recipe, RunConfig, load_params, resolve_run
from cheaptrain.cost import StepCosts
from cheaptrain.data import DeviceData, channel_stats
from cheaptrain.distributed import ONE
from cheaptrain.methods import RunContext, create_method
from cheaptrain.methods.wus import NORMAL, SKIP, WeightUpdateSkipping, layers_with_parameters, skip_trainable
from cheaptrain.models import create_model
from cheaptrain.trainer import Training, fit, train_epoch

from conftest import REPO, read_csv, small_config, synthetic_split

N, S = NORMAL, SKIP
PARAMS = load_params(REPO / "params.yaml")


def context(model: nn.Module, lrs=None) -> RunContext:
    """What the loop hands to setup(); `lrs[e - 1]` is the lr of epoch e."""
    return RunContext(model, 64, 10, torch.device("cpu"), 0, (lambda e: lrs[e - 1]) if lrs else (lambda e: 0.05))


# --------------------------------------------------------------------------------------------------
# Which tensors a skip epoch trains


EXPECTED = {  # (model, bias_layers) -> the parameters a skip epoch trains, and their modules' types
    ("lenet", 1): {"classifier.bias": nn.Linear},
    ("lenet", 2): {"hidden.2.bias": nn.Linear, "classifier.bias": nn.Linear},
    ("lenet", 3): {"hidden.0.bias": nn.Linear, "hidden.2.bias": nn.Linear, "classifier.bias": nn.Linear},
    ("vgg11", 1): {"classifier.bias": nn.Linear},
    ("vgg11", 2): {"features.26.bias": nn.BatchNorm2d, "classifier.bias": nn.Linear},  # the last BN's shift
    ("vgg11", 3): {"features.25.bias": nn.Conv2d, "features.26.bias": nn.BatchNorm2d, "classifier.bias": nn.Linear},
    ("resnet18", 1): {"classifier.bias": nn.Linear},
    ("resnet18", 2): {"layer4.1.bn2.bias": nn.BatchNorm2d, "classifier.bias": nn.Linear},
    # the third layer from the output, layer4.1.conv2, has no bias: it counts as a layer and adds nothing
    ("resnet18", 3): {"layer4.1.bn2.bias": nn.BatchNorm2d, "classifier.bias": nn.Linear},
}


@pytest.mark.parametrize(("model_name", "bias_layers"), list(EXPECTED), ids=[f"{m}-{b}L" for m, b in EXPECTED])
def test_bias_layers_select_the_biases_of_the_last_layers_with_parameters(model_name, bias_layers):
    model = create_model(model_name, 10)
    names = skip_trainable(model, bias_layers)
    expected = EXPECTED[model_name, bias_layers]
    assert sorted(names) == sorted(expected)
    modules = dict(model.named_modules())
    for name in names:
        assert type(modules[name.removesuffix(".bias")]) is expected[name]
    layers = [name for name, _ in layers_with_parameters(model)]
    assert layers[-1] == "classifier" and len(layers) == {"lenet": 5, "vgg11": 17, "resnet18": 41}[model_name]

    method = create_method("wus", {"bias_layers": bias_layers})
    method.setup(context(model))
    params = dict(model.named_parameters())
    assert method.trainable_in_skip == sum(params[n].numel() for n in names)
    assert method.all_params == sum(p.numel() for p in model.parameters())
    assert {id(p) for p in method.kept} == {id(params[n]) for n in names}
    assert len(method.kept) + len(method.frozen) == len(params)


def test_vgg_without_batchnorm_keeps_the_last_convs_bias():
    model = create_model("vgg11", 10, batch_norm=False)
    assert skip_trainable(model, 2) == ["features.18.bias", "classifier.bias"]


def test_bias_layers_beyond_the_model_are_named_before_any_work():
    method = create_method("wus_lr", {"bias_layers": 6})
    assert method.check_run(context(create_model("lenet", 10))) == [
        "methods.wus_lr.bias_layers: 6 exceeds the 5 layers with parameters of LeNet; accepted: 1-5"
    ]


# --------------------------------------------------------------------------------------------------
# Freezing, through the real training loop


def held(phases, **params) -> WeightUpdateSkipping:
    """The `wus` method with its phases scripted per epoch instead of decided by the phase machine."""

    class Held(WeightUpdateSkipping):
        def on_epoch_start(self, epoch, lr):
            self.set_phase(phases[epoch - 1])

    return Held(**params)


def run_config(model="lenet", epochs=3, method="wus", **recipe) -> RunConfig:
    """A few epochs with the WUS recipe's character: weight decay 1e-4, no augmentation, one lr drop."""
    wus_like = dict(weight_decay=1e-4, milestones=(epochs - 1,), augment=False)
    return small_config(epochs, study="wus", method=method, model=model, seed=3, **(wus_like | recipe))


@pytest.mark.parametrize(("model_name", "bias_layers", "samples"), [("lenet", 1, 256), ("vgg11", 2, 64)])
def test_a_skip_epoch_changes_only_the_kept_biases_and_a_normal_epoch_changes_everything(
    model_name, bias_layers, samples
):
    after = []  # (parameters and buffers, optimizer state) at the end of each epoch

    def snapshot(history, state):
        after.append(copy.deepcopy((state["model"], state["optimizer"]["state"])))

    method = held([N, S, N], bias_layers=bias_layers)
    train, test = synthetic_split(samples, seed=1), synthetic_split(32, seed=2)
    fit(run_config(model_name), train, test, method, on_epoch_end=snapshot)
    names = [n for n, _ in method.ctx.model.named_parameters()]  # the optimizer's state is keyed by this order
    kept = set(skip_trainable(method.ctx.model, bias_layers))
    (model1, optim1), (model2, optim2), (model3, optim3) = after

    for i, name in enumerate(names):
        unchanged_by_skip = torch.equal(model1[name], model2[name])
        momentum_unchanged_by_skip = torch.equal(optim1[i]["momentum_buffer"], optim2[i]["momentum_buffer"])
        assert unchanged_by_skip is momentum_unchanged_by_skip is (name not in kept), name
        assert not torch.equal(model2[name], model3[name]), f"{name}: unchanged by a normal epoch"
        assert not torch.equal(optim2[i]["momentum_buffer"], optim3[i]["momentum_buffer"]), name
    assert set(optim3) == set(range(len(names)))  # the optimizer kept every tensor's state through both changes
    for name in model1:
        if name.endswith("running_mean"):  # BatchNorm stays in training mode in skip epochs
            assert not torch.equal(model1[name], model2[name])
    assert all(p.requires_grad for p in method.ctx.model.parameters())  # the last epoch was normal


def test_entering_a_skip_phase_drops_stale_gradients_of_frozen_tensors():
    model = create_model("lenet", 10)
    method = create_method("wus", {})
    method.setup(context(model))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    method.set_phase(SKIP)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["classifier.bias"]
    assert [n for n, p in model.named_parameters() if p.grad is not None] == ["classifier.bias"]
    method.set_phase(NORMAL)
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    ("model_name", "bias_layers", "skip_backward"),
    [
        ("lenet", 1, {"AddmmBackward0": 1}),  # the classifier's bias only
        ("lenet", 2, {"AddmmBackward0": 2, "ReluBackward0": 1}),  # down to hidden.2's bias, no conv
        ("vgg11", 1, {"AddmmBackward0": 1}),
        (  # down to the last BN's shift, through the last pool and ReLU: no conv
            "vgg11",
            2,
            {
                "AddmmBackward0": 1,
                "ViewBackward0": 1,
                "MaxPool2DWithIndicesBackward0": 1,
                "ReluBackward0": 1,
                "NativeBatchNormBackward0": 1,
            },
        ),
    ],
)
def test_a_skip_epoch_computes_no_backward_for_the_frozen_layers(model_name, bias_layers, skip_backward):
    """The autograd profile of a training epoch: per batch, which backward functions ran and which tensors got a
    gradient (AccumulateGrad)."""
    torch.manual_seed(0)
    model = create_model(model_name, 10).to(memory_format=torch.channels_last)
    split = synthetic_split(64)
    data = DeviceData(split, torch.device("cpu"), *channel_stats(torch.from_numpy(split.images)), True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    method = held([N, S], bias_layers=bias_layers)
    method.setup(context(model))
    counts = []
    cfg = run_config(model_name, epochs=2, batch_size=32, augment=False)
    training = Training(cfg, model, optimizer, method, data, data, torch.Generator(), contextlib.nullcontext(),
                        StepCosts(model, channels_last=True), ONE, {})  # fmt: skip
    for epoch in (1, 2):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train_epoch(training, epoch, 0.01)
        names = [e.name for e in prof.events() if not e.name.startswith("autograd::engine")]
        counts.append(
            {k: v // 2 for k, v in collections.Counter(names).items() if "Backward" in k or "Accumulate" in k}
        )
    normal, skip = counts
    loss = {"MeanBackward0": 1, "NllLossBackward0": 1, "LogSoftmaxBackward0": 1}  # cross entropy, every epoch
    assert skip == loss | skip_backward | {"torch::autograd::AccumulateGrad": bias_layers}
    assert normal["ConvolutionBackward0"] == {"lenet": 2, "vgg11": 8}[model_name]
    assert normal["torch::autograd::AccumulateGrad"] == len(list(model.parameters()))


# --------------------------------------------------------------------------------------------------
# The phase machine, on scripted validation accuracies and learning rates


def drive(name, accuracies, lrs=None, **params):
    """Run the method's hooks over scripted epochs as the loop calls them; returns the method and the phases."""
    lrs = lrs or [0.1] * len(accuracies)
    method = create_method(name, {"std_window": 3} | params)
    method.setup(context(create_model("lenet", 10), lrs))
    phases = []
    for epoch, (accuracy, lr) in enumerate(zip(accuracies, lrs, strict=True), 1):
        method.on_epoch_start(epoch, lr)
        method.on_validation_end(epoch, accuracy, lr)
        phases.append(method.epoch_metrics()["phase"])
    return method, phases


# population std of the last 3: epochs 1-6 at least 4.8, epoch 7 (50, 50.5, 50.6) 0.26, epoch 8 0.08
RISING = [10, 20, 30, 40, 50, 50.5, 50.6, 50.7]


def test_two_successive_stable_epochs_make_the_next_the_initial_epoch_and_skipping_follows_it():
    method, phases = drive("wus", [*RISING, 50.8, 50.9, 51.0])
    assert method.initial_epoch == 9  # epochs 7 and 8 below 0.71
    assert phases == [N] * 9 + [S, S]  # "epochs after it are skip epochs"
    metrics = method.run_metrics()
    assert (metrics["initial_epoch"], metrics["skip_epochs"], metrics["normal_epochs"]) == (9, 2, 9)


def test_one_stable_epoch_alone_starts_nothing():
    # std of the last 3 is 0 (stable) at epochs 3, 6, 9 and 10, and 4.7 at the others: epochs 9 and 10 are the
    # first two successive stable epochs -> initial epoch 11
    accuracies = [50, 50, 50, 60, 60, 60, 70, 70, 70, 70, 70, 70]
    method, phases = drive("wus", accuracies)
    assert method.initial_epoch == 11
    assert phases == [N] * 11 + [S]
    assert drive("wus", accuracies[:10])[0].run_metrics()["initial_epoch"] == 0  # chosen, but outside the run
    assert drive("wus", accuracies[:9])[0].initial_epoch == 0  # never held


def test_a_trailing_std_equal_to_the_threshold_is_not_stable():
    """Stable means below the threshold: with a window of 2, accuracies 1 point apart have std 0.5 exactly."""
    on_threshold = [50, 51, 50, 51, 50, 51]  # std 0.5 from epoch 2 on
    assert drive("wus", on_threshold, std_window=2, std_threshold=0.5)[0].initial_epoch == 0
    assert drive("wus", on_threshold, std_window=2, std_threshold=0.51)[0].initial_epoch == 4  # stable at 2 and 3


def test_trailing_std_is_the_population_std_of_the_last_window_and_absent_before():
    rows = []
    method = create_method("wus", {"std_window": 3})
    method.setup(context(create_model("lenet", 10)))
    for epoch, accuracy in enumerate(RISING, 1):
        method.on_epoch_start(epoch, 0.1)
        method.on_validation_end(epoch, accuracy, 0.1)
        rows.append(method.epoch_metrics())
    assert ["val_acc_std" in row for row in rows] == [False, False] + [True] * 6
    assert rows[-1]["val_acc_std"] == pytest.approx(statistics.pstdev([50.5, 50.6, 50.7]))
    assert rows[2]["val_acc_std"] == pytest.approx(math.sqrt(200 / 3))


def test_wus_falls_back_for_one_epoch_when_accuracy_stalls_for_patience_epochs():
    # best 50.7 at epoch 8; epochs 9, 10, 11 are not above it -> epoch 12 normal, then 12-14 -> 15 normal
    flat = [50.7] * 7
    method, phases = drive("wus", RISING + flat, patience=3)
    assert phases == [N] * 9 + [S, S, N, S, S, N]
    assert method.run_metrics()["skip_epochs"] == 4


def test_the_patience_counter_runs_from_the_first_epoch_and_equal_is_not_better():
    # best 50 at epoch 1; 49 and 50 do not beat it -> counter 2 = patience at epoch 3 (epoch 4 already normal)
    # epochs 3-4 stable -> initial epoch 5; counter 2 again at epoch 5 -> epoch 6 normal; epoch 7 -> 8 normal
    method, phases = drive("wus", [50, 49, 50, 50, 50, 50, 50, 50, 50], patience=2)
    assert method.initial_epoch == 5
    assert phases == [N, N, N, N, N, N, S, N, S]


def test_delta_sets_what_counts_as_an_improvement():
    accuracies = [*RISING, 50.8, 50.9, 51.0, 51.1]  # +0.1 per epoch from epoch 6 on
    assert drive("wus", accuracies, patience=3)[1] == [N] * 9 + [S] * 3
    # delta 0.5: best 50 at epoch 5, 50.6 at epoch 7 (50.5 is not above 50 + 0.5); epochs 8-10 are not better
    assert drive("wus", accuracies, patience=3, delta=0.5)[1] == [N] * 9 + [S, N, S]


def test_wus_ignores_learning_rate_changes_and_wus_lr_ignores_stalls():
    lrs = [0.1] * 10 + [0.01] * 10
    flat = [50.0] * 20  # stable from epoch 3, initial epoch 5; never better than epoch 1
    # counter 7 at epochs 8 and 15 -> epochs 9 and 16 normal; the lr change at epoch 11 does nothing
    assert drive("wus", flat, lrs, patience=7)[1] == [N] * 5 + [S] * 3 + [N] + [S] * 6 + [N] + [S] * 4
    assert drive("wus_lr", flat, [0.1] * 20)[1] == [N] * 5 + [S] * 15


LR_DROP = [0.1] * 7 + [0.01] * 7
# stable at epochs 3 and 4 -> initial epoch 5; the lr drops at epoch 8 and the accuracy jumps to 55: the std of the
# last 3 is 2.36 at epoch 8, 2.36 at epoch 9, then 0 at epochs 10 and 11
JUMP = [50.0] * 7 + [55.0] * 7


def test_wus_lr_until_stable_trains_normal_from_an_lr_change_until_the_start_criterion_holds_again():
    method, phases = drive("wus_lr", JUMP, LR_DROP, lr_fallback="until_stable")
    assert phases == [N] * 5 + [S, S] + [N] * 4 + [S] * 3
    # without a jump, the epochs at the new lr are stable at once: epochs 8 and 9 count, 10 skips again
    assert drive("wus_lr", [50.0] * 14, LR_DROP)[1] == [N] * 5 + [S, S, N, N] + [S] * 5
    assert method.run_metrics()["initial_epoch"] == 5


def test_wus_lr_one_epoch_trains_only_the_epoch_of_the_lr_change_normal():
    assert drive("wus_lr", JUMP, LR_DROP, lr_fallback="one_epoch")[1] == [N] * 5 + [S, S, N] + [S] * 6


def test_an_lr_change_before_skipping_was_decided_changes_nothing():
    lrs = [0.1] * 3 + [0.01] * 9  # the lr changes at epoch 4; epochs 3 and 4 stable -> initial epoch 5
    for fallback in ("until_stable", "one_epoch"):
        assert drive("wus_lr", [50.0] * 12, lrs, lr_fallback=fallback)[1] == [N] * 5 + [S] * 7


def test_updated_parameters_follow_equation_1():
    method, _ = drive("wus", [*RISING, 50.8, 50.9, 51.0])
    b, all_params = 10, 62006  # LeNet: the classifier bias, every parameter
    metrics = method.run_metrics()
    assert metrics["trainable_in_skip"] == b
    assert metrics["updated_params_total"] == 2 * b + 9 * all_params
    assert metrics["updated_params_reduction_pct"] == pytest.approx(
        100 * (1 - (2 * b + 9 * all_params) / (11 * all_params))
    )
    assert all(isinstance(v, float) for v in metrics.values())
    assert method.epoch_metrics()["updated_params"] == b


@pytest.mark.parametrize(
    ("name", "params"), [("wus", {"patience": 2}), ("wus_lr", {}), ("wus_lr", {"lr_fallback": "one_epoch"})]
)
def test_state_dict_resumes_the_phase_machine_exactly(name, params):
    accuracies = [50, 49, 50, 50, 50, 51, 51, 51, 55, 55, 55, 55, 55, 55]
    lrs = [0.1] * 8 + [0.01] * 6
    full, phases = drive(name, accuracies, lrs, **params)
    for stop in range(1, len(accuracies)):
        first, _ = drive(name, accuracies[:stop], lrs[:stop], **params)
        buffer = io.BytesIO()
        torch.save(first.state_dict(), buffer)  # what a checkpoint holds
        resumed = create_method(name, {"std_window": 3} | params)
        resumed.setup(context(create_model("lenet", 10), lrs))  # as the loop does on resume: setup, then load
        resumed.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
        rest = []
        for epoch in range(stop + 1, len(accuracies) + 1):
            resumed.on_epoch_start(epoch, lrs[epoch - 1])
            resumed.on_validation_end(epoch, accuracies[epoch - 1], lrs[epoch - 1])
            rest.append(resumed.epoch_metrics()["phase"])
        assert phases[stop:] == rest, f"resumed after epoch {stop}"
        assert resumed.run_metrics() == full.run_metrics()


def test_resuming_a_run_from_a_checkpoint_gives_the_uninterrupted_history():
    """Through the real loop on synthetic data: it learns fast, so a loose threshold starts skipping at epoch 5."""
    cfg = run_config(epochs=7, method="wus_lr", milestones=(5,))
    train, test = synthetic_split(128, seed=1), synthetic_split(64, seed=2)
    args = {"std_window": 2, "std_threshold": 50.0, "lr_fallback": "one_epoch"}
    saved = {}

    def keep_epoch_5(history, state):
        if len(history) == 5:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            saved["state"] = buffer.getvalue()

    full = fit(cfg, train, test, create_method("wus_lr", args), on_epoch_end=keep_epoch_5)
    assert [row["phase"] for row in full] == [N, N, N, N, S, N, S]  # initial epoch 4; the lr changes at epoch 6
    state = torch.load(io.BytesIO(saved["state"]), weights_only=False)
    resumed = fit(cfg, train, test, create_method("wus_lr", args), resume=state)
    timings = ("epoch_train_s", "eval_s")
    assert [{k: v for k, v in r.items() if k not in timings} for r in resumed] == [
        {k: v for k, v in r.items() if k not in timings} for r in full
    ]


# --------------------------------------------------------------------------------------------------
# Params


def with_methods(**sections):
    params = copy.deepcopy(PARAMS)
    params["methods"] |= sections
    return params


BAD = [  # (method, its params, text the error must contain)
    ("wus", {"std_window": 1}, "methods.wus.std_window: 1 is invalid; accepted: an integer >= 2 (epochs)"),
    ("wus", {"std_window": 2.5}, "methods.wus.std_window: 2.5 is invalid"),
    ("wus", {"std_threshold": 0}, "methods.wus.std_threshold: 0 is invalid; accepted: a number > 0"),
    ("wus", {"std_threshold": "low"}, "methods.wus.std_threshold: 'low' is invalid"),
    ("wus", {"patience": 0}, "methods.wus.patience: 0 is invalid; accepted: an integer >= 1 (epochs)"),
    ("wus", {"delta": -1}, "methods.wus.delta: -1 is invalid; accepted: a number >= 0"),
    ("wus", {"bias_layers": 0}, "methods.wus.bias_layers: 0 is invalid; accepted: an integer >= 1"),
    ("wus", {"bias_layers": True}, "methods.wus.bias_layers: True is invalid"),
    ("wus", {"lr_fallback": "one_epoch"}, "methods.wus.lr_fallback: unknown parameter (accepted: std_window,"),
    ("wus_lr", {"lr_fallback": "never"}, "methods.wus_lr.lr_fallback: 'never' is invalid; accepted: until_stable"),
    ("wus_lr", {"patience": 7}, "methods.wus_lr.patience: unknown parameter (accepted: std_window, std_threshold"),
]


@pytest.mark.parametrize(("method", "params", "expected"), BAD, ids=[b[2][:45] for b in BAD])
def test_bad_wus_params_fail_before_any_training_with_a_clear_error(method, params, expected):
    with pytest.raises(ConfigError) as info:
        resolve_run(with_methods(**{method: params}), "wus", "cifar10", "lenet", method, 0)
    assert expected in str(info.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        resolve_run(with_methods(wus={"std_window": 0, "patience": 0, "speed": 2}), "wus", "cifar10", "vgg11", "wus", 0)
    named = [problem.split(":")[0] for problem in info.value.problems]
    assert sorted(named) == ["methods.wus.patience", "methods.wus.speed", "methods.wus.std_window"]


def test_the_wus_grid_trains_both_variants_with_the_papers_knobs_and_recipe():
    grid = PARAMS["grid"]["wus"]
    assert {"baseline", "wus", "wus_lr"} <= set(grid["methods"])
    assert set(grid["models"]) == {"alexnet", "vgg11", "vgg16", "resnet18"}
    assert set(grid["datasets"]) == {"cifar10", "cifar100"}
    for method in ("wus", "wus_lr"):
        cfg = resolve_run(PARAMS, "wus", "cifar100", "resnet18", method, 0)
        recipe = cfg.recipe
        assert (recipe.epochs, recipe.lr, recipe.step_size, recipe.gamma) == (200, 0.1, 30, 0.1)
        assert (recipe.weight_decay, recipe.augment) == (1e-4, False)
        assert cfg.method_args["std_window"] == 5 and cfg.method_args["std_threshold"] == 0.71
        assert cfg.method_args["bias_layers"] == 1
    assert PARAMS["methods"]["wus"]["patience"] == 7 and PARAMS["methods"]["wus"]["delta"] == 0
    assert PARAMS["methods"]["wus_lr"]["lr_fallback"] == "until_stable"


# --------------------------------------------------------------------------------------------------
# The quick setting's thresholds against recorded trajectories

# LeNet's test accuracy over the quick setting's 10 epochs (its `wus` baseline, which WUS follows until it first
# skips) on an Intel Xeon: seeds 0-6 on 2 threads, then seed 0 as CI trained it; then seed 0 on an AMD EPYC of
# family 25 model 17, as `make quickstart` (2 threads) and as CI (1 thread) trained it (docs/measured.md, "The quick
# setting's WUS start"). The 2-epoch std is 3.6-6.0 at epoch 2 and at most 3.25 after.
QUICK_TRAJECTORIES = {  # by seed, and where it trained when not on 2 threads of the Xeon
    "0": [38.66, 46.06, 50.63, 54.72, 56.13, 56.86, 57.66, 57.15, 57.81, 57.78],
    "1": [38.90, 47.61, 50.28, 53.49, 58.15, 58.30, 58.62, 58.55, 59.36, 59.21],
    "2": [36.64, 45.57, 50.46, 53.24, 57.90, 57.42, 58.86, 58.76, 59.40, 59.39],
    "3": [38.09, 48.81, 50.12, 55.14, 57.75, 57.78, 57.73, 58.20, 58.25, 58.38],
    "4": [37.13, 46.30, 48.90, 51.57, 56.96, 57.62, 57.72, 58.49, 58.60, 58.61],
    "5": [35.46, 47.37, 50.37, 52.59, 56.70, 56.79, 57.58, 57.79, 58.09, 58.18],
    "6": [36.25, 44.48, 48.67, 50.19, 56.69, 56.65, 57.47, 57.67, 57.81, 58.04],
    "0-ci": [37.33, 46.62, 49.69, 53.77, 56.53, 56.49, 57.28, 57.55, 57.90, 57.94],
    "0-epyc": [38.74, 46.32, 49.94, 54.10, 56.49, 56.54, 57.37, 57.49, 57.84, 58.08],
    "0-ci-epyc": [38.55, 45.78, 50.45, 53.14, 56.44, 56.67, 57.31, 57.15, 57.73, 57.70],
}


@pytest.mark.parametrize("accuracies", QUICK_TRAJECTORIES.values(), ids=QUICK_TRAJECTORIES.keys())
def test_the_quick_thresholds_start_wus_after_the_lr_drop_on_every_recorded_trajectory(accuracies):
    """params.quick.yaml's thresholds lie outside these trajectories' spread of stds: a threshold within it (2.0)
    started WUS at epoch 5-8 by seed and by CPU, and at 8 left WUS+LR no skip epoch, which failed the quick gate."""
    quick = yaml.safe_load((REPO / "params.quick.yaml").read_text())
    recipe = Recipe(**(PARAMS["recipes"]["wus"] | quick["recipes"]["wus"]))
    lrs = [recipe.lr_at(e) for e in range(1, recipe.epochs + 1)]
    assert len(accuracies) == recipe.epochs and lrs[3] != lrs[4] and lrs[7] != lrs[8]  # the lr drops after 4, 8
    wus, phases = drive("wus", accuracies, lrs, **(PARAMS["methods"]["wus"] | quick["methods"]["wus"]))
    assert wus.initial_epoch == 5 and phases[:6] == [N, N, N, N, N, S]  # after the drop's epoch 5, which skipping loses
    wus_lr, phases = drive("wus_lr", accuracies, lrs, **(PARAMS["methods"]["wus_lr"] | quick["methods"]["wus_lr"]))
    assert wus_lr.initial_epoch in (4, 5) and phases == [N, N, N, N, N, N, S, S, N, N]  # a fall-back at each lr change


# --------------------------------------------------------------------------------------------------
# End to end: the quick pipeline (conftest's `quick`: dvc exp run on params.quick.yaml, LeNet, real CIFAR-10)


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["wus", "wus_lr"])
def test_quick_run_logs_skip_phases_to_mlflow_as_the_phase_machine_decides(quick, method):
    from mlflow import MlflowClient

    name = f"cifar10-lenet-{method}-s0"
    client = MlflowClient(f"sqlite:///{quick / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("wus")
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    assert run.info.status == "FINISHED"

    def logged(metric):
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)]

    phases = logged("phase")
    assert len(phases) == 10 and set(phases) <= {0, 1}
    assert 1 in phases, f"{name}: no skip epoch in the quick run"
    assert logged("updated_params") == [10 if p == 1 else 62006 for p in phases]
    assert len(logged("epoch_train_s")) == 10

    # the logged phases are what the phase machine decides from the logged accuracies and learning rates
    params = yaml.safe_load((quick / "params.yaml").read_text())["methods"][method]
    history = read_csv(quick / "runs" / "wus" / name / "history.csv")
    accuracies, lrs = [float(r["test_acc"]) for r in history], [float(r["lr"]) for r in history]
    replay = create_method(method, params)
    replay.setup(context(create_model("lenet", 10), lrs))
    for epoch, (accuracy, lr) in enumerate(zip(accuracies, lrs, strict=True), 1):
        replay.on_epoch_start(epoch, lr)
        replay.on_validation_end(epoch, accuracy, lr)
        assert replay.phase == phases[epoch - 1], f"{name}: epoch {epoch}"
    assert len(logged("val_acc_std")) == 10 - params["std_window"] + 1

    final = run.data.metrics
    for key, value in replay.run_metrics().items():
        assert final[key] == pytest.approx(value), key
    assert final["skip_epochs"] == phases.count(1) and final["initial_epoch"] >= 3
    assert final["updated_params_total"] == pytest.approx(sum(logged("updated_params")))
    if method == "wus_lr":  # the lr changes at epoch 9, after skipping began: a fall-back to normal
        assert lrs[8] != lrs[7] and phases[8] == 0
