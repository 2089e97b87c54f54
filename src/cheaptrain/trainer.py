"""The training loop: one configuration, epoch by epoch, with a method's hooks. No files, no tracking (runner.py).

`prepare` builds what a run acts on (data on the device, model, optimizer, the method); `fit` runs the epochs. Each
epoch: the method picks the samples and the trainable parameters -> train over shuffled batches -> the method gets
every batch's per-sample losses -> evaluate on the test split -> the method sees the accuracy -> one history row.
The loop never asks which method it runs. Across several processes (torchrun), each trains its part of every batch
and the methods see the same global batches as on one process (distributed.py).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from cheaptrain import UserError
from cheaptrain.config import RunConfig
from cheaptrain.cost import StepCosts
from cheaptrain.data import DeviceData, Split, channel_stats
from cheaptrain.distributed import ONE, Processes, device_of, global_losses, start, sum_all
from cheaptrain.methods import Method, RunContext
from cheaptrain.models import create_model

EpochCallback = Callable[[list[dict[str, Any]], dict[str, Any]], None]


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"train.device is {name!r} but CUDA is not available here; use 'auto' or 'cpu'")
    return torch.device(name)


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16 autocast where `amp` asks for it: 'bf16' on any device, 'auto' on CUDA only."""
    if amp == "bf16" or (amp == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures work done, not work launched."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Training:
    """What one run's epochs act on."""

    cfg: RunConfig
    model: nn.Module  # the parameters: what the method and the checkpoint see
    optimizer: torch.optim.Optimizer
    method: Method
    train_data: DeviceData
    test_data: DeviceData
    generator: torch.Generator  # shuffling and augmentation
    autocast: contextlib.AbstractContextManager
    costs: StepCosts
    processes: Processes
    step_models: dict[tuple[bool, ...], tuple[nn.Module, nn.Module]]  # per set of trainable parameters: what runs
    # the batches, (compiled if asked, uncompiled)

    def step_model(self) -> tuple[nn.Module, nn.Module]:
        """The modules that run the batches: the model, or across processes the model under DistributedDataParallel,
        built for the parameters that train now (it exchanges their gradients only); the first compiled if asked, in
        the mode asked (reduce-overhead: as CUDA graphs), for the full batches, the second uncompiled, for a shorter
        last batch. Compiled for one batch size, the kernels are specialised to it (a graph for any size is slower:
        benchmarks/shapes.py), and no epoch's last batch, whatever its size, compiles again."""
        trainable = tuple(p.requires_grad for p in self.model.parameters())
        if trainable not in self.step_models:
            model = self.model
            if self.processes.active:
                device_ids = [self.train_data.device.index] if self.train_data.device.type == "cuda" else None
                model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
            compiled = model
            if self.cfg.compile:
                # Check every tensor's guards, requires_grad included. By default some releases (2.11 among them,
                # pytorch#139476) skip them while a module's attributes are unchanged, so they miss a method's
                # requires_grad flip and run the graphs of the other set of trainable parameters: frozen epochs
                # then compute every gradient, and after a resume in a frozen epoch nothing frozen trains again.
                torch._dynamo.config.skip_tensor_guards_with_matching_dict_tags = False
                mode = None if self.cfg.compile is True else self.cfg.compile
                compiled = torch.compile(model, mode=mode, dynamic=False)
            self.step_models[trainable] = (compiled, model)
        return self.step_models[trainable]


def prepare(
    cfg: RunConfig, train_split: Split, test_split: Split, method: Method, processes: Processes = ONE
) -> Training:
    """Seed everything, put the data on the device, build the model and optimizer, set the method up."""
    device = device_of(processes, resolve_device(cfg.device))
    start(processes, device)
    # off, cuDNN's heuristics choose the algorithms, the same every run; on, the fastest of timed candidates
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    torch.manual_seed(cfg.seed)  # also seeds CUDA
    random.seed(cfg.seed)  # and the global generators a method may draw from
    np.random.seed(cfg.seed)
    mean, std = channel_stats(torch.from_numpy(train_split.images))
    train_data = DeviceData(train_split, device, mean, std, cfg.channels_last)
    test_data = DeviceData(test_split, device, mean, std, cfg.channels_last)
    model = create_model(cfg.model, cfg.num_classes, **cfg.model_args).to(device)
    if cfg.channels_last:  # faster on CUDA; on CPU it depends on the model (benchmarks/loader.py: LeNet is not)
        model = model.to(memory_format=torch.channels_last)
    recipe = cfg.recipe
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=recipe.lr,
        momentum=recipe.momentum,
        weight_decay=recipe.weight_decay,
        nesterov=recipe.nesterov,
        fused=cfg.fused_sgd or None,  # None: PyTorch picks its implementation
    )
    method.setup(RunContext(model, len(train_data), recipe.epochs, device, cfg.seed, recipe.lr_at))
    return Training(
        cfg=cfg,
        model=model,
        optimizer=optimizer,
        method=method,
        train_data=train_data,
        test_data=test_data,
        generator=torch.Generator(device=device).manual_seed(cfg.seed),
        autocast=autocast(device, cfg.amp),
        costs=StepCosts(model, cfg.channels_last),
        processes=processes,
        step_models={},
    )


