"""Weight Update Skipping (Safayenikoo & Akturk): `wus` and `wus_lr`, as ../shared/docs/methods.md fixes them.

Two phases. NORMAL: every parameter trains. SKIP: every parameter is frozen (requires_grad=False, grad=None) except
the biases of the last `bias_layers` layers, so autograd builds no graph through the frozen part, the backward pass
shrinks to (almost) nothing, and SGD leaves the frozen tensors, their momentum and their weight decay alone. BatchNorm
stays in training mode. The optimizer is never rebuilt: its state survives every phase change.

A "layer" is a module that owns parameters itself (Conv2d, Linear, BatchNorm2d...), in registration order, which
models.py keeps equal to data-flow order. The skip phase keeps the `bias` of each of the last `bias_layers` layers,
counted from the output; a layer without a bias (ResNet convs) counts as a layer and keeps nothing.

The phase machine, one rule per line of methods.md. After the validation of epoch e (`on_validation_end`):
  1. trailing std = population std of the last `std_window` accuracies (percentage points; none before);
  2. stable epoch: std < std_threshold; `streak` counts successive stable epochs;
  3. start: the first time streak reaches 2, epoch e+1 is the initial epoch; epochs after it are skip epochs;
  4. wus: best accuracy and a patience counter from epoch 1 on: accuracy > best + delta -> best = accuracy,
     counter = 0; else counter += 1, and when it reaches `patience`: counter = 0 and epoch e+1 trains normal;
  5. wus_lr, until_stable: while falling back, streak reaching 2 again ends the fall-back (e+1 skips).
At the start of epoch e+1 with its learning rate (`on_epoch_start`):
  6. wus_lr: if the initial epoch is known and the lr differs from epoch e's: fall back; `until_stable` trains normal
     until rule 5 (the streak restarts at 0, so only epochs at the new lr count), `one_epoch` trains this epoch normal;
  7. the epoch skips iff an initial epoch is known, epoch > initial epoch, and no fall-back holds it normal.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, ClassVar

from torch import nn

from cheaptrain import Param, is_int, is_number
from cheaptrain.methods.base import Method, RunContext, register

NORMAL, SKIP = 0, 1
LR_FALLBACKS = ("until_stable", "one_epoch")


def layers_with_parameters(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module owning parameters itself, in data-flow order."""
    return [(name, m) for name, m in model.named_modules() if next(m.parameters(recurse=False), None) is not None]


def skip_trainable(model: nn.Module, bias_layers: int) -> list[str]:
    """Names of the parameters a skip epoch keeps training: the biases of the last `bias_layers` layers."""
    layers = layers_with_parameters(model)[-bias_layers:]
    return [f"{name}.bias" for name, m in layers if isinstance(getattr(m, "bias", None), nn.Parameter)]


COMMON = {
    "std_window": Param(5, lambda v: is_int(v) and v >= 2, "an integer >= 2 (epochs)"),
    "std_threshold": Param(0.71, lambda v: is_number(v) and v > 0, "a number > 0 (percentage points)"),
    "bias_layers": Param(
        1, lambda v: is_int(v) and v >= 1, "an integer >= 1 (layers with parameters, from the output)"
    ),
}


