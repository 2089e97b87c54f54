"""Params: read `params.yaml`, resolve one run's configuration, validate it before any work.

A run is (study, dataset, model, method, seed). The study names the paper whose recipe trains it (`recipes.<study>`),
so a baseline is always trained exactly like the method it is compared with.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cheaptrain import ConfigError, UserError, is_int, is_number

DATASETS = {"cifar10": 10, "cifar100": 100}  # name -> number of classes
TRAIN_SIZES = {"cifar10": 50_000, "cifar100": 50_000}  # training images, for checks before the data is prepared
SCHEDULES = ("multistep", "step", "cosine")
DEVICES = ("auto", "cpu", "cuda", "cuda:N")
AMP = ("auto", "bf16", "off")  # auto: bf16 autocast on CUDA, none on CPU (slower there on most CPUs)
# torch.compile's modes: reduce-overhead replays each step as CUDA graphs (one launch per graph, on CUDA only)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
LEDGER_MODES = ("ignore", "record", "retrain")  # see ledger.py (not "off": YAML reads it as false)


@dataclass(frozen=True)
class Recipe:
    """Optimizer, schedule and augmentation of one paper (see docs: methods.md, 'Common training setup')."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    nesterov: bool
    schedule: str  # multistep | step | cosine
    gamma: float = 0.1
    milestones: tuple[int, ...] = ()  # multistep: the lr is multiplied by gamma after each of these epochs
    step_size: int = 0  # step: the lr is multiplied by gamma every step_size epochs
    augment: bool = True  # random crop (4-pixel padding) + horizontal flip
    model_args: dict[str, dict[str, Any]] = field(default_factory=dict)  # per model, e.g. {vgg16: {batch_norm: false}}
    per_model: dict[str, dict[str, Any]] = field(default_factory=dict)  # recipe settings of one model: a deviation

    def lr_at(self, epoch: int) -> float:
        """Learning rate of epoch `epoch` (1-based): milestone 60 means epochs 1-60 at lr, 61 onwards at lr*gamma."""
        if self.schedule == "multistep":
            return self.lr * self.gamma ** sum(epoch > m for m in self.milestones)
        if self.schedule == "step":
            return self.lr * self.gamma ** ((epoch - 1) // self.step_size)
        return self.lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / self.epochs))  # cosine


@dataclass(frozen=True)
class RunConfig:
    study: str
    dataset: str
    model: str
    method: str
    seed: int
    recipe: Recipe
    method_args: dict[str, Any] = field(default_factory=dict)
    model_args: dict[str, Any] = field(default_factory=dict)
    # how it runs: recorded with the run; a ledger entry is matched on the fields above (experiment()), not these
    device: str = "auto"
    amp: str = "auto"  # bf16 autocast: auto (on CUDA only) | bf16 (on any device) | off
    channels_last: bool = True  # NHWC memory layout, on any device
    compile: bool | str = False  # torch.compile the model: false | true (its default mode) | one of COMPILE_MODES
    cudnn_benchmark: bool = False  # on CUDA, cuDNN times its algorithms for each new shape and keeps the fastest
    fused_sgd: bool = False  # the SGD step as one fused kernel; false: PyTorch's choice (foreach on CUDA)
    eval_batch_size: int = 1000
    threads: int | str = "auto"  # CPU threads: auto (a fair share of the cores, see runner.py) | a number
    processes: int = 1  # data-parallel processes on this machine (torchrun; distributed.py)
    ledger: str = "ignore"  # ignore | record | retrain (ledger.py)
    data_root: str = "data/prepared"
    runs_root: str = "runs"

    @property
    def name(self) -> str:
        return f"{self.dataset}-{self.model}-{self.method}-s{self.seed}"

    @property
    def num_classes(self) -> int:
        return DATASETS[self.dataset]

    @property
    def data_dir(self) -> Path:
        return Path(self.data_root) / self.dataset

    @property
    def out_dir(self) -> Path:
        return Path(self.runs_root) / self.study / self.name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def experiment(self) -> dict[str, Any]:
        """What the run trains, whatever machine trains it: the identity of a ledger entry."""
        keys = ("study", "dataset", "model", "method", "seed", "recipe", "method_args", "model_args")
        return {k: v for k, v in self.to_dict().items() if k in keys}

    def fingerprint(self) -> str:
        """Hash of everything that decides the run's results (the ledger mode does not): a checkpoint resumes only
        the same run."""
        settings = {k: v for k, v in self.to_dict().items() if k != "ledger"}
        return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