def fit(
    cfg: RunConfig,
    train_split: Split,
    test_split: Split,
    method: Method,
    resume: dict[str, Any] | None = None,
    on_epoch_end: EpochCallback | None = None,
    processes: Processes = ONE,
) -> list[dict[str, Any]]:
    """Train `cfg` and return its history, one row per epoch. `resume`: a state given to `on_epoch_end` earlier."""
    t = prepare(cfg, train_split, test_split, method, processes)
    history = restore(t, resume) if resume is not None else []
    epochs = tqdm(range(len(history) + 1, cfg.recipe.epochs + 1), desc=cfg.name, unit="epoch",
                  initial=len(history), total=cfg.recipe.epochs, disable=None if processes.main else True)  # fmt: skip
    for epoch in epochs:
        history.append(run_epoch(t, epoch))
        epochs.set_postfix(loss=f"{history[-1]['train_loss']:.3f}", acc=f"{history[-1]['test_acc']:.2f}")
        if on_epoch_end is not None:
            on_epoch_end(history, checkpoint_state(t, history))
    return history


def run_epoch(t: Training, epoch: int) -> dict[str, Any]:
    """Train one epoch, evaluate, let the method see the accuracy: the epoch's history row."""
    lr = t.cfg.recipe.lr_at(epoch)
    for group in t.optimizer.param_groups:
        group["lr"] = lr
    row: dict[str, Any] = {"epoch": epoch, "lr": lr, "threads": torch.get_num_threads()}
    row |= train_epoch(t, epoch, lr)
    size, n = t.cfg.recipe.batch_size, row["trained_samples"]  # the parameters that trained still require grad
    row["train_flops"] = t.costs.epoch([size] * (n // size) + [n % size] * (n % size > 0))
    if not math.isfinite(row["train_loss"]):
        raise TrainingDiverged(
            f"{t.cfg.name}: the training loss became {row['train_loss']} in epoch {epoch} (lr {lr:g}); the run "
            f"stopped. Lower recipes.{t.cfg.study}.lr, or check the data and the model."
        )
    row |= evaluate(t, t.test_data)
    t.method.on_validation_end(epoch, row["test_acc"], lr)
    return row | t.method.epoch_metrics()


def train_epoch(t: Training, epoch: int, lr: float) -> dict[str, Any]:
    """One pass over the samples the method picks, in a seeded random order; the method's choice counts as
    training time."""
    data, method, device, processes = t.train_data, t.method, t.train_data.device, t.processes
    synchronize(device)
    start = time.perf_counter()
    t.model.train()
    indices = method.on_epoch_start(epoch, lr)
    if indices is None:
        indices = torch.arange(len(data), device=device)
    if len(indices) == 0:
        raise UserError(f"epoch {epoch}: the method {method.name!r} selected no samples to train on")
    order = indices[torch.randperm(len(indices), generator=t.generator, device=device)]
    size = t.cfg.recipe.batch_size
    batches = order.split(size)
    model, uncompiled = t.step_model()  # for the parameters the method left trainable
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    losses_seen = []  # this process's per-sample losses, batch by batch
    for batch in tqdm(
        batches, desc=f"epoch {epoch}", unit="batch", leave=False, disable=None if processes.main else True
    ):
        part = processes.part(len(batch))  # the whole batch on one process
        x, y = data.batch(batch, t.cfg.recipe.augment, t.generator, part)
        with t.autocast:
            logits = (model if len(batch) == size else uncompiled)(x)
        losses = F.cross_entropy(logits.float(), y, reduction="none")
        weights = method.loss_weights(batch[part])
        objective = losses if weights is None else losses * weights  # weighted: its mean is what trains and is logged
        # DistributedDataParallel averages over processes: scaled so, that average is the whole batch's mean's gradient
        loss = objective.mean() if not processes.active else objective.sum() * (processes.world / len(batch))
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.optimizer.step()
        losses_seen.append(losses.detach())
        loss_sum += objective.detach().sum()
        correct += (logits.argmax(1) == y).sum()
    for batch, losses in zip(batches, global_losses(processes, [len(b) for b in batches], losses_seen), strict=True):
        method.on_batch_end(batch, losses)
    sum_all(processes, loss_sum, correct)
    synchronize(device)
    return {
        "train_loss": loss_sum.item() / len(order),
        "train_acc": 100 * correct.item() / len(order),
        "trained_samples": len(order),
        "epoch_train_s": time.perf_counter() - start,
    }


@torch.no_grad()
def evaluate(t: Training, data: DeviceData) -> dict[str, float]:
    """Loss and accuracy on `data` (each process evaluates its part, the sums are exchanged)."""
    synchronize(data.device)
    start = time.perf_counter()
    t.model.eval()
    model, uncompiled = t.step_model()
    loss_sum = torch.zeros((), device=data.device)
    correct = torch.zeros((), device=data.device, dtype=torch.long)
    mine = torch.arange(len(data), device=data.device)[t.processes.part(len(data))]
    batches = mine.split(t.cfg.eval_batch_size)
    for batch in batches:
        x, y = data.batch(batch)
        with t.autocast:
            logits = (model if len(batch) == len(batches[0]) else uncompiled)(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    sum_all(t.processes, loss_sum, correct)
    synchronize(data.device)
    return {
        "test_loss": loss_sum.item() / len(data),
        "test_acc": 100 * correct.item() / len(data),
        "eval_s": time.perf_counter() - start,
    }


def checkpoint_state(t: Training, history: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything an exact resume needs; the lr comes from the schedule, by epoch."""
    return {
        "model": t.model.state_dict(),
        "optimizer": t.optimizer.state_dict(),
        "method": t.method.state_dict(),
        "generator": t.generator.get_state(),
        "rng": rng_states(t.train_data.device),
        "history": history,
    }


def restore(t: Training, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Load a checkpoint_state() into `t`; returns the history it holds."""
    t.model.load_state_dict(state["model"])
    t.optimizer.load_state_dict(state["optimizer"])
    t.method.load_state_dict(state["method"])
    t.generator.set_state(state["generator"])
    set_rng_states(state["rng"], t.train_data.device)
    return list(state["history"])


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


def final_metrics(history: list[dict[str, Any]]) -> dict[str, float]:
    """Run-level figures: both papers' accuracy measures, the training time and its cost."""
    accs = [row["test_acc"] for row in history]
    return {
        "final_acc": accs[-1],  # the WUS paper's measure (final-epoch validation accuracy)
        "best_acc": max(accs),
        "best3_acc": sum(sorted(accs)[-3:]) / min(3, len(accs)),  # the DFP paper's measure
        "train_time_s": sum(row["epoch_train_s"] for row in history),
        "eval_time_s": sum(row["eval_s"] for row in history),
        "total_trained_samples": sum(row["trained_samples"] for row in history),
        "total_train_flops": sum(row["train_flops"] for row in history),
        "epochs": len(history),
    }