@register("wus")
class WeightUpdateSkipping(Method):
    """WUS: skip once the validation accuracy is stable; one normal epoch whenever it stalls for `patience` epochs."""

    fallback: ClassVar[str] = "patience"  # rule 4; `wus_lr`: "lr", rule 6
    PARAMS: ClassVar[dict[str, Param]] = COMMON | {
        "patience": Param(7, lambda v: is_int(v) and v >= 1, "an integer >= 1 (epochs)"),
        "delta": Param(0.0, lambda v: is_number(v) and v >= 0, "a number >= 0 (percentage points)"),
    }

    def check_run(self, ctx: RunContext) -> list[str]:
        key, bias_layers = f"methods.{self.name}.bias_layers", self.params["bias_layers"]
        n, model_name = len(layers_with_parameters(ctx.model)), type(ctx.model).__name__
        if bias_layers > n:
            return [f"{key}: {bias_layers} exceeds the {n} layers with parameters of {model_name}; accepted: 1-{n}"]
        if not skip_trainable(ctx.model, bias_layers):
            return [f"{key}: the last {bias_layers} layer(s) of {model_name} have no bias to train"]
        return []

    def setup(self, ctx: RunContext) -> None:
        super().setup(ctx)
        p = self.params
        self.std_window: int = p["std_window"]
        self.std_threshold: float = p["std_threshold"]
        self.patience: int = p.get("patience", 0)  # wus only
        self.delta: float = p.get("delta", 0.0)  # wus only
        self.lr_fallback: str = p.get("lr_fallback", "")  # wus_lr only
        kept = set(skip_trainable(ctx.model, p["bias_layers"]))
        named = dict(ctx.model.named_parameters())
        self.kept = [p for n, p in named.items() if n in kept]
        self.frozen = [p for n, p in named.items() if n not in kept]
        self.trainable_in_skip = sum(p.numel() for p in self.kept)  # Eq. 1's b
        self.all_params = sum(p.numel() for p in named.values())  # b + w
        # The phase machine's state (all of it goes into state_dict).
        self.phase = NORMAL  # the phase of the current epoch
        self.accuracies: list[float] = []  # validation accuracy of every epoch so far
        self.last_lr: float | None = None  # the lr of the last validated epoch
        self.streak = 0  # successive epochs with trailing std below the threshold
        self.initial_epoch = 0  # 0 until the start criterion holds
        self.best = -math.inf  # wus: best accuracy so far
        self.counter = 0  # wus: epochs without an improvement above best + delta
        self.normal_once = False  # the next epoch trains normal (wus patience, wus_lr one_epoch)
        self.until_stable = False  # wus_lr: train normal until the start criterion holds again
        self.skip_epochs = 0
        self.normal_epochs = 0

    def trailing_std(self) -> float:
        if len(self.accuracies) < self.std_window:
            return math.nan
        return statistics.pstdev(self.accuracies[-self.std_window :])

    def on_epoch_start(self, epoch: int, lr: float) -> None:
        lr_changed = self.last_lr is not None and lr != self.last_lr
        if self.fallback == "lr" and self.initial_epoch and lr_changed:  # rule 6
            if self.lr_fallback == "one_epoch":
                self.normal_once = True
            else:
                self.until_stable, self.streak = True, 0
        held_normal = self.normal_once or self.until_stable
        self.normal_once = False
        skip = self.initial_epoch > 0 and epoch > self.initial_epoch and not held_normal  # rule 7
        self.set_phase(SKIP if skip else NORMAL)
        return None  # every sample trains

    def set_phase(self, phase: int) -> None:
        """Freeze (SKIP) or unfreeze (NORMAL) everything but the kept biases; the optimizer is left as it is."""
        self.phase = phase
        for p in self.frozen:
            p.requires_grad_(phase == NORMAL)
            if phase == SKIP:
                p.grad = None  # requires_grad=False keeps an old grad; SGD must see None to skip the tensor

    def on_validation_end(self, epoch: int, accuracy: float, lr: float) -> None:
        if self.phase == SKIP:
            self.skip_epochs += 1
        else:
            self.normal_epochs += 1
        self.accuracies.append(accuracy)
        self.last_lr = lr
        self.streak = self.streak + 1 if self.trailing_std() < self.std_threshold else 0  # rules 1-2 (NaN: not)
        if not self.initial_epoch and self.streak >= 2:  # rule 3
            self.initial_epoch = epoch + 1
        if self.fallback == "patience":  # rule 4
            if accuracy > self.best + self.delta:
                self.best, self.counter = accuracy, 0
            else:
                self.counter += 1
                if self.counter >= self.patience:
                    self.counter, self.normal_once = 0, True
        if self.until_stable and self.streak >= 2:  # rule 5
            self.until_stable = False

    def epoch_metrics(self) -> dict[str, float]:
        row = {"phase": self.phase, "updated_params": self.trainable_in_skip if self.phase == SKIP else self.all_params}
        if len(self.accuracies) >= self.std_window:
            row["val_acc_std"] = self.trailing_std()
        return row

    def run_metrics(self) -> dict[str, float]:
        epochs = self.skip_epochs + self.normal_epochs
        total = self.skip_epochs * self.trainable_in_skip + self.normal_epochs * self.all_params  # Eq. 1
        return {
            "initial_epoch": float(self.initial_epoch if self.initial_epoch <= epochs else 0),
            "skip_epochs": float(self.skip_epochs),
            "normal_epochs": float(self.normal_epochs),
            "updated_params_total": float(total),
            # against a baseline run of the same model and epochs, which updates every parameter every epoch
            "updated_params_reduction_pct": 100 * (1 - total / (epochs * self.all_params)) if epochs else 0.0,
            "trainable_in_skip": float(self.trainable_in_skip),
        }

    STATE: ClassVar[tuple[str, ...]] = (
        "phase", "accuracies", "last_lr", "streak", "initial_epoch", "best", "counter", "normal_once", "until_stable",
        "skip_epochs", "normal_epochs",
    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.STATE} | {"accuracies": list(self.accuracies)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in self.STATE:
            setattr(self, k, state[k])
        self.accuracies = list(state["accuracies"])


@register("wus_lr")
class WeightUpdateSkippingLR(WeightUpdateSkipping):
    """WUS+LR: skip once the validation accuracy is stable; fall back to normal whenever the learning rate changes."""

    fallback: ClassVar[str] = "lr"
    PARAMS: ClassVar[dict[str, Param]] = COMMON | {
        "lr_fallback": Param("until_stable", lambda v: v in LR_FALLBACKS, " | ".join(LR_FALLBACKS))
    }