class ParamsLoader(yaml.SafeLoader):
    """YAML as DVC writes it: YAML 1.2's booleans and floats, where PyYAML follows YAML 1.1. `dvc exp run -S
    train.amp=off` writes `amp: off`, a string in YAML 1.2 but false in YAML 1.1 (as are on, yes, no);
    `-S recipes.wus.lr=0.00001` writes `lr: 1e-05`, a float in YAML 1.2 but a string in YAML 1.1 (a float there has
    a dot and a signed exponent)."""


BOOL, FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"
ParamsLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ParamsLoader.add_implicit_resolver(BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
ParamsLoader.add_implicit_resolver(
    FLOAT, re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"), list("-+0123456789.")
)


def read_yaml(text: str) -> Any:
    """Parse YAML text as params are read (ParamsLoader); yaml.YAMLError if it is not YAML."""
    return yaml.load(text, Loader=ParamsLoader)  # a SafeLoader: no Python objects


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"params file {path} not found (run from the repository root, or pass --params)")
    try:
        params = read_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"params file {path} is not valid YAML: {e}") from e
    if not isinstance(params, dict):
        raise UserError(f"params file {path} must hold a mapping of sections, got {type(params).__name__}")
    return params


def validate_recipe(name: str, raw: Any, model: str | None = None) -> tuple[Recipe | None, list[str]]:
    """Check `recipes.<name>` as it trains `model` (its `per_model` settings applied); return the recipe (None when
    unusable) and one line per problem, each under the key that set the value."""
    key = f"recipes.{name}"
    if not isinstance(raw, dict):
        return None, [f"{key}: must be a mapping of recipe settings"]
    per_model = raw.get("per_model") or {}
    if not (isinstance(per_model, dict) and all(isinstance(v, dict) for v in per_model.values())):
        return None, [f"{key}.per_model: {per_model!r} is invalid; accepted: a mapping of model name to settings"]
    override = per_model.get(model, {})
    raw = raw | override

    def where(k: str) -> str:
        return f"{key}.per_model.{model}.{k}" if k in override else f"{key}.{k}"

    known = set(Recipe.__dataclass_fields__)
    problems = [f"{where(k)}: unknown setting (accepted: {', '.join(sorted(known))})" for k in raw if k not in known]
    problems += [
        f"{where(k)}: not a setting of one model (accepted: any other recipe setting)"
        for k in override
        if k in ("per_model", "model_args")
    ]
    required = ["epochs", "batch_size", "lr", "momentum", "weight_decay", "nesterov", "schedule"]
    problems += [f"{key}.{k}: missing" for k in required if k not in raw]
    if problems:
        return None, problems

    def check(k: str, ok: bool, accepted: str) -> None:
        if k in raw and not ok:
            problems.append(f"{where(k)}: {raw[k]!r} is invalid; accepted: {accepted}")

    check("epochs", is_int(raw["epochs"]) and raw["epochs"] > 0, "a positive integer")
    check("batch_size", is_int(raw["batch_size"]) and raw["batch_size"] > 0, "a positive integer")
    check("lr", is_number(raw["lr"]) and raw["lr"] > 0, "a positive number")
    check("momentum", is_number(raw["momentum"]) and 0 <= raw["momentum"] < 1, "a number in [0, 1)")
    check("weight_decay", is_number(raw["weight_decay"]) and raw["weight_decay"] >= 0, "a number >= 0")
    check("nesterov", isinstance(raw["nesterov"], bool), "true or false")
    check("augment", isinstance(raw.get("augment"), bool), "true or false")
    check("gamma", is_number(raw.get("gamma")) and 0 < raw.get("gamma", 0) <= 1, "a number in (0, 1]")
    check("schedule", raw["schedule"] in SCHEDULES, " | ".join(SCHEDULES))
    model_args = raw.get("model_args", {})
    check(
        "model_args",
        isinstance(model_args, dict) and all(isinstance(v, dict) for v in model_args.values()),
        "a mapping of model name to keyword arguments, e.g. {vgg16: {batch_norm: false}}",
    )
    if raw["nesterov"] is True and raw["momentum"] == 0:
        problems.append(f"{where('nesterov')}: Nesterov momentum needs momentum > 0")
    epochs = raw["epochs"] if is_int(raw["epochs"]) and raw["epochs"] > 0 else None
    if raw["schedule"] == "multistep":
        ms = raw.get("milestones")
        if not isinstance(ms, list) or not all(is_int(m) for m in ms) or ms != sorted(set(ms)):
            problems.append(f"{where('milestones')}: {ms!r} is invalid; accepted: increasing epoch numbers")
        elif epochs and any(not 1 <= m < epochs for m in ms):
            problems.append(f"{where('milestones')}: {ms} lie outside the run; accepted: epochs in [1, {epochs - 1}]")
    if raw["schedule"] == "step":
        step = raw.get("step_size")
        if not (is_int(step) and step > 0):
            problems.append(f"{where('step_size')}: {step!r} is invalid; accepted: a positive integer (epochs)")
        elif epochs and step >= epochs:
            problems.append(
                f"{where('step_size')}: {step} never changes the lr in a {epochs}-epoch run; accepted: < {epochs}"
            )
    if problems:
        return None, problems
    values = dict(raw)
    values["milestones"] = tuple(values.get("milestones", ()))
    values["model_args"] = dict(values.get("model_args") or {})
    values["per_model"] = {model: override} if override else {}  # its own only: another model's is not its recipe
    return Recipe(**values), []


