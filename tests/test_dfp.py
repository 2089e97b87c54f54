"""Data Fine-Pruning and random_prune: counts, schedule (simulated and Eq. 3/4), selection, params, exact resume,
and end to end in the quick pipeline (the `quick` fixture of conftest.py)."""

import copy
import io
import itertools
import json
import shutil

import pytest
import torch
import yaml

from cheaptrain import ConfigError
from cheaptrain.config import Recipe, RunConfig, load_params, resolve_run
from cheaptrain.methods import RunContext, create_method
from cheaptrain.methods.dfp import DataFinePruning, paper_pruning_epochs, schedule
from cheaptrain.trainer import fit

from conftest import REPO, read_csv, synthetic_split

DEFAULTS = {k: p.default for k, p in DataFinePruning.PARAMS.items()}

PARAMS = load_params(REPO / "params.yaml")
QUICK = dict(window=5, starting_point=3, attenuation=2.0, block=2, count=1, prune_num=0.3)


def ready(name: str = "dfp", num_samples: int = 10, epochs: int = 10, seed: int = 0, **params) -> DataFinePruning:
    """A method after setup(), as the loop leaves it, on CPU."""
    method = create_method(name, params)
    ctx = RunContext(None, num_samples, epochs, torch.device("cpu"), seed, lambda epoch: 0.1)
    method.setup(ctx)
    return method


def pruning_epochs(plan) -> list[int]:
    return [epoch for epoch, (_, prunes) in enumerate(plan, start=1) if prunes]


# --- monitoring (Algorithm 1) --------------------------------------------------------------------------------------


def test_a_batch_increments_exactly_the_samples_above_mean_times_one_plus_tolerance():
    method = ready(tolerance=0.5, window=5, starting_point=3)
    assert method.on_epoch_start(1, 0.1) is None
    # mean 2, threshold 3: only the 4.0 counts; 3.0 sits on the threshold (strictly greater counts)
    method.on_batch_end(torch.tensor([2, 5, 7, 9]), torch.tensor([1.0, 3.0, 4.0, 0.0]))
    assert method.counts.tolist() == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    # mean 1.5, threshold 2.25: samples 0 and 7
    method.on_batch_end(torch.tensor([0, 1, 7, 8]), torch.tensor([2.5, 0.5, 2.5, 0.5]))
    assert method.counts.tolist() == [1, 0, 0, 0, 0, 0, 0, 2, 0, 0]
    metrics = method.epoch_metrics()
    assert metrics["flagged_samples"] == 3 and metrics["dropping_count_max"] == 2 and metrics["pruned_samples"] == 0
    assert metrics["selection_s"] == method.run_metrics()["selection_s_total"]  # epoch 1's selection: the run's so far


def test_tolerance_zero_flags_everything_above_the_batch_mean():
    method = ready(tolerance=0.0, window=5, starting_point=3)
    method.on_epoch_start(1, 0.1)
    method.on_batch_end(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 2.1]))  # mean 2.025
    assert method.counts[:4].tolist() == [0, 0, 1, 1]


def test_counts_reset_at_the_start_of_every_epoch_divisible_by_the_window():
    method = ready(window=3, starting_point=2, epochs=7, tolerance=0.0)
    seen = []
    for epoch in range(1, 8):
        method.on_epoch_start(epoch, 0.1)
        seen.append(method.counts[0].item())  # after the reset, before this epoch's batches
        method.on_batch_end(torch.tensor([0, 1]), torch.tensor([5.0, 1.0]))  # sample 0 is flagged every epoch
        assert method.epoch_metrics()["flagged_samples"] == 1
    assert seen == [0, 1, 0, 1, 2, 0, 1]  # resets at epochs 3 and 6


# --- schedule (Algorithm 2) ----------------------------------------------------------------------------------------


def test_schedule_hand_worked_attenuating_once_per_window():
    # window 6: windows are epochs 1-5, 6-11, 12-17, 18; starting points 4, int(4/2)=2, 1, 0
    plan = schedule(18, window=6, starting_point=4, attenuation=2, attenuate_every="window", block=1, count=1)
    assert [sp for sp, _ in plan] == [4] * 5 + [2] * 6 + [1] * 6 + [0]
    assert pruning_epochs(plan) == [4, 5, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18]


