"""The tensor-resident loader: crops, flips and normalisation equal torchvision's on the same draws."""

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF

from cheaptrain.data import DeviceData, channel_stats, random_crop_flip

from conftest import synthetic_split


def test_random_crop_flip_matches_torchvision_pad_crop_then_flip():
    images = torch.randint(0, 256, (400, 32, 32, 3), dtype=torch.uint8)
    padded = F.pad(images, (0, 0, 4, 4, 4, 4))
    indices = torch.randperm(400, generator=torch.Generator().manual_seed(0))[:300]
    out = random_crop_flip(padded, indices, 4, torch.Generator().manual_seed(1))
    replay = torch.Generator().manual_seed(1)  # the same draws, in the same order
    dy = torch.randint(0, 9, (300,), generator=replay)
    dx = torch.randint(0, 9, (300,), generator=replay)
    flip = torch.rand(300, generator=replay) < 0.5
    for k, i in enumerate(indices.tolist()):
        chw = images[i].permute(2, 0, 1)
        expected = TF.crop(TF.pad(chw, [4]), int(dy[k]), int(dx[k]), 32, 32)  # zero fill, like RandomCrop
        if flip[k]:
            expected = TF.horizontal_flip(expected)
        assert torch.equal(out[k].permute(2, 0, 1), expected)
    assert len(set(zip(dy.tolist(), dx.tolist(), strict=True))) > 60  # offsets really vary per image
    assert 110 < int(flip.sum()) < 190  # about half flipped


def test_a_batch_without_augmentation_is_the_stored_images():
    split = synthetic_split(32)
    data = DeviceData(split, torch.device("cpu"), torch.zeros(3), torch.ones(3) / 255)  # x = pixel values
    x, _ = data.batch(torch.tensor([7, 2]))
    assert torch.equal(x.permute(0, 2, 3, 1), torch.from_numpy(split.images[[7, 2]]).float())


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


@pytest.mark.parametrize("seed", range(10))
def test_channel_stats_are_bitwise_those_of_summing_every_pixel_in_float64(seed):
    """The histogram's float32 results are those of float64 sums over every pixel, the normalisation the ledger's
    entries trained with: a replay compares their epochs digit for digit."""
    images = torch.from_numpy(synthetic_split(37 * (seed + 1), seed=seed).images)
    x = images.reshape(-1, 3).double() / 255
    mean = x.sum(0) / len(x)
    expected = mean.float(), ((x * x).sum(0) / len(x) - mean**2).sqrt().float()
    assert all(torch.equal(a, b) for a, b in zip(channel_stats(images), expected, strict=True))
