"""Params: learning-rate schedules, resolution of every grid run, and clear errors for bad input."""

import copy
import dataclasses
import re
from typing import ClassVar

import numpy as np
import pytest
import yaml

from cheaptrain import ConfigError, Param, UserError
from cheaptrain.aggregate import grid_runs
from cheaptrain.config import Recipe, load_params, resolve_run, validate_grid
from cheaptrain.methods import METHODS, Method, create_method

from conftest import REPO

PARAMS = load_params(REPO / "params.yaml")


def recipe(**overrides) -> Recipe:
    values = (
        dict(
            epochs=200,
            batch_size=128,
            lr=0.1,
            momentum=0.9,
            weight_decay=5e-4,
            nesterov=False,
            schedule="multistep",
            milestones=(60, 120, 160),
            gamma=0.2,
        )
        | overrides
    )
    return Recipe(**values)


def test_multistep_drops_after_each_milestone():
    r = recipe()
    assert [r.lr_at(e) for e in (1, 60)] == [0.1, 0.1]
    assert r.lr_at(61) == pytest.approx(0.02)
    assert r.lr_at(120) == pytest.approx(0.02)
    assert r.lr_at(121) == pytest.approx(0.004)
    assert r.lr_at(161) == pytest.approx(0.0008)
    assert r.lr_at(200) == pytest.approx(0.0008)


def test_step_divides_every_step_size_epochs():
    r = recipe(schedule="step", step_size=30, gamma=0.1, milestones=())
    assert r.lr_at(30) == 0.1
    assert r.lr_at(31) == pytest.approx(0.01)
    assert r.lr_at(61) == pytest.approx(0.001)
    assert r.lr_at(200) == pytest.approx(0.1 * 0.1**6)


def test_cosine_starts_at_lr_and_decays_to_near_zero():
    r = recipe(schedule="cosine", epochs=100)
    assert r.lr_at(1) == pytest.approx(0.1)
    assert r.lr_at(51) == pytest.approx(0.05)
    assert 0 < r.lr_at(100) < 1e-3
    assert all(r.lr_at(e) > r.lr_at(e + 1) for e in range(1, 100))


def test_every_default_grid_run_resolves_with_its_studys_recipe():
    runs = list(grid_runs(PARAMS))
    assert runs, "the default grid trains nothing"
    for study, dataset, model, method, seed in runs:
        cfg = resolve_run(PARAMS, study, dataset, model, method, seed)
        assert cfg.recipe.epochs == 200
        assert cfg.out_dir.as_posix() == f"runs/{study}/{dataset}-{model}-{method}-s{seed}"
    dfp = resolve_run(PARAMS, "dfp", "cifar10", "resnet18", "baseline", 0).recipe
    wus = resolve_run(PARAMS, "wus", "cifar10", "resnet18", "baseline", 0).recipe
    assert (dfp.weight_decay, dfp.milestones, dfp.gamma, dfp.augment) == (5e-4, (60, 120, 160), 0.2, True)
    assert (wus.weight_decay, wus.step_size, wus.gamma, wus.augment) == (1e-4, 30, 0.1, False)


def test_quick_overlay_only_names_keys_of_params_yaml():
    overlay = yaml.safe_load((REPO / "params.quick.yaml").read_text())

    def check(over, base, path):
        for key, value in over.items():
            assert key in base, f"params.quick.yaml sets {path}{key}, which params.yaml does not have"
            if isinstance(value, dict):
                check(value, base[key], f"{path}{key}.")

    check(overlay, PARAMS, "")


def changed(value):
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, tuple):
        return (*value, 1)
    if isinstance(value, dict):
        return {**value, "other": 1}
    raise TypeError(value)


