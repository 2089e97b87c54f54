"""Prepared data: read from data/prepared/<dataset>/ (written by prepare.py), then held on the training device as
one uint8 tensor from which batches are gathered by index.

No DataLoader, no workers: random crop (4-pixel zero padding, as torchvision's RandomCrop(32, padding=4) on the
PIL image) and horizontal flip are gathers over the whole batch from images stored already padded (see crop()),
then the batch is normalised. Every random draw comes from the generator passed in, so a run is reproducible from
its seed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from cheaptrain import UserError

SPLITS = ("train", "test")
IMAGE_SHAPE = (32, 32, 3)
PAD = 4


class DataError(UserError):
    """The data source or the prepared data is unusable; the message says what is wrong and what to do."""


def describe_error(error: BaseException) -> str:
    """The error on one line: messages are printed as one paragraph (tarfile's span several lines)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


@dataclass
class Split:
    images: np.ndarray  # uint8 [N, 32, 32, 3] (HWC, RGB)
    labels: np.ndarray  # int64 [N]
    classes: list[str]


def load_split(prepared_dir: Path, split: str) -> Split:
    """Load one split written by `write_prepared`; DataError if the folder is missing or incomplete."""
    prepared_dir = Path(prepared_dir)
    if split not in SPLITS:
        raise DataError(f"Unknown split {split!r}: expected one of {', '.join(SPLITS)}.")
    manifest_path, path = prepared_dir / "manifest.json", prepared_dir / f"{split}.npz"
    missing = [p.name for p in (manifest_path, path) if not p.is_file()]
    if missing:
        raise DataError(
            f"{prepared_dir} holds no complete prepared data (missing: {', '.join(missing)}). "
            "Run the download stage first (dvc repro download)."
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        with np.load(path, allow_pickle=False) as npz:
            images, labels, classes = npz["images"], npz["labels"], [str(c) for c in npz["classes"]]
    except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(
            f"Cannot read the prepared data in {prepared_dir} ({describe_error(e)}). Run the "
            "download stage again (dvc repro download --force)."
        ) from e
    count = manifest.get("splits", {}).get(split, {}).get("count") if isinstance(manifest, dict) else None
    if (
        images.dtype != np.uint8
        or images.shape[1:] != IMAGE_SHAPE
        or labels.shape != (len(images),)
        or count != len(images)
    ):
        raise DataError(
            f"{path} does not match its manifest ({images.dtype} {images.shape}, {labels.shape} "
            f"labels, manifest count {count}). Run the download stage again "
            "(dvc repro download --force)."
        )
    return Split(images=images, labels=labels.astype(np.int64, copy=False), classes=classes)


def prepared_digest(prepared_dir: Path) -> str:
    """A digest of the prepared arrays (both splits' files, written deterministically): the same data, the same
    digest, whichever archive or path it was prepared from."""
    digest = hashlib.sha256()
    for split in SPLITS:
        with open(Path(prepared_dir) / f"{split}.npz", "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


class DeviceData:
    """One split on `device`: images uint8 [N, H, W, C] (stored zero-padded by PAD for the crops), labels int64 [N]."""

    def __init__(
        self, split: Split, device: torch.device, mean: torch.Tensor, std: torch.Tensor, channels_last: bool = False
    ) -> None:
        images = torch.from_numpy(split.images).to(device)
        self.padded = F.pad(images, (0, 0, PAD, PAD, PAD, PAD))  # [N, H + 2 PAD, W + 2 PAD, C]; pads C by 0
        self.labels = torch.from_numpy(split.labels).to(device)
        self.device = device
        # normalisation in 0-255 units, one value per pixel of an [H, W, C] image: an op over [B, H, W, C] that
        # broadcasts only over the batch takes PyTorch's fast path on CPU, 7x faster than broadcasting [1, C, 1, 1]
        _, h, w, c = images.shape
        self.mean = (mean * 255).to(device).expand(h, w, c).contiguous()
        self.std = (std * 255).to(device).expand(h, w, c).contiguous()
        self.channels_last = channels_last

    def __len__(self) -> int:
        return len(self.labels)

    def batch(
        self,
        indices: torch.Tensor,
        augment: bool = False,
        generator: torch.Generator | None = None,
        part: slice | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (float, normalised, [B, C, H, W]) and labels of `indices`, augmented if asked; with `part`, of
        indices[part] only, the random draws still made for all of `indices` (every process of a data-parallel run
        draws the same numbers, so their generators stay in step)."""
        # [B, H, W, C] uint8, gathered from the padded store
        if augment:
            images = random_crop_flip(self.padded, indices, PAD, generator, part)
        else:
            images = crop(self.padded, indices[part or slice(None)], PAD, PAD, PAD)  # the unpadded images
        x = images.float().sub_(self.mean).div_(self.std).permute(0, 3, 1, 2)  # [B, C, H, W], channels_last strides
        return (x if self.channels_last else x.contiguous()), self.labels[indices[part or slice(None)]]


def random_crop_flip(
    padded: torch.Tensor,
    indices: torch.Tensor,
    pad: int,
    generator: torch.Generator | None,
    part: slice | None = None,
) -> torch.Tensor:
    """Images `indices` of `padded` [N, H + 2 pad, W + 2 pad, C], each cropped to H x W at a random offset and
    flipped left-right with probability 1/2; with `part`, only indices[part], from the draws made for all."""
    b, device = len(indices), padded.device
    # one draw of 2 x b: on the CPU, the same numbers as two draws of b (the tests' replay of torchvision draws so)
    dy, dx = torch.randint(0, 2 * pad + 1, (2, b), generator=generator, device=device)
    flip = torch.rand(b, generator=generator, device=device) < 0.5
    if part is not None:
        indices, dy, dx, flip = indices[part], dy[part], dx[part], flip[part]
    return crop(padded, indices, pad, dy, dx, flip)


def crop(
    padded: torch.Tensor,
    indices: torch.Tensor,
    pad: int,
    dy: torch.Tensor | int,
    dx: torch.Tensor | int,
    flip: torch.Tensor | None = None,
) -> torch.Tensor:
    """The H x W crops at offsets (dy, dx) (per image, or one for all) of images `indices` of `padded`, flipped
    left-right where `flip`. Two gathers: the crop's whole padded rows, copied as contiguous runs, then its
    columns within them: one contiguous copy per row instead of one per pixel. The offsets come from tables made
    once, so that a batch takes few small ops."""
    n, hp, wp, c = padded.shape
    b, h, w = len(indices), hp - 2 * pad, wp - 2 * pad
    row_tables, col_tables = _crop_tables(h, w, c, pad, padded.device)
    rows = torch.add(row_tables[dy], indices.view(-1, 1), alpha=hp).view(-1)  # [B * H] rows of the store
    cropped_rows = padded.view(n * hp, wp * c).index_select(0, rows).view(b, h, wp * c)
    col_bytes = col_tables[dx if flip is None else torch.add(dx, flip, alpha=2 * pad + 1)]  # [B, W * C] or [W * C]
    return cropped_rows.gather(2, col_bytes.view(-1, 1, w * c).expand(b, h, w * c)).view(b, h, w, c)


@functools.cache
def _crop_tables(h: int, w: int, c: int, pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each crop offset: its rows in a padded image, [2 pad + 1, H]; and the bytes of its W x C pixels within a
    padded row, read forwards (table rows 0 .. 2 pad) and backwards for a flip (the next 2 pad + 1), [2 (2 pad + 1),
    W * C]."""
    offsets = torch.arange(2 * pad + 1)
    rows = offsets[:, None] + torch.arange(h)
    cols = offsets[:, None] + torch.arange(w)
    cols = torch.cat([cols, cols.flip(1)])
    col_bytes = (cols[:, :, None] * c + torch.arange(c)).view(len(cols), w * c)
    return rows.to(device), col_bytes.to(device)


def channel_stats(images_uint8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std (in [0, 1] units) of [N, H, W, C] uint8 images, from each channel's histogram of its
    256 values: exact counts, then float64 sums over 256 values rather than over every pixel, for the same float32
    results (tests/test_data.py) in a fraction of the time each run starts with."""
    channels = images_uint8.shape[-1]
    pixels = images_uint8.reshape(-1, channels)
    counts = torch.stack([torch.bincount(pixels[:, c].contiguous(), minlength=256) for c in range(channels)]).double()
    values = torch.arange(256, dtype=torch.float64) / 255
    count = len(pixels)
    mean = (counts * values).sum(1) / count
    return mean.float(), ((counts * values**2).sum(1) / count - mean**2).sqrt().float()