def test_schedule_hand_worked_attenuating_every_epoch_after_the_first_window():
    # the literal pseudo code: epochs 7, 8, 9 divide the starting point 4 -> 2 -> 1 -> 0
    plan = schedule(18, window=6, starting_point=4, attenuation=2, attenuate_every="epoch", block=1, count=1)
    assert [sp for sp, _ in plan] == [4] * 6 + [2, 1] + [0] * 10
    assert pruning_epochs(plan) == [4, 5, 8, *range(9, 19)]


def test_schedule_blocks_and_counts():
    # block 3, count 2: e mod 3 in {0, 1}; window 10, starting point 5 constant
    plan = schedule(20, window=10, starting_point=5, attenuation=1, attenuate_every="window", block=3, count=2)
    assert pruning_epochs(plan) == [6, 7, 9, 15, 16, 18, 19]


def test_the_quick_setting_prunes_epochs_4_6_8_10():
    quick = yaml.safe_load((REPO / "params.quick.yaml").read_text())["methods"]["dfp"]
    assert quick == QUICK
    method = create_method("dfp", QUICK)
    assert pruning_epochs(method.planned(10)) == [4, 6, 8, 10]


def eq3_conditions_hold(epochs, window, a, block, count) -> bool:
    """Eq. 3's setting: epochs a multiple of the window, and the block grid aligned with the starting point."""
    return epochs % window == 0 and (count == block or (window % block == 0 and a % block == 0))


def test_simulated_pruning_epochs_equal_eq3_where_its_conditions_hold():
    checked = 0
    for window, block in itertools.product(range(1, 13), range(1, 7)):
        for a, count, windows in itertools.product(range(window), range(1, block + 1), (1, 2, 5)):
            epochs = window * windows
            if not eq3_conditions_hold(epochs, window, a, block, count):
                continue
            plan = schedule(epochs, window, a, 1.0, "window", block, count)
            assert sum(p for _, p in plan) == paper_pruning_epochs(epochs, window, a, block, count), (window, a)
            checked += 1
    assert checked > 300


def test_eq_metric_is_logged_only_for_a_constant_starting_point():
    constant = ready(num_samples=100, epochs=40, window=10, starting_point=4, attenuation=1.0, block=2, count=1)
    metrics = constant.run_metrics()
    assert metrics["planned_pruning_epochs"] == metrics["planned_pruning_epochs_eq"] == 12  # (3*1 + 0) * 4
    attenuated = ready(num_samples=100, epochs=40, window=10, starting_point=4, attenuation=2.0, block=2, count=1)
    assert "planned_pruning_epochs_eq" not in attenuated.run_metrics()
    # Eq. 4 as printed counts n mod w - a epochs of the partial last window; the schedule prunes at offsets a..n mod w
    partial = ready(num_samples=100, epochs=25, window=10, starting_point=4, attenuation=1.0, block=1, count=1)
    assert partial.run_metrics()["planned_pruning_epochs_eq"] == 13
    assert partial.run_metrics()["planned_pruning_epochs"] == 14
    short_tail = ready(num_samples=100, epochs=22, window=10, starting_point=4, attenuation=1.0, block=1, count=1)
    assert "planned_pruning_epochs_eq" not in short_tail.run_metrics()


def test_defaults_plan_the_papers_saving_on_the_dfp_recipe():
    assert PARAMS["methods"]["dfp"] == DEFAULTS  # the code's defaults are the ones params.yaml shows
    recipe = PARAMS["recipes"]["dfp"]
    assert (recipe["epochs"], recipe["milestones"]) == (200, [60, 120, 160])
    method = ready(num_samples=50_000, epochs=recipe["epochs"])
    plan = method.plan
    assert [sp for sp, _ in plan[18:21]] == [16, 8, 8]  # attenuated at epoch 20, the second window's start
    assert pruning_epochs(plan)[:8] == [16, 18, 28, 30, 32, 34, 36, 38]
    metrics = method.run_metrics()
    assert metrics["planned_pruning_epochs"] == 85
    assert metrics["planned_saving_pct"] == pytest.approx(12.75)  # the paper's ResNet-18 speed-up: 12.76 (Table 1)