def test_fingerprint_changes_with_any_setting():
    """A checkpoint resumes only a run of the same settings: each field of the configuration and of its recipe moves
    the fingerprint, the ledger mode alone does not."""
    a = resolve_run(PARAMS, "dfp", "cifar10", "lenet", "dfp", 0)
    assert a.fingerprint() == resolve_run(PARAMS, "dfp", "cifar10", "lenet", "dfp", 0).fingerprint()
    params = copy.deepcopy(PARAMS)
    params["recipes"]["dfp"]["lr"] = 0.05
    assert a.fingerprint() != resolve_run(params, "dfp", "cifar10", "lenet", "dfp", 0).fingerprint()
    unmoved = []
    for f in dataclasses.fields(a):
        value = getattr(a, f.name)
        if dataclasses.is_dataclass(value):
            variants = [
                (f"{f.name}.{g.name}", dataclasses.replace(value, **{g.name: changed(getattr(value, g.name))}))
                for g in dataclasses.fields(value)
            ]
        else:
            variants = [(f.name, changed(value))]
        for name, other in variants:
            if dataclasses.replace(a, **{f.name: other}).fingerprint() == a.fingerprint():
                unmoved.append(name)
    assert unmoved == ["ledger"]
    assert a.method_args  # dfp's knobs: a change among them moves it too (above)


def with_change(path: str, value):
    params = copy.deepcopy(PARAMS)
    *parents, last = path.split(".")
    node = params
    for key in parents:
        node = node[key]
    node[last] = value
    return params


BAD = [  # (change to params, run overrides, text the error must contain)
    (("recipes.dfp.epochs", 0), {}, "recipes.dfp.epochs: 0 is invalid; accepted: a positive integer"),
    (("recipes.dfp.epochs", -5), {}, "recipes.dfp.epochs"),
    (("recipes.dfp.batch_size", 0), {}, "recipes.dfp.batch_size: 0 is invalid; accepted: a positive integer"),
    (("recipes.dfp.lr", 0), {}, "recipes.dfp.lr: 0 is invalid; accepted: a positive number"),
    (("recipes.dfp.lr", "fast"), {}, "recipes.dfp.lr"),
    (("recipes.dfp.milestones", [60, 250]), {}, "recipes.dfp.milestones: [60, 250] lie outside the run"),
    (("recipes.dfp.milestones", [120, 60]), {}, "accepted: increasing epoch numbers"),
    (("recipes.dfp.schedule", "linear"), {}, "accepted: multistep | step | cosine"),
    (("recipes.wus.step_size", 0), {"study": "wus"}, "recipes.wus.step_size"),
    (("recipes.dfp.momentum", 1.5), {}, "recipes.dfp.momentum"),
    (("recipes.dfp.learning_rate", 0.1), {}, "recipes.dfp.learning_rate: unknown setting"),
    (("train.device", "tpu"), {}, "train.device: 'tpu' is invalid; accepted: auto | cpu | cuda | cuda:N"),
    (("train.eval_batch_size", 0), {}, "train.eval_batch_size"),
    (("methods.baseline", {"tolerance": 1}), {}, "methods.baseline.tolerance: unknown parameter"),
    (
        ("recipes.dfp.model_args", {"resnet18": {"batch_norm": False}}),
        {"model": "resnet18"},
        "recipes.dfp.model_args.resnet18",
    ),
    (("recipes.dfp.model_args", {"vgg16": True}), {}, "recipes.dfp.model_args: {'vgg16': True} is invalid"),
    (None, {"dataset": "mnist"}, "dataset 'mnist': unknown (accepted: cifar10, cifar100)"),
    (None, {"model": "resnet9000"}, "model 'resnet9000': unknown (accepted: "),
    (None, {"method": "magic"}, "method 'magic': unknown (accepted: baseline"),
    (None, {"study": "nope"}, "study 'nope': no recipes.nope in params"),
    (None, {"seed": -1}, "seed -1"),
    # every recipe is checked alike (the wus study reads recipes.wus)
    (("recipes.wus.epochs", 0), {"study": "wus"}, "recipes.wus.epochs: 0 is invalid; accepted: a positive integer"),
    (("recipes.wus.epochs", 2.5), {"study": "wus"}, "recipes.wus.epochs: 2.5 is invalid; accepted: a positive integer"),
    (("recipes.wus.batch_size", -128), {"study": "wus"}, "recipes.wus.batch_size: -128 is invalid; accepted: a posi"),
    (("recipes.wus.lr", -0.1), {"study": "wus"}, "recipes.wus.lr: -0.1 is invalid; accepted: a positive number"),
    (("recipes.dfp.lr", float("nan")), {}, "recipes.dfp.lr: nan is invalid; accepted: a positive number"),
    (("recipes.dfp.lr", True), {}, "recipes.dfp.lr: True is invalid; accepted: a positive number"),
    (("recipes.dfp.batch_size", 12.8), {}, "recipes.dfp.batch_size: 12.8 is invalid; accepted: a positive integer"),
    (("recipes.dfp.milestones", [0, 60]), {}, "recipes.dfp.milestones: [0, 60] lie outside the run"),
    (("recipes.dfp.milestones", [60, 200]), {}, "lie outside the run; accepted: epochs in [1, 199]"),
    (("recipes.wus.step_size", 200), {"study": "wus"}, "recipes.wus.step_size: 200 never changes the lr"),
    (("recipes.dfp.gamma", 0), {}, "recipes.dfp.gamma: 0 is invalid; accepted: a number in (0, 1]"),
    (("recipes.dfp.weight_decay", -1), {}, "recipes.dfp.weight_decay: -1 is invalid; accepted: a number >= 0"),
    (("train.amp", "yes"), {}, "train.amp: 'yes' is invalid; accepted: auto | bf16 | off"),
    (("train.threads", 0), {}, "train.threads: 0 is invalid; accepted: auto | a positive integer"),
    (("train.cudnn_benchmark", "yes"), {}, "train.cudnn_benchmark: 'yes' is invalid; accepted: true or false"),
    (("train.fused_sgd", 1), {}, "train.fused_sgd: 1 is invalid; accepted: true or false"),
    (("train.compile", "fast"), {}, "train.compile: 'fast' is invalid; accepted: true | false | a torch.compile mode "
     "(default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs)"),
    (("train.ledger", "keep"), {}, "train.ledger: 'keep' is invalid; accepted: ignore | record | retrain"),
    (("methods.ranged", {"fraction": 1.5}), {"method": "ranged"}, "methods.ranged.fraction: 1.5 is invalid; accepted"),
    (("recipes.dfp.per_model", {"lenet": {"lr": -1}}), {}, "recipes.dfp.per_model.lenet.lr: -1 is invalid; accepted"),
    (("recipes.dfp.per_model", {"lenet": {"rate": 1}}), {}, "recipes.dfp.per_model.lenet.rate: unknown setting"),
    (("recipes.dfp.per_model", {"lenet": 0.02}), {}, "recipes.dfp.per_model: {'lenet': 0.02} is invalid"),
    (("methods", None), {}, "methods: missing; accepted: a mapping of method name to its parameters"),
    (("methods.dfp", "x"), {"method": "dfp"}, "methods.dfp: 'x'; accepted: a mapping of its parameters"),
    # what only the run tells: the training-set size, the model's layers, the schedule over its epochs
    (("methods.dfp", {"prune_num": 50000}), {"method": "dfp"}, "methods.dfp.prune_num: 50000 prunes 50000 of the"),
    (("methods.wus", {"bias_layers": 10000}), {"study": "wus", "method": "wus"}, "bias_layers: 10000 exceeds the 5"),
    (("methods.dfp", {"starting_point": 19, "attenuation": 1, "block": 2, "count": 1}), {"method": "dfp"},
     "methods.dfp: the schedule plans no pruning epoch in this run's 200 epochs"),
]  # fmt: skip


