"""Params: read `params.yaml`, resolve one run's configuration, validate it before any work.

A run is (study, dataset, model, method, seed). The study names the paper whose recipe trains it (`recipes.<study>`),
so a baseline is always trained exactly like the method it is compared with.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cheaptrain import UserError, is_int, is_number

DATASETS = {"cifar10": 10, "cifar100": 100}  # name -> number of classes
SCHEDULES = ("multistep", "step", "cosine")
DEVICES = ("auto", "cpu", "cuda", "cuda:N")


class ConfigError(UserError):
    """Bad params: one line per problem, each naming the key and what it accepts."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid params:\n" + "\n".join(f"  - {p}" for p in problems))


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
    device: str = "auto"
    amp: bool = True  # bf16 autocast, CUDA only
    channels_last: bool = True  # NHWC memory layout, on any device
    compile: bool = False
    eval_batch_size: int = 1000
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

    def fingerprint(self) -> str:
        """Hash of everything that determines the run's results: a checkpoint resumes only the same run."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"params file {path} not found (run from the repository root, or pass --params)")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"params file {path} is not valid YAML: {e}") from e
    if not isinstance(params, dict):
        raise UserError(f"params file {path} must hold a mapping of sections, got {type(params).__name__}")
    return params


def validate_recipe(name: str, raw: Any) -> tuple[Recipe | None, list[str]]:
    """Check `recipes.<name>`; return the recipe (None when unusable) and one line per problem."""
    key = f"recipes.{name}"
    if not isinstance(raw, dict):
        return None, [f"{key}: must be a mapping of recipe settings"]
    problems = []
    known = set(Recipe.__dataclass_fields__)
    problems += [f"{key}.{k}: unknown setting (accepted: {', '.join(sorted(known))})" for k in raw if k not in known]
    required = ["epochs", "batch_size", "lr", "momentum", "weight_decay", "nesterov", "schedule"]
    problems += [f"{key}.{k}: missing" for k in required if k not in raw]
    if problems:
        return None, problems

    def check(k: str, ok: bool, accepted: str) -> None:
        if k in raw and not ok:
            problems.append(f"{key}.{k}: {raw[k]!r} is invalid; accepted: {accepted}")

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
        problems.append(f"{key}.nesterov: Nesterov momentum needs momentum > 0")
    epochs = raw["epochs"] if is_int(raw["epochs"]) else None
    if raw["schedule"] == "multistep":
        ms = raw.get("milestones")
        if not isinstance(ms, list) or not all(is_int(m) for m in ms) or ms != sorted(set(ms)):
            problems.append(f"{key}.milestones: {ms!r} is invalid; accepted: increasing epoch numbers")
        elif epochs and any(not 1 <= m < epochs for m in ms):
            problems.append(f"{key}.milestones: {ms} lie outside the run; accepted: epochs in [1, {epochs - 1}]")
    if raw["schedule"] == "step":
        s = raw.get("step_size")
        if not (is_int(s) and s > 0):
            problems.append(f"{key}.step_size: {s!r} is invalid; accepted: a positive integer (epochs)")
        elif epochs and s >= epochs:
            problems.append(f"{key}.step_size: {s} never changes the lr in a {epochs}-epoch run; accepted: < {epochs}")
    if problems:
        return None, problems
    values = dict(raw)
    values["milestones"] = tuple(values.get("milestones", ()))
    values["model_args"] = dict(values.get("model_args") or {})
    return Recipe(**values), []


def resolve_run(params: dict[str, Any], study: str, dataset: str, model: str, method: str, seed: int) -> RunConfig:
    """The full configuration of one run, validated: raises ConfigError listing every problem found."""
    from cheaptrain.methods import METHODS, create_method  # late: methods import torch
    from cheaptrain.models import MODELS

    problems: list[str] = []
    recipes = params.get("recipes") or {}
    if study not in recipes:
        problems.append(f"study {study!r}: no recipes.{study} in params (accepted: {', '.join(recipes) or 'none'})")
        recipe = None
    else:
        recipe, found = validate_recipe(study, recipes[study])
        problems += found
    if dataset not in DATASETS:
        problems.append(f"dataset {dataset!r}: unknown (accepted: {', '.join(DATASETS)})")
    if model not in MODELS:
        problems.append(f"model {model!r}: unknown (accepted: {', '.join(MODELS)})")
    if method not in METHODS:
        problems.append(f"method {method!r}: unknown (accepted: {', '.join(METHODS)})")
    if not is_int(seed) or seed < 0:
        problems.append(f"seed {seed!r}: accepted: an integer >= 0")

    train = params.get("train") or {}
    known = {"device", "amp", "channels_last", "compile", "eval_batch_size"}
    problems += [f"train.{k}: unknown setting (accepted: {', '.join(sorted(known))})" for k in train if k not in known]
    device = train.get("device", "auto")
    if not (device in ("auto", "cpu", "cuda") or (isinstance(device, str) and device.startswith("cuda:"))):
        problems.append(f"train.device: {device!r} is invalid; accepted: {' | '.join(DEVICES)}")
    for k in ("amp", "channels_last", "compile"):
        if not isinstance(train.get(k, True), bool):
            problems.append(f"train.{k}: {train[k]!r} is invalid; accepted: true or false")
    ebs = train.get("eval_batch_size", 1000)
    if not (is_int(ebs) and ebs > 0):
        problems.append(f"train.eval_batch_size: {ebs!r} is invalid; accepted: a positive integer")
    model_args = recipe.model_args.get(model, {}) if recipe else {}

    method_args = (params.get("methods") or {}).get(method) or {}
    if method in METHODS:
        if not isinstance(method_args, dict):
            problems.append(f"methods.{method}: accepted: a mapping of the method's parameters")
        else:
            try:  # each method checks its own parameters
                create_method(method, method_args)
            except ConfigError as e:
                problems += e.problems
    if model_args and model in MODELS and dataset in DATASETS:
        try:  # building the model is the one complete check of its keyword arguments
            from cheaptrain.models import create_model

            create_model(model, DATASETS[dataset], **model_args)
        except UserError as e:
            problems.append(f"recipes.{study}.model_args.{model}: {e}")
    if problems:
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
        device=device,
        amp=train.get("amp", True),
        channels_last=train.get("channels_last", True),
        compile=train.get("compile", False),
        eval_batch_size=ebs,
    )


GRID_KEYS = ("datasets", "models", "methods", "seeds")


def validate_grid(params: dict[str, Any]) -> None:
    """Check every run that `grid` asks for, in a second, before any of them trains: raises ConfigError listing
    every problem. (Each train stage checks only its own run otherwise, possibly hours into `dvc repro`.)"""
    from cheaptrain.methods import METHODS  # late: methods import torch
    from cheaptrain.models import MODELS

    grid = params.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(["grid: accepted: a mapping of study name to {datasets, models, methods, seeds} lists"])
    accepted = {"datasets": DATASETS, "models": MODELS, "methods": METHODS}
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
    if problems:
        raise ConfigError(problems)