# --- selection -----------------------------------------------------------------------------------------------------


def test_a_pruning_epoch_keeps_exactly_n_minus_prune_num_distinct_samples_with_the_lowest_counts():
    method = ready(num_samples=1000, epochs=10, prune_num=300, **{k: v for k, v in QUICK.items() if k != "prune_num"})
    method.counts.copy_(torch.randint(0, 6, (1000,), generator=torch.Generator().manual_seed(1)))
    counts = method.counts.clone()
    assert method.on_epoch_start(3, 0.1) is None  # a normal epoch: the loop trains all samples
    assert method.epoch_metrics()["pruned_samples"] == 0
    kept = method.on_epoch_start(4, 0.1)
    assert len(kept) == 700 and len(set(kept.tolist())) == 700
    assert kept.tolist() == sorted(kept.tolist())
    pruned = torch.ones(1000, dtype=torch.bool)
    pruned[kept] = False
    assert counts[kept].max() <= counts[pruned].min()  # every sample left out counts at least as high as any kept
    assert method.epoch_metrics()["pruned_samples"] == 300


def test_a_pruning_epoch_that_begins_a_window_selects_by_the_last_windows_counts_then_resets_them():
    """Once the starting point reaches 0, epochs e mod window == 0 prune (the quick setting's epoch 10, the papers'
    100, 120, ...): they read the full last window's counts, not the new window's zeros, which would pick at random."""
    method = ready(num_samples=1000, epochs=10, **QUICK)
    assert method.plan[9] == (0, True)  # epoch 10: starting point 0, a pruning epoch, 10 mod 5 == 0
    for epoch in range(1, 10):
        method.on_epoch_start(epoch, 0.1)
    method.counts.copy_(torch.randint(0, 6, (1000,), generator=torch.Generator().manual_seed(2)))  # epochs 5-9's
    counts = method.counts.clone()
    kept = method.on_epoch_start(10, 0.1)
    assert len(kept) == 700
    pruned = torch.ones(1000, dtype=torch.bool)
    pruned[kept] = False
    assert counts[kept].max() <= counts[pruned].min()  # the highest counts of the last window left out
    assert method.counts.sum() == 0  # and then the new window begins


def test_a_fraction_is_of_the_training_set_and_ties_break_at_random_from_the_seed():
    def kept(seed: int) -> list[int]:
        method = ready(num_samples=1000, epochs=10, seed=seed, **QUICK)  # all counts 0: every sample ties
        return method.on_epoch_start(4, 0.1).tolist()

    assert len(kept(0)) == 700  # 30% of 1000 left out
    assert kept(0) == kept(0)
    assert kept(0) != kept(1)


def test_random_prune_leaves_out_the_same_number_regardless_of_the_counts():
    dfp = ready("dfp", num_samples=1000, **QUICK)
    control = ready("random_prune", num_samples=1000, **QUICK)
    high = torch.arange(1000) >= 700  # the 300 highest counts
    for method in (dfp, control):
        method.counts.copy_(high.int())
    assert dfp.plan == control.plan
    dfp_kept, control_kept = dfp.on_epoch_start(4, 0.1), control.on_epoch_start(4, 0.1)
    assert len(control_kept) == len(dfp_kept) == 700 and len(set(control_kept.tolist())) == 700
    assert not high[dfp_kept].any()  # dfp leaves out exactly the high counts
    assert 0.2 < high[control_kept].float().mean() < 0.4  # random_prune keeps about 30% of them
    assert control.epoch_metrics()["pruned_samples"] == dfp.epoch_metrics()["pruned_samples"] == 300


# --- through the training loop -------------------------------------------------------------------------------------