class Ranged(Method):
    """A method with a parameter that has a range, as DFP's and WUS's have, declared the one way all methods do."""

    name = "ranged"
    PARAMS: ClassVar[dict[str, Param]] = {"fraction": Param(0.5, lambda v: 0 < v < 1, "a number in (0, 1)")}


@pytest.fixture(autouse=True)
def _ranged_method(monkeypatch):
    monkeypatch.setitem(METHODS, "ranged", Ranged)


@pytest.mark.parametrize(("change", "run", "expected"), BAD, ids=[b[2][:40] for b in BAD])
def test_bad_params_fail_before_any_work_with_a_clear_error(change, run, expected):
    params = with_change(*change) if change else PARAMS
    args = {"study": "dfp", "dataset": "cifar10", "model": "lenet", "method": "baseline", "seed": 0} | run
    with pytest.raises(ConfigError) as info:
        resolve_run(params, **args)
    assert expected in str(info.value)


def test_a_negative_epochs_is_one_problem_not_two():
    with pytest.raises(ConfigError) as info:
        resolve_run(with_change("recipes.dfp.epochs", -1), "dfp", "cifar10", "lenet", "baseline", 0)
    assert info.value.problems == ["recipes.dfp.epochs: -1 is invalid; accepted: a positive integer"]


