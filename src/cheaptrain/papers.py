"""What the two papers ran, and whether a run of this project counts as trained at its paper's setting (the results
ledger keeps only those; the report says where a run departs). Not training code: changing it retrains nothing."""

import json
from typing import Any

PAPERS = {  # what the papers ran, to say where a run's setting differs (docs/methods.md, the papers' Sec. 4/5)
    "dfp": {
        "title": "Data Fine-Pruning (Li et al.)",
        "hardware": "GPU: NVIDIA GTX 1080 Ti",
        "runs": "not stated",
        "recipe": {"epochs": 200, "batch_size": 128, "lr": 0.1, "schedule": "multistep", "milestones": [60, 120, 160],
                   "gamma": 0.2, "momentum": 0.9, "weight_decay": 5e-4, "augment": True},
    },
    "wus": {
        "title": "Weight Update Skipping (Safayenikoo & Akturk)",
        "hardware": "CPU: Intel Xeon E5-2680 v4, 10 cores",
        "runs": 15,
        "recipe": {"epochs": 200, "batch_size": 128, "lr": 0.1, "schedule": "step", "step_size": 30, "gamma": 0.1,
                   "momentum": 0.9, "weight_decay": 1e-4, "augment": False},
        # "We use batch normalization for the ResNet-18 model" (Sec. 4), the networks' structure otherwise kept:
        # per network and option, (the paper's, our model's default; a test pins the latter to models.py)
        "networks": {"vgg11": {"batch_norm": (False, True)}, "vgg16": {"batch_norm": (False, True)}},
    },
}  # fmt: skip


def paper_setting(study: str, recipe: dict[str, Any], model: str) -> tuple[bool, list[str]]:
    """Whether a run of `model` with `recipe` (a Recipe as a dict) counts as trained at its paper's setting: 200 epochs
    and the paper's recipe, where a setting of its own network in `recipes.<study>.per_model` is a documented
    deviation. Returns that, and the deviations (when it counts) or every difference from the paper's recipe (when
    it does not)."""
    the_paper = PAPERS.get(study)
    if the_paper is None:
        return False, [f"study {study!r} is from neither paper"]
    own = (recipe.get("per_model") or {}).get(model) or {}
    deviations, departures = [], []
    for key, theirs in the_paper["recipe"].items():
        ours = list(recipe[key]) if isinstance(recipe.get(key), tuple | list) else recipe.get(key)
        if ours == theirs:
            continue
        if key in own and key != "epochs":
            deviations.append(f"{key} {ours} for {model} (recipes.{study}.per_model; paper: {theirs})")
        else:
            departures.append(f"{key} {ours} (paper: {theirs})")
    return (False, departures) if departures else (True, deviations)


def network_deviations(study: str, model: str, model_args: dict[str, Any]) -> list[str]:
    """Where `model` with `model_args` (over the model's defaults) differs from the network its paper describes: a
    documented deviation (docs/models.md says why), which the report names."""
    options = PAPERS.get(study, {}).get("networks", {}).get(model, {})
    ours = {key: (theirs, model_args.get(key, default)) for key, (theirs, default) in options.items()}
    return [
        f"{model} {key} {json.dumps(value)} (paper: {json.dumps(theirs)}; docs/models.md)"
        for key, (theirs, value) in ours.items()
        if value != theirs
    ]