TRAIN, TEST = synthetic_split(300, seed=1), synthetic_split(100, seed=2)


def config(method: str, epochs: int = 5) -> RunConfig:
    recipe = Recipe(
        epochs=epochs, batch_size=32, lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=False,
        schedule="multistep", milestones=(3,), gamma=0.2, augment=True,
    )  # fmt: skip
    knobs = dict(window=3, starting_point=1, attenuation=1.0, block=2, count=1, prune_num=0.2)
    return RunConfig(
        study="test", dataset="cifar10", model="lenet", method=method, seed=3, recipe=recipe,
        method_args=knobs, device="cpu",
    )  # fmt: skip


class Watched(DataFinePruning):
    """dfp, recording the counts at each selection and the samples each epoch trains."""

    def on_epoch_start(self, epoch, lr):
        self.before = self.counts.clone()
        kept = super().on_epoch_start(epoch, lr)
        self.trained = []
        self.seen = getattr(self, "seen", {})
        self.seen[epoch] = (self.before, kept, self.trained)
        return kept

    def on_batch_end(self, indices, losses):
        self.trained.append(indices.clone())
        super().on_batch_end(indices, losses)


def test_in_the_loop_a_pruning_epoch_trains_the_kept_samples_once_and_a_normal_epoch_all():
    cfg = config("dfp")
    method = Watched(**cfg.method_args)
    history = fit(cfg, TRAIN, TEST, method)
    prunes = pruning_epochs(method.plan)
    assert prunes == [2, 4]  # e mod 3 >= 1 and even
    for row in history:
        before, kept, trained = method.seen[row["epoch"]]
        trained = torch.cat(trained)
        assert len(set(trained.tolist())) == len(trained) == row["trained_samples"]
        if row["epoch"] in prunes:
            assert row["pruned_samples"] == 60 and row["trained_samples"] == 240
            assert sorted(trained.tolist()) == kept.tolist()
            left_out = torch.ones(300, dtype=torch.bool)
            left_out[kept] = False
            assert before[kept].max() <= before[left_out].min()
        else:
            assert row["pruned_samples"] == 0 and row["trained_samples"] == 300 and kept is None
        assert row["flagged_samples"] > 0 or row["epoch"] == 1  # epoch 1 starts with nearly equal losses
    metrics = method.run_metrics()
    assert metrics["pruning_epochs"] == metrics["planned_pruning_epochs"] == 2
    assert metrics["pruned_samples_total"] == 120
    assert metrics["planned_saving_pct"] == pytest.approx(100 * 2 * 60 / (5 * 300))
    assert metrics["overhead_s"] == pytest.approx(metrics["selection_s_total"] + metrics["monitoring_s"])
    assert metrics["monitoring_s"] > 0 and metrics["selection_s_total"] > 0


def test_baseline_and_dfp_see_the_same_data_until_the_first_pruning_epoch():
    dfp_history = fit(config("dfp", epochs=2), TRAIN, TEST, create_method("dfp", config("dfp").method_args))
    base_history = fit(config("baseline", epochs=2), TRAIN, TEST, create_method("baseline"))
    assert dfp_history[0]["train_loss"] == base_history[0]["train_loss"]  # epoch 1: same order, same augmentation
    assert dfp_history[1]["trained_samples"] == 240


TIMINGS = ("epoch_train_s", "eval_s", "selection_s")


@pytest.mark.parametrize("name", ["dfp", "random_prune"])
def test_resuming_from_a_checkpoint_gives_the_uninterrupted_run(name):
    saved = {}

    def keep_epoch_3(history, state):
        if len(history) == 3:  # after the pruning epoch 2 and a normal epoch; in the middle of the second window
            buffer = io.BytesIO()
            torch.save(state, buffer)
            saved["state"] = buffer.getvalue()

    cfg = config(name)
    full_method = create_method(name, cfg.method_args)
    full = fit(cfg, TRAIN, TEST, full_method, on_epoch_end=keep_epoch_3)
    state = torch.load(io.BytesIO(saved["state"]), weights_only=False)
    resumed_method = create_method(name, cfg.method_args)
    resumed = fit(cfg, TRAIN, TEST, resumed_method, resume=state)

    def strip(history):
        return [{k: v for k, v in row.items() if k not in TIMINGS} for row in history]

    assert strip(resumed) == strip(full)
    assert torch.equal(resumed_method.counts, full_method.counts)
    untimed = ("pruning_epochs", "pruned_samples_total", "planned_pruning_epochs", "planned_saving_pct")
    assert {k: resumed_method.run_metrics()[k] for k in untimed} == {k: full_method.run_metrics()[k] for k in untimed}