TRAIN_SETTINGS = {  # train.<key>: (default, valid?, accepted)
    "device": ("auto", lambda v: v in ("auto", "cpu", "cuda") or (isinstance(v, str) and v.startswith("cuda:")),
               " | ".join(DEVICES)),
    "amp": ("auto", lambda v: v in AMP, " | ".join(AMP)),
    "channels_last": (True, lambda v: isinstance(v, bool), "true or false"),
    "compile": (False, lambda v: isinstance(v, bool) or v in COMPILE_MODES,
                f"true | false | a torch.compile mode ({' | '.join(COMPILE_MODES)})"),
    "cudnn_benchmark": (False, lambda v: isinstance(v, bool), "true or false"),
    "fused_sgd": (False, lambda v: isinstance(v, bool), "true or false"),
    "eval_batch_size": (1000, lambda v: is_int(v) and v > 0, "a positive integer"),
    "threads": ("auto", lambda v: v == "auto" or (is_int(v) and v > 0), "auto | a positive integer"),
    "processes": (1, lambda v: is_int(v) and v > 0, "a positive integer (data-parallel processes, via torchrun)"),
    "ledger": ("ignore", lambda v: v in LEDGER_MODES, " | ".join(LEDGER_MODES)),
}  # fmt: skip


def train_settings(params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Params `train` with defaults, and one line per problem."""
    train = params.get("train") or {}
    if not isinstance(train, dict):
        return {}, ["train: accepted: a mapping of settings"]
    problems = [
        f"train.{k}: unknown setting (accepted: {', '.join(sorted(TRAIN_SETTINGS))})"
        for k in train
        if k not in TRAIN_SETTINGS
    ]
    values = {k: train.get(k, default) for k, (default, _, _) in TRAIN_SETTINGS.items()}
    problems += [
        f"train.{k}: {values[k]!r} is invalid; accepted: {accepted}"
        for k, (_, valid, accepted) in TRAIN_SETTINGS.items()
        if not valid(values[k])
    ]
    return values, problems


def train_size_param(params: dict[str, Any], dataset: str) -> Any:
    """`download.<dataset>.train_size`: how many training images the download stage keeps (null: all)."""
    return ((params.get("download") or {}).get(dataset) or {}).get("train_size")


def train_size_problem(dataset: str, train_size: object) -> str | None:
    """What is wrong with `download.<dataset>.train_size`, if anything: it is null or a positive multiple of the
    number of classes (each class keeps as many images)."""
    key, classes = f"download.{dataset}.train_size", DATASETS[dataset]
    if train_size is None:
        return None
    if not is_int(train_size) or train_size <= 0:
        return f"{key}: {train_size!r} is invalid; accepted: null (every training image) or a positive number of images"
    if train_size % classes:
        nearest = max(train_size - train_size % classes, classes)
        return (f"{key}: {train_size} is not a multiple of its {classes} classes, which keep the same number of "
                f"images each; e.g. {nearest}")  # fmt: skip
    return None


def train_size(data_root: str, dataset: str, params: dict[str, Any] | None = None) -> int:
    """Training images of `dataset`: `download.<dataset>.train_size` of `params` when set (the download stage keeps
    that many), else the prepared data's manifest when there is one, else the dataset's own size."""
    subset = train_size_param(params or {}, dataset)
    if is_int(subset) and subset > 0:
        return subset
    manifest = Path(data_root) / dataset / "manifest.json"
    try:
        return int(json.loads(manifest.read_text())["splits"]["train"]["count"])
    except (OSError, ValueError, KeyError, TypeError):
        return TRAIN_SIZES[dataset]


def resolve_run(params: dict[str, Any], study: str, dataset: str, model: str, method: str, seed: int) -> RunConfig:
    """The full configuration of one run, validated before any work: raises ConfigError listing every problem found,
    including what only the run tells (the training-set size, the model's layers, the schedule over its epochs)."""
    import torch

    from cheaptrain.methods import METHODS, RunContext, create_method, implementation
    from cheaptrain.models import MODELS, check_options, create_model

    problems: list[str] = []
    recipes = params.get("recipes") or {}
    recipe = None
    if study not in recipes:
        problems.append(f"study {study!r}: no recipes.{study} in params (accepted: {', '.join(recipes) or 'none'})")
    else:
        recipe, found = validate_recipe(study, recipes[study], model)
        problems += found
    if dataset not in DATASETS:
        problems.append(f"dataset {dataset!r}: unknown (accepted: {', '.join(DATASETS)})")
    if model not in MODELS:
        problems.append(f"model {model!r}: unknown (accepted: {', '.join(MODELS)})")
    methods = params.get("methods")
    section = methods.get(method) if isinstance(methods, dict) else None
    if not isinstance(methods, dict):
        problems.append("methods: missing; accepted: a mapping of method name to its parameters, e.g. {baseline: {}}")
    elif implementation(method, section if isinstance(section, dict) else None) not in METHODS:
        problems.append(f"method {method!r}: unknown (accepted: {', '.join(METHODS)}, or a methods.<name> section "
                        "naming one with `method:`)")  # fmt: skip
    elif method not in methods or not isinstance(section or {}, dict):
        shown = repr(section) if method in methods else "missing"
        problems.append(f"methods.{method}: {shown}; accepted: a mapping of its parameters ({{}}: the defaults)")
    method_args = section or {}  # `dfp:` with nothing after it: every default
    if not is_int(seed) or seed < 0:
        problems.append(f"seed {seed!r}: accepted: an integer >= 0")
    train, found = train_settings(params)
    problems += found
    model_args = recipe.model_args.get(model, {}) if recipe else {}
    if model_args and model in MODELS:
        problems += check_options(model, model_args, f"recipes.{study}.model_args.{model}")
    if problems:
        raise ConfigError(problems)

    instance = create_method(method, method_args)  # raises ConfigError for its own parameters
    with torch.device("meta"):  # the model's structure, without allocating its weights
        structure = create_model(model, DATASETS[dataset], **model_args)
    data_root = "data/prepared"
    context = RunContext(structure, train_size(data_root, dataset, params), recipe.epochs, torch.device("meta"), seed,
                         recipe.lr_at)  # fmt: skip
    if problems := instance.check_run(context):
        raise ConfigError(problems)
    return RunConfig(
        study=study,
        dataset=dataset,
        model=model,
        method=method,
        seed=seed,
        recipe=recipe,
        method_args=dict(method_args),
        model_args=dict(model_args),
        device=train["device"],
        amp=train["amp"],
        channels_last=train["channels_last"],
        compile=train["compile"],
        cudnn_benchmark=train["cudnn_benchmark"],
        fused_sgd=train["fused_sgd"],
        eval_batch_size=train["eval_batch_size"],
        threads=train["threads"],
        processes=train["processes"],
        ledger=train["ledger"],
        data_root=data_root,
    )


GRID_KEYS = ("datasets", "models", "methods", "seeds")


def prepared_train_size(data_dir: str | Path) -> int | None:
    """The `train_size` that the data in `data_dir` was prepared with (its manifest's `train_subset`); None: every
    training image. OSError or ValueError where nothing readable is prepared."""
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text())
    return (manifest.get("train_subset") or {}).get("train_size")


def check_prepared(params: dict[str, Any], dataset: str, data_dir: str | Path) -> None:
    """UserError when the training split prepared in `data_dir` is not the one `download.<dataset>.train_size` asks
    for: data prepared under other params (the quick setting's half of the images, say) must not train their runs."""
    try:
        prepared = prepared_train_size(data_dir)
    except (OSError, ValueError, AttributeError):
        return  # nothing prepared yet: loading the data says so
    wanted = train_size_param(params, dataset)
    if prepared != wanted:
        held = f"the first {prepared} training images" if prepared else "every training image"
        raise UserError(
            f"{data_dir} holds {held}, but params download.{dataset}.train_size is "
            f"{'null' if wanted is None else repr(wanted)}: prepare it "
            f"again (`dvc repro download@{dataset}`, or `python stages/download.py --dataset {dataset}`)"
        )


def validate_grid(params: dict[str, Any]) -> None:
    """Check every run that `grid` asks for, in a second, before any of them trains: raises ConfigError listing
    every problem. (Each train stage checks only its own run otherwise, possibly hours into `dvc repro`.)"""
    from cheaptrain.methods import METHODS  # late: methods import torch
    from cheaptrain.models import MODELS

    named = [k for k, v in (params.get("methods") or {}).items() if isinstance(v, dict) and "method" in v]

    grid = params.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(["grid: accepted: a mapping of study name to {datasets, models, methods, seeds} lists"])
    accepted = {"datasets": DATASETS, "models": MODELS, "methods": [*METHODS, *named]}
    downloaded = (params.get("download") or {}).get("datasets")
    problems: list[str] = []
    runs: dict[tuple[str, str, str, str], int] = {}  # one seed per (study, dataset, model, method) is enough
    for study, lists in grid.items():
        key = f"grid.{study}"
        if not isinstance(lists, dict):
            problems.append(f"{key}: accepted: a mapping with the lists {', '.join(GRID_KEYS)}")
            continue
        problems += [f"{key}.{k}: unknown (accepted: {', '.join(GRID_KEYS)})" for k in lists if k not in GRID_KEYS]
        valid = {}
        for k in GRID_KEYS:
            values = lists.get(k)
            if not isinstance(values, list) or not values:
                problems.append(f"{key}.{k}: {values!r} is invalid; accepted: a non-empty list")
                continue
            if len(set(map(str, values))) < len(values):
                problems.append(f"{key}.{k}: {values} repeats a value (each run must be named once)")
            if k == "seeds":
                bad = [v for v in values if not (is_int(v) and v >= 0)]
                problems += [f"{key}.seeds: {v!r} is invalid; accepted: integers >= 0" for v in bad]
            else:
                bad = [v for v in values if not (isinstance(v, str) and v in accepted[k])]
                problems += [f"{key}.{k}: {v!r} is unknown (accepted: {', '.join(accepted[k])})" for v in bad]
                if k == "datasets" and isinstance(downloaded, list):
                    problems += [
                        f"{key}.datasets: {v!r} is not in download.datasets {downloaded}, so it is never prepared"
                        for v in values
                        if v in DATASETS and v not in downloaded
                    ]
            valid[k] = [v for v in values if v not in bad]
        if len(valid) == len(GRID_KEYS) and all(valid.values()):
            for dataset in valid["datasets"]:
                for model in valid["models"]:
                    for method in valid["methods"]:
                        runs.setdefault((study, dataset, model, method), valid["seeds"][0])
    for (study, dataset, model, method), seed in runs.items():
        try:
            resolve_run(params, study, dataset, model, method, seed)
        except ConfigError as e:
            problems += [p for p in e.problems if p not in problems]
    for dataset in sorted({dataset for _, dataset, _, _ in runs}):  # the download stage keeps that many images
        if problem := train_size_problem(dataset, train_size_param(params, dataset)):
            problems.append(problem)
    if problems:
        raise ConfigError(problems)
