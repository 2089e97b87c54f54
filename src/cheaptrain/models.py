"""CIFAR-sized (3x32x32 input) models, created by name: ``create_model("resnet18", num_classes=10)``.

=========  ============  ============================================================================
name       params (10)   architecture and source
=========  ============  ============================================================================
lenet            62,006  LeNet-5 for CIFAR, kuangliu/pytorch-cifar ``models/lenet.py``
alexnet       2,472,266  CIFAR AlexNet of bearpaw/pytorch-classification ``models/cifar/alexnet.py``
vgg11         9,231,114  VGG + BN, kuangliu/pytorch-cifar ``models/vgg.py`` (Simonyan & Zisserman 2015)
vgg13         9,416,010  idem
vgg16        14,728,266  idem
vgg19        20,040,522  idem
resnet18     11,173,962  CIFAR ResNet, kuangliu/pytorch-cifar ``models/resnet.py`` (He et al. 2016)
resnet34     21,282,122  idem, BasicBlock [3, 4, 6, 3]
resnet50     23,520,842  idem, Bottleneck [3, 4, 6, 3]
wrn10         4,764,634  WRN-10-8, xternalz/WideResNet-pytorch (Zagoruyko & Komodakis 2016)
wrn16        10,961,370  WRN-16-8, matches the reference code (11.0M in the WRN paper's Table)
wrn22        17,158,106  WRN-22-8
=========  ============  ============================================================================

The papers leave the AlexNet variant, the WRN widen factor and the VGG conv biases open: docs/models.md argues
each choice. Options (``model_args`` in a recipe) are declared with their register() call.

Conventions (Weight Update Skipping relies on them): submodules are defined in forward order, so
``modules()`` / ``named_parameters()`` visit layers in data-flow order (a residual shortcut comes after
the main branch of its block); the last module with parameters is the classifier ``nn.Linear``, which
every model also exposes as ``model.classifier``.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from cheaptrain import ConfigError, Param, UserError, check_params, is_int, is_number

__all__ = ["MODELS", "count_parameters", "create_model", "register"]


@dataclass(frozen=True)
class ModelEntry:
    factory: Callable[..., nn.Module]  # factory(num_classes, **options)
    options: dict[str, Param] = field(default_factory=dict)


MODELS: dict[str, ModelEntry] = {}


def register(name: str, **options: Param) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Add ``factory(num_classes, **options)`` to MODELS under ``name``, with its declared options."""

    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        MODELS[name] = ModelEntry(factory, options)
        return factory

    return decorator


def check_options(name: str, options: dict[str, object], key: str) -> list[str]:
    """One line per problem with the options of model ``name`` (unknown names, bad values), under ``key``."""
    return list(check_params(key, MODELS[name].options, options)[1].values())


def create_model(name: str, num_classes: int, **options: object) -> nn.Module:
    """Build the registered model ``name`` with a ``num_classes``-way classifier and fresh weights."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; accepted models: {', '.join(MODELS)}")
    if not is_int(num_classes) or num_classes < 2:
        raise UserError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    values, problems = check_params(f"model {name}", MODELS[name].options, options)
    if problems:
        raise ConfigError(list(problems.values()))
    return MODELS[name].factory(num_classes, **values)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, trainable and frozen alike (shared ones counted once)."""
    return sum(p.numel() for p in model.parameters())