# --- params --------------------------------------------------------------------------------------------------------

BAD = [  # (params, text the error must contain)
    ({"window": 0}, "methods.dfp.window: 0 is invalid; accepted: a positive integer"),
    (
        {"window": 20, "starting_point": 20},
        "methods.dfp.starting_point: 20 is invalid; accepted: an integer in [0, window - 1] = [0, 19]",
    ),
    ({"starting_point": -1}, "methods.dfp.starting_point: -1 is invalid"),
    ({"block": 2, "count": 3}, "methods.dfp.count: 3 is invalid; accepted: an integer in [1, block] = [1, 2]"),
    ({"count": 0}, "methods.dfp.count: 0 is invalid"),
    ({"block": -2}, "methods.dfp.block: -2 is invalid; accepted: a positive integer"),
    ({"tolerance": -0.1}, "methods.dfp.tolerance: -0.1 is invalid; accepted: a number >= 0"),
    ({"attenuation": 0.5}, "methods.dfp.attenuation: 0.5 is invalid; accepted: a number >= 1"),
    ({"attenuate_every": "batch"}, "methods.dfp.attenuate_every: 'batch' is invalid; accepted: window | epoch"),
    ({"prune_num": 1.0}, "methods.dfp.prune_num: 1.0 is invalid; accepted: a number of samples (an integer >= 1)"),
    ({"prune_num": -5}, "methods.dfp.prune_num: -5 is invalid"),
    ({"prune_num": 0}, "methods.dfp.prune_num: 0 is invalid"),
    ({"prune_num": "half"}, "methods.dfp.prune_num: 'half' is invalid"),
    ({"window": True}, "methods.dfp.window: True is invalid"),
    ({"pruning_window": 20}, "methods.dfp.pruning_window: unknown parameter (accepted: tolerance, window,"),
]


@pytest.mark.parametrize(("change", "expected"), BAD, ids=[b[1][12:50] for b in BAD])
def test_bad_params_fail_in_config_validation_before_any_training(change, expected):
    params = copy.deepcopy(PARAMS)
    params["methods"]["dfp"] = DEFAULTS | change
    with pytest.raises(ConfigError) as info:
        resolve_run(params, "dfp", "cifar10", "lenet", "dfp", 0)
    assert expected in str(info.value)


def test_every_problem_is_reported_at_once_and_random_prune_names_its_own_section():
    with pytest.raises(ConfigError) as info:
        create_method("random_prune", {"window": 0, "count": 5, "block": 2, "tolerance": -1})
    named = sorted(problem.split(":")[0].removeprefix("methods.random_prune.") for problem in info.value.problems)
    assert named == ["count", "tolerance", "window"]  # each under random_prune's own section
    assert all(p.startswith("methods.random_prune.") for p in info.value.problems)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"prune_num": 300}, "methods.dfp.prune_num: 300 prunes 300 of the 300 training samples"),
        ({"prune_num": 0.999}, "methods.dfp.prune_num: 0.999 prunes 300 of the 300"),
        ({"prune_num": 0.001}, "methods.dfp.prune_num: 0.001 prunes 0 of the 300"),
        ({"window": 20, "starting_point": 10}, "methods.dfp: the schedule plans no pruning epoch in this run's 5"),
    ],
)
def test_what_needs_the_run_is_checked_before_any_work(params, expected):
    method = create_method("dfp", params)
    problems = method.check_run(RunContext(None, 300, 5, torch.device("cpu"), 0, lambda epoch: 0.1))
    assert any(expected in p for p in problems), problems


