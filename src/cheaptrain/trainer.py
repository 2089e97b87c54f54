"""The training loop: one configuration, epoch by epoch, with a method's hooks. No I/O here (see runner.py).

Each epoch: the method picks the samples and the trainable parameters -> train over shuffled batches, handing the
per-sample losses to the method -> evaluate on the test split -> the method sees the accuracy -> one history row.
The loop never asks which method it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from cheaptrain import UserError
from cheaptrain.config import RunConfig
from cheaptrain.data import DeviceData, channel_stats
from cheaptrain.methods import Method, RunContext
from cheaptrain.models import create_model
from cheaptrain.prepare import Split

EpochCallback = Callable[[list[dict[str, Any]], dict[str, Any]], None]


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device is {name!r} but CUDA is not available here; use 'auto' or 'cpu'")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures work done, not work launched."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed blocks for reuse instead of handing them back to the OS.

    By default glibc maps every block over 128 KiB (a threshold it then raises and lowers as blocks come and go)
    and unmaps it when freed, so each training step faults its activations' pages in anew: on 2 CPU cores a LeNet
    epoch of a fresh process took 3.54 s with 368,000 page faults, against 2.84 s with 2,400 (medians,
    `benchmarks/malloc.py`). Numbers are unchanged; only where memory comes from.
    Process-wide (fit() calls it: a stage's process only trains); Linux only, and a no-op without glibc.
    """
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's, or musl's no-op
    if mallopt is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_mmap_threshold, 32 << 20)  # glibc's largest; a fixed value also stops it from moving
    mallopt(m_trim_threshold, 1 << 30)  # keep up to 1 GiB of freed memory at the top of the heap


def fit(
    cfg: RunConfig,
    train_split: Split,
    test_split: Split,
    method: Method,
    resume: dict[str, Any] | None = None,
    on_epoch_end: EpochCallback | None = None,
) -> list[dict[str, Any]]:
    """Train `cfg` and return its history, one row per epoch. `resume` is a state given to `on_epoch_end` earlier."""
    device = resolve_device(cfg.device)
    keep_freed_memory()  # the process is ours: it only trains
    on_cuda = device.type == "cuda"
    torch.manual_seed(cfg.seed)  # also seeds CUDA
    random.seed(cfg.seed)  # and the global generators a method may draw from
    np.random.seed(cfg.seed)
    channels_last = cfg.channels_last  # faster on CPU too (benchmarks/loader.py: LeNet, ResNet-18, VGG-11)
    mean, std = channel_stats(torch.from_numpy(train_split.images))
    train_data = DeviceData(train_split, device, mean, std, channels_last)
    test_data = DeviceData(test_split, device, mean, std, channels_last)

    model = create_model(cfg.model, cfg.num_classes, **cfg.model_args).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    recipe = cfg.recipe
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=recipe.lr,
        momentum=recipe.momentum,
        weight_decay=recipe.weight_decay,
        nesterov=recipe.nesterov,
    )
    step_model = torch.compile(model) if cfg.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda and cfg.amp else contextlib.nullcontext()
    generator = torch.Generator(device=device).manual_seed(cfg.seed)  # shuffling and augmentation
    method.setup(
        RunContext(
            model=model,
            num_samples=len(train_data),
            epochs=recipe.epochs,
            device=device,
            seed=cfg.seed,
            lr_at=recipe.lr_at,
        )
    )

    history: list[dict[str, Any]] = []
    if resume is not None:  # everything `state` below holds; the lr comes from the schedule, by epoch
        model.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        method.load_state_dict(resume["method"])
        generator.set_state(resume["generator"])
        set_rng_states(resume["rng"], device)
        history = list(resume["history"])

    epochs = tqdm(
        range(len(history) + 1, recipe.epochs + 1),
        desc=cfg.name,
        unit="epoch",
        initial=len(history),
        total=recipe.epochs,
        disable=None,
    )
    for epoch in epochs:
        lr = recipe.lr_at(epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        row: dict[str, Any] = {"epoch": epoch, "lr": lr}
        row |= train_epoch(
            step_model, optimizer, train_data, method, epoch, lr, recipe.batch_size, recipe.augment, generator, autocast
        )
        if not math.isfinite(row["train_loss"]):
            raise TrainingDiverged(
                f"{cfg.name}: the training loss became {row['train_loss']} in epoch {epoch} (lr {lr:g}); the run "
                f"stopped. Lower recipes.{cfg.study}.lr, or check the data and the model."
            )
        row |= evaluate(step_model, test_data, cfg.eval_batch_size, autocast)
        method.on_validation_end(epoch, row["test_acc"], lr)
        row |= method.epoch_metrics()
        history.append(row)
        epochs.set_postfix(loss=f"{row['train_loss']:.3f}", acc=f"{row['test_acc']:.2f}")
        if on_epoch_end is not None:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "method": method.state_dict(),
                "generator": generator.get_state(),
                "rng": rng_states(device),
                "history": history,
            }
            on_epoch_end(history, state)
    return history