def _kaiming_init(model: nn.Module) -> None:
    """He init (fan_out) for convs, as torchvision and the WRN reference do; BN keeps weight=1, bias=0."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                nn.init.zeros_(module.bias)


# --------------------------------------------------------------------------------------------------
# LeNet-5 and AlexNet: no BatchNorm, PyTorch default init as in their references.


class LeNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=5),  # 32 -> 28
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # -> 14
            nn.Conv2d(6, 16, kernel_size=5),  # -> 10
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # -> 5
        )
        self.hidden = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # flatten, not view: view fails on channels_last tensors.
        return self.classifier(self.hidden(torch.flatten(self.features(x), 1)))


class AlexNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=5),  # 32 -> 8
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # -> 4
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # -> 2
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),  # -> 1
        )
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


register("lenet")(LeNet)
register("alexnet")(AlexNet)


# --------------------------------------------------------------------------------------------------
# VGG: numbers are 3x3 conv widths, "M" a 2x2 max-pool; five pools take 32x32 down to 512x1x1.

_VGG_CFGS: dict[str, str] = {
    "vgg11": "64 M 128 M 256 256 M 512 512 M 512 512 M",
    "vgg13": "64 64 M 128 128 M 256 256 M 512 512 M 512 512 M",
    "vgg16": "64 64 M 128 128 M 256 256 256 M 512 512 512 M 512 512 512 M",
    "vgg19": "64 64 M 128 128 M 256 256 256 256 M 512 512 512 512 M 512 512 512 512 M",
}


class VGG(nn.Module):
    def __init__(self, cfg: str, num_classes: int, batch_norm: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for item in cfg.split():
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            width = int(item)
            # Conv bias kept even before BN, as in the reference (and in the published parameter counts).
            layers.append(nn.Conv2d(in_channels, width, kernel_size=3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(width))
            layers.append(nn.ReLU(inplace=True))
            in_channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(in_channels, num_classes)
        _kaiming_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


for _name, _layers in _VGG_CFGS.items():
    register(_name, batch_norm=Param(True, lambda v: isinstance(v, bool), "true or false"))(partial(VGG, _layers))


# --------------------------------------------------------------------------------------------------
# CIFAR ResNet: 3x3 stride-1 stem and no max-pool (32x32 is already small), post-activation blocks.


def _projection(in_planes: int, out_planes: int, stride: int) -> nn.Module:
    """Identity shortcut when shapes match, else a strided 1x1 conv + BN (option B of He et al.)."""
    if stride == 1 and in_planes == out_planes:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
        nn.BatchNorm2d(out_planes),
    )


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _projection(in_planes, planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x), inplace=True)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.shortcut = _projection(in_planes, out_planes, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = F.relu(self.bn2(self.conv2(out)), inplace=True)
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x), inplace=True)


ResidualBlock = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    def __init__(self, block: ResidualBlock, num_blocks: list[int], num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.in_planes = 64
        self.layer1 = self._make_layer(block, 64, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, 128, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, 256, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, 512, num_blocks[3], stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(512 * block.expansion, num_classes)
        _kaiming_init(self)

    def _make_layer(self, block: ResidualBlock, planes: int, n: int, stride: int) -> nn.Module:
        blocks = []
        for s in [stride] + [1] * (n - 1):  # only the first block of a stage downsamples
            blocks.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.classifier(torch.flatten(self.pool(out), 1))


register("resnet18")(partial(ResNet, BasicBlock, [2, 2, 2, 2]))
register("resnet34")(partial(ResNet, BasicBlock, [3, 4, 6, 3]))
register("resnet50")(partial(ResNet, Bottleneck, [3, 4, 6, 3]))


# --------------------------------------------------------------------------------------------------
# WideResNet-d-k: depth d = 6n + 4 with n two-conv blocks per group; group widths 16k, 32k, 64k.


class WideBasicBlock(nn.Module):
    """Pre-activation block BN-ReLU-conv3x3-BN-ReLU-(dropout)-conv3x3, as in the WRN reference code."""

    def __init__(self, in_planes: int, planes: int, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, padding=1, bias=False)
        self.shortcut: nn.Module = nn.Identity()
        self.preactivated_shortcut = stride != 1 or in_planes != planes
        if self.preactivated_shortcut:
            self.shortcut = nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        out = self.conv1(pre)
        out = self.conv2(self.dropout(F.relu(self.bn2(out), inplace=True)))
        # The reference feeds the projection the pre-activated input, the identity the raw one.
        return out + self.shortcut(pre if self.preactivated_shortcut else x)


class WideResNet(nn.Module):
    def __init__(self, depth: int, num_classes: int, widen_factor: int = 8, dropout: float = 0.0) -> None:
        super().__init__()
        assert (depth - 4) % 6 == 0, "WRN depth must be 6n + 4"
        n = (depth - 4) // 6
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=3, padding=1, bias=False)
        self.block1 = self._make_group(widths[0], widths[1], n, 1, dropout)
        self.block2 = self._make_group(widths[1], widths[2], n, 2, dropout)
        self.block3 = self._make_group(widths[2], widths[3], n, 2, dropout)
        self.bn = nn.BatchNorm2d(widths[3])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(widths[3], num_classes)
        _kaiming_init(self)

    @staticmethod
    def _make_group(in_planes: int, planes: int, n: int, stride: int, dropout: float) -> nn.Module:
        # Only the first block of a group changes width and resolution.
        blocks = [WideBasicBlock(in_planes, planes, stride, dropout)]
        blocks += [WideBasicBlock(planes, planes, 1, dropout) for _ in range(n - 1)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block3(self.block2(self.block1(self.conv1(x))))
        out = F.relu(self.bn(out), inplace=True)
        return self.classifier(torch.flatten(self.pool(out), 1))


WRN_OPTIONS = {
    "widen_factor": Param(8, lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "dropout": Param(0.0, lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
}
for _depth in (10, 16, 22):
    register(f"wrn{_depth}", **WRN_OPTIONS)(partial(WideResNet, _depth))