def test_random_prune_is_the_same_yaml_node_as_dfp_and_dvc_set_param_keeps_it_so(tmp_path):
    """`dvc exp run -S` rewrites params.yaml through dvc.utils.hydra.apply_overrides: an override of methods.dfp
    must reach random_prune too, and the file must keep one node (an anchor and its alias)."""
    from dvc.utils.hydra import apply_overrides

    assert PARAMS["methods"]["random_prune"] is PARAMS["methods"]["dfp"]
    params_file = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params_file)
    apply_overrides(params_file, ["methods.dfp.window=10", "methods.dfp.prune_num=5000"])
    changed = load_params(params_file)
    assert changed["methods"]["random_prune"] is changed["methods"]["dfp"]
    assert changed["methods"]["dfp"] == DEFAULTS | {"window": 10, "prune_num": 5000}
    assert "random_prune: &dfp_schedule" in params_file.read_text()


# --- end to end: the quick pipeline --------------------------------------------------------------------------------


def final_metric(repo, method: str, key: str) -> float:
    return json.loads((repo / "runs" / "dfp" / f"cifar10-lenet-{method}-s0" / "metrics.json").read_text())[key]


QUICK_TRAIN_SIZE = 25_000  # params.quick.yaml: download.cifar10.train_size
PRUNED_EPOCHS = dict.fromkeys((4, 6, 8, 10), 7_500)  # 30% of them in the quick setting


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["dfp", "random_prune"])
def test_quick_pipeline_prunes_the_planned_epochs_visibly_in_mlflow(quick, method):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{quick / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("dfp")
    name = f"cifar10-lenet-{method}-s0"
    (run,) = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    assert run.info.status == "FINISHED"
    # the quick knobs, set by `dvc exp run -S methods.dfp.*`, reached this run (random_prune: through the alias)
    assert {k: run.data.params[f"method_args.{k}"] for k in QUICK} == {k: str(v) for k, v in QUICK.items()}

    def per_epoch(metric: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run.info.run_id, metric)}

    pruned = per_epoch("pruned_samples")
    assert pruned == {epoch: PRUNED_EPOCHS.get(epoch, 0) for epoch in range(1, 11)}
    assert per_epoch("trained_samples") == {epoch: QUICK_TRAIN_SIZE - n for epoch, n in pruned.items()}
    assert all(v > 0 for v in per_epoch("flagged_samples").values())
    assert all(v >= 1 for v in per_epoch("dropping_count_max").values())
    assert sorted(per_epoch("selection_s")) == list(range(1, 11))
    metrics = run.data.metrics
    assert metrics["planned_pruning_epochs"] == metrics["pruning_epochs"] == 4
    assert metrics["planned_saving_pct"] == pytest.approx(12.0)
    assert metrics["pruned_samples_total"] == 30_000
    assert metrics["overhead_s"] > 0  # its share of the training time: benchmarks/dfp.py measures it (<= 0.5%)
    assert "planned_pruning_epochs_eq" not in metrics  # the starting point attenuates: Eq. 3/4 do not apply
    history = read_csv(quick / "runs" / "dfp" / name / "history.csv")
    assert [int(row["pruned_samples"]) for row in history] == [PRUNED_EPOCHS.get(e, 0) for e in range(1, 11)]


@pytest.mark.e2e
def test_quick_dfp_keeps_a_reasonable_accuracy(quick):
    best3 = {method: final_metric(quick, method, "best3_acc") for method in ("baseline", "dfp", "random_prune")}
    assert best3["dfp"] >= 55 and best3["random_prune"] >= 55, best3
    assert best3["dfp"] >= best3["baseline"] - 5, best3


@pytest.mark.e2e
def test_the_quick_experiment_kept_random_prune_aliased_to_dfp(quick):
    params = load_params(quick / "params.yaml")
    assert params["methods"]["random_prune"] is params["methods"]["dfp"]
    assert params["methods"]["dfp"]["window"] == QUICK["window"]
