"""The training data lives on the training device as one uint8 tensor; batches are gathered by index.

No DataLoader, no workers: random crop (4-pixel zero padding, as torchvision's RandomCrop(32, padding=4) on the
PIL image) and horizontal flip are tensor operations over the whole batch, then the batch is normalised. Every
random draw comes from the generator passed in, so a run is reproducible from its seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cheaptrain.prepare import Split

PAD = 4


class DeviceData:
    """One split on `device`: images uint8 [N, H, W, C], labels int64 [N]."""

    def __init__(
        self, split: Split, device: torch.device, mean: torch.Tensor, std: torch.Tensor, channels_last: bool = False
    ) -> None:
        self.images = torch.from_numpy(split.images).to(device)
        self.labels = torch.from_numpy(split.labels).to(device)
        self.device = device
        # normalisation in 0-255 units, shaped to broadcast over [B, C, H, W]
        self.mean = (mean * 255).view(1, -1, 1, 1).to(device)
        self.std = (std * 255).view(1, -1, 1, 1).to(device)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format

    def __len__(self) -> int:
        return len(self.labels)

    def batch(
        self, indices: torch.Tensor, augment: bool = False, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (float, normalised, [B, C, H, W]) and labels of `indices`, augmented if asked."""
        images = self.images[indices]  # [B, H, W, C] uint8
        if augment:
            images = random_crop(images, PAD, generator)
            images = random_flip(images, generator)
        # layout first, then float, then normalise in place: each step is ~10x cheaper on CPU in this order
        x = images.permute(0, 3, 1, 2).contiguous(memory_format=self.memory_format).float()
        return x.sub_(self.mean).div_(self.std), self.labels[indices]


def random_crop(images: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """Per-image random crop of [B, H, W, C] images after zero padding by `pad` pixels on every side."""
    b, h, w, _ = images.shape
    padded = F.pad(images, (0, 0, pad, pad, pad, pad))  # pads C by 0, W and H by `pad`
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator, device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device))[:, :, None]  # [B, H, 1]
    cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, :]  # [B, 1, W]
    return padded[torch.arange(b, device=images.device)[:, None, None], rows, cols]


def random_flip(images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Flip each [B, H, W, C] image left-right with probability 1/2."""
    flip = torch.rand(images.shape[0], generator=generator, device=images.device) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(2), images)


def channel_stats(images_uint8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (in [0, 1] units) of [N, H, W, C] uint8 images, computed in chunks."""
    total = torch.zeros(images_uint8.shape[-1], dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for chunk in images_uint8.split(10_000):
        x = chunk.reshape(-1, chunk.shape[-1]).double() / 255
        total += x.sum(0)
        total_sq += (x * x).sum(0)
    count = images_uint8[..., 0].numel()
    mean = total / count
    return mean.float(), (total_sq / count - mean**2).sqrt().float()