def test_a_method_missing_from_params_is_named_not_defaulted():
    params = copy.deepcopy(PARAMS)
    del params["methods"]["dfp"]
    with pytest.raises(ConfigError, match=r"methods.dfp: missing; accepted: a mapping of its parameters"):
        resolve_run(params, "dfp", "cifar10", "lenet", "dfp", 0)


@pytest.mark.parametrize("compile", [False, True, "reduce-overhead"])
def test_train_compile_takes_a_switch_or_a_torch_compile_mode(compile):
    assert resolve_run(with_change("train.compile", compile), "dfp", "cifar10", "lenet", "dfp", 0).compile == compile


@pytest.mark.parametrize("setting", ["cudnn_benchmark", "fused_sgd"])
def test_a_switch_of_how_a_run_trains_reaches_its_configuration(setting):
    assert getattr(resolve_run(PARAMS, "dfp", "cifar10", "lenet", "dfp", 0), setting) is False  # params.yaml's
    assert getattr(resolve_run(with_change(f"train.{setting}", True), "dfp", "cifar10", "lenet", "dfp", 0), setting)


def test_per_model_settings_apply_to_their_model_only():
    params = with_change("recipes.dfp.per_model", {"lenet": {"lr": 0.02}})
    assert resolve_run(params, "dfp", "cifar10", "lenet", "baseline", 0).recipe.lr == 0.02
    assert resolve_run(params, "dfp", "cifar10", "resnet18", "baseline", 0).recipe.lr == 0.1


def test_the_training_set_size_comes_from_the_prepared_data_when_there_is_one(tmp_path, monkeypatch):
    (tmp_path / "data/prepared/cifar10").mkdir(parents=True)
    (tmp_path / "data/prepared/cifar10/manifest.json").write_text('{"splits": {"train": {"count": 300}}}')
    monkeypatch.chdir(tmp_path)
    params = with_change("methods.dfp", {"prune_num": 300})
    with pytest.raises(ConfigError, match="prune_num: 300 prunes 300 of the 300 training samples"):
        resolve_run(params, "dfp", "cifar10", "lenet", "dfp", 0)


def test_a_train_size_in_the_download_params_is_the_training_set_size_before_and_after_the_download(
    tmp_path, monkeypatch
):
    """The download stage keeps `download.<dataset>.train_size` images: the grid's checks count with it, also over
    the manifest of data prepared whole before the param was set."""
    monkeypatch.chdir(tmp_path)
    params = with_change("methods.dfp", {"prune_num": 300})
    params["download"]["cifar10"]["train_size"] = 300
    for manifest in (None, '{"splits": {"train": {"count": 50000}}}'):
        if manifest:
            (tmp_path / "data/prepared/cifar10").mkdir(parents=True)
            (tmp_path / "data/prepared/cifar10/manifest.json").write_text(manifest)
        with pytest.raises(ConfigError, match="prune_num: 300 prunes 300 of the 300 training samples"):
            resolve_run(params, "dfp", "cifar10", "lenet", "dfp", 0)


def test_the_grid_check_names_a_bad_train_size_of_a_dataset_it_trains_on():
    params = with_change("download.cifar10.train_size", 25)
    params["download"]["cifar100"]["train_size"] = "half"  # not in the grid below: the download stage says so
    params["grid"] = {"dfp": {"datasets": ["cifar10"], "models": ["lenet"], "methods": ["baseline"], "seeds": [0]}}
    with pytest.raises(ConfigError) as caught:
        validate_grid(params)
    assert caught.value.problems == [
        "download.cifar10.train_size: 25 is not a multiple of its 10 classes, which keep the same number of images "
        "each; e.g. 20"
    ]


