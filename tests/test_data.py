"""The tensor-resident loader: crops, flips and normalisation equal torchvision's on the same draws."""

import torch
import torchvision.transforms.v2.functional as TF

from cheaptrain.data import DeviceData, channel_stats, random_crop, random_flip

from conftest import synthetic_split


def test_random_crop_matches_torchvision_pad_then_crop():
    images = torch.randint(0, 256, (64, 32, 32, 3), dtype=torch.uint8)
    out = random_crop(images, 4, torch.Generator().manual_seed(1))
    replay = torch.Generator().manual_seed(1)  # the same draws, in the same order
    dy = torch.randint(0, 9, (64,), generator=replay)
    dx = torch.randint(0, 9, (64,), generator=replay)
    for i in range(64):
        chw = images[i].permute(2, 0, 1)
        expected = TF.crop(TF.pad(chw, [4]), int(dy[i]), int(dx[i]), 32, 32)  # zero fill, like RandomCrop
        assert torch.equal(out[i].permute(2, 0, 1), expected)
    assert len(set(zip(dy.tolist(), dx.tolist(), strict=True))) > 30  # offsets really vary per image


def test_random_flip_flips_about_half_exactly():
    images = torch.randint(0, 256, (400, 32, 32, 3), dtype=torch.uint8)
    out = random_flip(images, torch.Generator().manual_seed(2))
    flipped = [
        torch.equal(o, TF.horizontal_flip(i.permute(2, 0, 1)).permute(1, 2, 0))
        for o, i in zip(out, images, strict=False)
    ]
    kept = [torch.equal(o, i) for o, i in zip(out, images, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 150 < sum(flipped) < 250


def test_batch_normalises_like_to_tensor_and_normalize():
    split = synthetic_split(32)
    mean, std = channel_stats(torch.from_numpy(split.images))
    data = DeviceData(split, torch.device("cpu"), mean, std)
    x, y = data.batch(torch.tensor([3, 5]))
    for row, i in enumerate([3, 5]):
        expected = TF.normalize(
            TF.to_dtype(torch.from_numpy(split.images[i]).permute(2, 0, 1), torch.float32, scale=True),
            mean.tolist(),
            std.tolist(),
        )
        torch.testing.assert_close(x[row], expected, atol=1e-5, rtol=1e-5)
        assert y[row] == split.labels[i]
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32


def test_channel_stats_match_numpy():
    split = synthetic_split(100)
    mean, std = channel_stats(torch.from_numpy(split.images))
    flat = split.images.reshape(-1, 3) / 255
    torch.testing.assert_close(mean, torch.tensor(flat.mean(0), dtype=torch.float32))
    torch.testing.assert_close(std, torch.tensor(flat.std(0), dtype=torch.float32))
