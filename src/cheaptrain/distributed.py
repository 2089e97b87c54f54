"""Data-parallel training with torch.distributed, launched by torchrun: which process this is, and the few
collectives the loop needs. With one process every function here is the identity, and the loop trains as before.

Each global batch (the recipe's batch size) is split across the processes in rank order (`part`): every process
shuffles and draws augmentations for the whole epoch from the same seeded generator, so all agree on the batches
and no sample is padded in twice; a process whose part is empty still steps (a zero gradient), so none waits in a
collective for another. DistributedDataParallel averages the gradients; the loss is scaled so that this average is
the gradient of the global batch's mean loss. After the epoch's last step the processes exchange the per-sample
losses once, so every method sees every global batch, in order, exactly as on one process: the methods never know
how many processes train.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Processes:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """The process that logs, checkpoints and writes the outputs."""
        return self.rank == 0

    def part(self, size: int) -> slice:
        """This process's share of a global batch of `size` samples: contiguous, in rank order, sizes differing
        by at most one."""
        return slice(*bounds(self.rank, self.world, size))


def bounds(rank: int, world: int, size: int) -> tuple[int, int]:
    """Where the part of process `rank` of `world` starts and stops in a batch of `size`."""
    return rank * size // world, (rank + 1) * size // world


ONE = Processes()  # a single process: every collective is the identity


def from_environment() -> Processes:
    """The process group torchrun started (its RANK, WORLD_SIZE, LOCAL_RANK...), or a single process."""
    env = os.environ
    return Processes(
        rank=int(env.get("RANK", 0)),
        world=int(env.get("WORLD_SIZE", 1)),
        local_rank=int(env.get("LOCAL_RANK", 0)),
        local_world=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", 1))),
    )


def device_of(processes: Processes, device: torch.device) -> torch.device:
    """This process's device: on CUDA, the GPU of its local rank."""
    return torch.device("cuda", processes.local_rank) if device.type == "cuda" and processes.active else device


def start(processes: Processes, device: torch.device) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU) for the rest of the process's life (a group joined again
    after `stop` can hang in gloo's set-up); nothing for a single process."""
    if processes.active and not dist.is_initialized():
        if device.type == "cuda":  # NCCL binds each rank to the current device; without this, all to GPU 0
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def stop(processes: Processes) -> None:
    """Leave the process group, at the end of the process."""
    if processes.active and dist.is_initialized():
        dist.destroy_process_group()


def broadcast(processes: Processes, value: object) -> object:
    """The main process's `value`, on every process."""
    if not processes.active:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def sum_all(processes: Processes, *tensors: torch.Tensor) -> None:
    """Sum each tensor over the processes, in place."""
    if processes.active:
        for tensor in tensors:
            dist.all_reduce(tensor)


def global_losses(processes: Processes, batch_sizes: list[int], parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per global batch (of `batch_sizes`), the per-sample losses of every process's part, in rank order, from this
    process's per-step `parts`: one exchange per epoch."""
    if not processes.active:
        return parts
    world = processes.world
    lengths = [[stop - start for start, stop in (bounds(r, world, n) for n in batch_sizes)] for r in range(world)]
    mine = torch.cat(parts)
    padded = mine.new_zeros(max(sum(lens) for lens in lengths))
    padded[: len(mine)] = mine
    gathered = [torch.empty_like(padded) for _ in range(processes.world)]
    dist.all_gather(gathered, padded)
    per_rank = [g[: sum(lens)].split(lens) for g, lens in zip(gathered, lengths, strict=True)]
    return [torch.cat(step) for step in zip(*per_rank, strict=True)]