def rng_states(device: torch.device) -> dict[str, Any]:
    """The global random generators: torch (CPU, and the CUDA device's), Python's and numpy's."""
    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], device)


def train_epoch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: DeviceData,
    method: Method,
    epoch: int,
    lr: float,
    batch_size: int,
    augment: bool,
    generator: torch.Generator,
    autocast: contextlib.AbstractContextManager,
) -> dict[str, Any]:
    device = data.device
    synchronize(device)
    start = time.perf_counter()  # the method's choice of samples counts as training time
    model.train()
    indices = method.on_epoch_start(epoch, lr)
    if indices is None:
        indices = torch.arange(len(data), device=device)
    if len(indices) == 0:
        raise UserError(f"epoch {epoch}: the method {method.name!r} selected no samples to train on")
    order = indices[torch.randperm(len(indices), generator=generator, device=device)]
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for batch in tqdm(order.split(batch_size), desc=f"epoch {epoch}", unit="batch", leave=False, disable=None):
        x, y = data.batch(batch, augment, generator)
        with autocast:
            logits = model(x)
        losses = F.cross_entropy(logits.float(), y, reduction="none")
        optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        optimizer.step()
        losses = losses.detach()
        method.on_batch_end(batch, losses)
        loss_sum += losses.sum()
        correct += (logits.argmax(1) == y).sum()
    synchronize(device)
    trained = len(order)
    return {
        "train_loss": loss_sum.item() / trained,
        "train_acc": 100 * correct.item() / trained,
        "trained_samples": trained,
        "epoch_train_s": time.perf_counter() - start,
    }


@torch.no_grad()
def evaluate(
    model: nn.Module, data: DeviceData, batch_size: int, autocast: contextlib.AbstractContextManager
) -> dict[str, float]:
    synchronize(data.device)
    start = time.perf_counter()
    model.eval()
    loss_sum = torch.zeros((), device=data.device)
    correct = torch.zeros((), device=data.device, dtype=torch.long)
    for batch in torch.arange(len(data), device=data.device).split(batch_size):
        x, y = data.batch(batch)
        with autocast:
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    synchronize(data.device)
    return {
        "test_loss": loss_sum.item() / len(data),
        "test_acc": 100 * correct.item() / len(data),
        "eval_s": time.perf_counter() - start,
    }


def final_metrics(history: list[dict[str, Any]]) -> dict[str, float]:
    """Run-level figures: both papers' accuracy measures and the training time."""
    accs = [row["test_acc"] for row in history]
    return {
        "final_acc": accs[-1],  # the WUS paper's measure (final-epoch validation accuracy)
        "best_acc": max(accs),
        "best3_acc": sum(sorted(accs)[-3:]) / min(3, len(accs)),  # the DFP paper's measure
        "train_time_s": sum(row["epoch_train_s"] for row in history),
        "eval_time_s": sum(row["eval_s"] for row in history),
        "total_trained_samples": sum(row["trained_samples"] for row in history),
        "epochs": len(history),
    }