def test_a_run_refuses_data_prepared_for_another_train_size(tmp_path):
    """The quick setting leaves half of the training images in data/prepared; a run of the papers' setting (every
    image) must not train on them, nor a quick run on every image (the train stage checks before training)."""
    from cheaptrain.config import check_prepared
    from cheaptrain.prepare import write_prepared

    splits = {split: (np.zeros((10, 32, 32, 3), np.uint8), np.arange(10)) for split in ("train", "test")}
    whole, half = tmp_path / "whole", tmp_path / "half"
    write_prepared(whole, splits, [str(c) for c in range(10)], {})
    write_prepared(
        half, splits, [str(c) for c in range(10)], {"train_subset": {"train_size": 10, "archive_train_count": 20}}
    )
    quick = with_change("download.cifar10.train_size", 10)
    check_prepared(PARAMS, "cifar10", whole)
    check_prepared(quick, "cifar10", half)
    check_prepared(PARAMS, "cifar10", tmp_path / "nothing prepared yet")  # loading the data says so
    stale = f"{half} holds the first 10 training images, but params download.cifar10.train_size is null: prepare it"
    with pytest.raises(UserError, match=re.escape(f"{stale} again (`dvc repro download@cifar10`")):
        check_prepared(PARAMS, "cifar10", half)
    with pytest.raises(UserError, match=r"holds every training image, but params download\.cifar10\.train_size is 10"):
        check_prepared(quick, "cifar10", whole)


def test_every_problem_is_reported_at_once():
    params = with_change("recipes.dfp.lr", -1)
    params["recipes"]["dfp"]["batch_size"] = 0
    with pytest.raises(ConfigError) as info:
        resolve_run(params, "dfp", "mnist", "lenet", "baseline", 0)
    assert len(info.value.problems) == 3


def test_unreadable_params_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_params(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_params(tmp_path / "bad.yaml")


def test_values_that_dvc_exp_run_set_are_read_as_dvc_wrote_them(tmp_path):
    """DVC writes params as YAML 1.2: `dvc exp run -S recipes.wus.lr=0.00001` writes `1e-05`, a float (a string to
    YAML 1.1), and `-S train.amp=off` writes `off`, a string (false to YAML 1.1)."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    settings = ["recipes.wus.lr=0.00001", "recipes.wus.weight_decay=5e-5", "recipes.dfp.lr=0.05", "train.amp=off"]
    apply_overrides(path, settings)
    assert all(line in path.read_text() for line in ("lr: 1e-05", "weight_decay: 5e-05", "amp: off"))
    cfg = resolve_run(load_params(path), "wus", "cifar10", "lenet", "wus", 0)
    assert (cfg.recipe.lr, cfg.recipe.weight_decay, cfg.amp) == (1e-5, 5e-5, "off")
    assert resolve_run(load_params(path), "dfp", "cifar10", "lenet", "dfp", 0).recipe.lr == 0.05
    path.write_text("a: [1e-5, 1e5, -2.5E+3, .5e-3, 1.0, 1_000, 1e, e5, '1e-5', 0x10, true, False, on, off, yes, No]\n")
    expected = [1e-5, 1e5, -2500.0, 5e-4, 1.0, 1000, "1e", "e5", "1e-5", 16, True, False, "on", "off", "yes", "No"]
    assert load_params(path) == {"a": expected}


def test_a_named_configuration_of_a_method_trains_it_at_other_settings_under_its_own_name():
    params = with_change("methods.dfp_half", {"method": "dfp", "prune_num": 0.5})
    params["grid"]["dfp"]["methods"].append("dfp_half")
    validate_grid(params)
    cfg = resolve_run(params, "dfp", "cifar10", "lenet", "dfp_half", 0)
    assert cfg.name == "cifar10-lenet-dfp_half-s0" and cfg.method_args == {"method": "dfp", "prune_num": 0.5}
    method = create_method("dfp_half", cfg.method_args)
    assert type(method) is METHODS["dfp"] and method.params["prune_num"] == 0.5 and method.name == "dfp_half"
    params["methods"]["dfp_half"]["prune_num"] = 2.0
    with pytest.raises(ConfigError, match=r"methods\.dfp_half\.prune_num: 2\.0 is invalid"):
        resolve_run(params, "dfp", "cifar10", "lenet", "dfp_half", 0)
    params["methods"]["dfp_half"]["method"] = "dpf"
    with pytest.raises(ConfigError, match=r"method 'dfp_half': unknown"):
        validate_grid(params)
