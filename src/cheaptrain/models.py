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

Choices the papers leave open:

- AlexNet (Weight Update Skipping paper, unspecified): the widely used CIFAR AlexNet of
  bearpaw/pytorch-classification: convs 64(k11, s4, p5)-192(k5)-384-256-256(k3), max-pools after the
  1st, 2nd and 5th conv, so a 32x32 image ends as 256x1x1, then a single Linear classifier (the
  ImageNet 4096-wide FC layers are dropped). No BatchNorm, all layers with bias.
- WRN widen factor (Data Fine-Pruning paper, unspecified): 8. Its Table 1 puts WRN-10/16/22 at
  3 h 24 min / 5 h 8 min / 6 h 53 min against 1277 s for ResNet-18 and 3931 s for ResNet-50. Thin
  WRNs (k=1: 0.01-0.04 GMAC per image, 0.08M-0.27M params) would train faster than ResNet-18 (0.56 GMAC),
  and its WRN-16 accuracy (94.2%) is beyond a thin net, so only a wide one fits. No k makes the times
  proportional to FLOPs (WRN-10-8 costs 0.64 GMAC, about ResNet-18's), so k is not pinned down; k=8 is a
  standard configuration of the WRN paper (WRN-16-8) and keeps WRN-10/16/22 at 4.8M/11.0M/17.2M params
  and 0.64/1.55/2.45 GMAC. ``widen_factor`` and ``dropout`` are options.
- VGG convs keep their bias even before BatchNorm, as in kuangliu's code: that is what gives VGG-16 its
  published 14,728,266 parameters, and the WUS paper's VGG-11 convs appear to have biases ("2359296 weights and
  512 biases" for its 8th layer). ResNet/WRN convs have no bias, as in their references. Under BN a conv
  bias gets a ~0 gradient in training (BN subtracts the batch mean), so a bias-only update should go
  to the BN shift. The WUS paper mentions BatchNorm only for ResNet-18, which suggests its VGGs ran
  with ``batch_norm=False``.

Conventions (Weight Update Skipping relies on them): submodules are defined in forward order, so
``modules()`` / ``named_parameters()`` visit layers in data-flow order (a residual shortcut comes after
the main branch of its block); the last module with parameters is the classifier ``nn.Linear``, which
every model also exposes as ``model.classifier``.
"""

import inspect
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx

from cheaptrain import UserError

__all__ = ["MODELS", "count_parameters", "create_model", "register"]

ModelFactory = Callable[..., nn.Module]
_F = TypeVar("_F", bound=ModelFactory)

MODELS: dict[str, ModelFactory] = {}


def register(name: str) -> Callable[[_F], _F]:
    """Add a factory ``f(num_classes, *, option=default, ...)`` to MODELS under ``name``."""

    def decorator(factory: _F) -> _F:
        if name in MODELS:
            raise ValueError(f"model {name!r} is registered twice")
        MODELS[name] = factory
        return factory

    return decorator


def _options(factory: ModelFactory) -> dict[str, object]:
    """The keyword-only options of a factory, with their defaults."""
    return {
        p.name: p.default
        for p in inspect.signature(factory).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _describe_options(name: str) -> str:
    options = _options(MODELS[name])
    if not options:
        return f"model {name!r} accepts no options"
    listed = ", ".join(f"{key} (default {value!r})" for key, value in options.items())
    return f"model {name!r} accepts: {listed}"


def _invalid(model: str, message: str) -> UserError:
    return UserError(f"{message}; {_describe_options(model)}")


def _check_int(model: str, option: str, value: object, minimum: int) -> int:
    # bool is an int subclass, but widen_factor=True is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _invalid(model, f"{option} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_bool(model: str, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _invalid(model, f"{option} must be true or false, got {value!r}")
    return value


def _check_probability(model: str, option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise _invalid(model, f"{option} must be a number in [0, 1), got {value!r}")
    return float(value)


def create_model(name: str, num_classes: int, **kwargs: object) -> nn.Module:
    """Build the registered model ``name`` with a ``num_classes``-way classifier and fresh weights."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; accepted models: {', '.join(MODELS)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise UserError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    unknown = [key for key in kwargs if key not in _options(MODELS[name])]
    if unknown:
        raise _invalid(name, f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r}")
    return MODELS[name](num_classes, **kwargs)


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


class MaxPool2x2(nn.Module):
    """nn.MaxPool2d(2) in elementwise ops, for few channels on the CPU: the same output and gradient.

    PyTorch's CPU pooling kernel vectorises over channels, which LeNet's first pool (6 channels) hardly fills; this
    takes about half its time (benchmarks/layers.py). Forward: the max of each pair of columns, then of each pair of
    rows. Backward gives each window's gradient to its first maximum in row-major order, as PyTorch does, so
    training is bitwise the same (a loser's zero gradient may carry a minus sign, which no sum downstream sees).
    Elsewhere PyTorch's own kernel is as fast or faster: other devices, and wider layers.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return F.max_pool2d(x, 2)
        h, w = x.shape[-2:]
        return _MaxPool2x2.apply(x[..., : h - h % 2, : w - w % 2])  # an odd last row or column is dropped


class _MaxPool2x2(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        cols = _pair_max(x, -1)
        ctx.save_for_backward(x, cols)
        return _pair_max(cols, -2)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        x, cols = ctx.saved_tensors
        return _pair_grad(x, _pair_grad(cols, grad, -2), -1)


def _pair_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The max of each pair of neighbours along `dim` (negative, so that the pair dim lands at `dim`)."""
    first, second = x.unflatten(dim, (-1, 2)).unbind(dim)
    return torch.maximum(first, second)


def _pair_grad(x: torch.Tensor, grad: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient at `x` of _pair_max(x, dim), given `grad` at its output; a tie goes to the first of a pair."""
    first, second = x.unflatten(dim, (-1, 2)).unbind(dim)
    x_grad = torch.empty_like(x)  # with x's strides: channels_last stays channels_last
    to_first, to_second = x_grad.unflatten(dim, (-1, 2)).unbind(dim)
    torch.gt(second, first, out=to_second)  # 1.0 where the second wins, else 0.0
    to_second.mul_(grad)
    torch.sub(grad, to_second, out=to_first)
    return x_grad


class Conv2dNCHWInputGrad(nn.Conv2d):
    """nn.Conv2d whose input gradient, on the CPU, is computed on NCHW tensors.

    oneDNN's channels_last kernel for the input gradient is slow with few channels: for LeNet's second conv (6 -> 16
    channels on 14 x 14) it takes 1.6-2.3x the NCHW kernel's time. With this layer the conv's forward and backward
    take 0.84-0.89x of nn.Conv2d's time, and a LeNet training step 0.97-0.99x (benchmarks/layers.py). The forward
    and the weight and bias gradients are nn.Conv2d's own, bitwise; the input gradient is the same up to float
    rounding, and keeps the input's memory format. Wider layers lose with it (16 -> 32 channels: 2-4x slower), so
    only LeNet uses it. Other devices, and an input that needs no gradient, take nn.Conv2d's path.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type != "cpu"
            or x.dim() != 4  # unbatched
            or not x.requires_grad
            or self.padding_mode != "zeros"
            or isinstance(self.padding, str)
        ):
            return super().forward(x)
        return _Conv2dNCHWInputGrad.apply(
            x, self.weight, self.bias, (self.stride, self.padding, self.dilation, self.groups)
        )


class _Conv2dNCHWInputGrad(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv: tuple
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.conv, ctx.bias_sizes = conv, None if bias is None else list(bias.shape)
        return F.conv2d(x, weight, bias, *conv)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conv
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        if needs_x:
            grad_x = torch.nn.grad.conv2d_input(x.shape, weight.contiguous(), grad.contiguous(), *ctx.conv)
            if x.is_contiguous(memory_format=torch.channels_last):
                grad_x = grad_x.contiguous(memory_format=torch.channels_last)
        if needs_weight or needs_bias:  # nn.Conv2d's own kernel, on the tensors as they are
            _, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
                grad, x, weight, ctx.bias_sizes, stride, padding, dilation, False, [0, 0], groups,
                [False, needs_weight, needs_bias],
            )  # fmt: skip
        return grad_x, grad_weight, grad_bias, None


class LeNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, kernel_size=5),  # 32 -> 28
            MaxPool2x2(),  # -> 14; pooling before the ReLU is the same function, with 4x less ReLU work
            nn.ReLU(inplace=True),
            Conv2dNCHWInputGrad(6, 16, kernel_size=5),  # -> 10
            nn.MaxPool2d(2),  # -> 5
            nn.ReLU(inplace=True),
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
            nn.MaxPool2d(2),  # -> 4; pooling before the ReLU, as in LeNet
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.MaxPool2d(2),  # -> 2
            nn.ReLU(inplace=True),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.MaxPool2d(2),  # -> 1
            nn.ReLU(inplace=True),
        )
        self.classifier = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


@register("lenet")
def lenet(num_classes: int) -> nn.Module:
    return LeNet(num_classes)


@register("alexnet")
def alexnet(num_classes: int) -> nn.Module:
    return AlexNet(num_classes)


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


def _vgg(name: str, num_classes: int, batch_norm: object) -> nn.Module:
    return VGG(_VGG_CFGS[name], num_classes, _check_bool(name, "batch_norm", batch_norm))


@register("vgg11")
def vgg11(num_classes: int, *, batch_norm: bool = True) -> nn.Module:
    return _vgg("vgg11", num_classes, batch_norm)


@register("vgg13")
def vgg13(num_classes: int, *, batch_norm: bool = True) -> nn.Module:
    return _vgg("vgg13", num_classes, batch_norm)


@register("vgg16")
def vgg16(num_classes: int, *, batch_norm: bool = True) -> nn.Module:
    return _vgg("vgg16", num_classes, batch_norm)


@register("vgg19")
def vgg19(num_classes: int, *, batch_norm: bool = True) -> nn.Module:
    return _vgg("vgg19", num_classes, batch_norm)


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


@register("resnet18")
def resnet18(num_classes: int) -> nn.Module:
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes)


@register("resnet34")
def resnet34(num_classes: int) -> nn.Module:
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes)


@register("resnet50")
def resnet50(num_classes: int) -> nn.Module:
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes)


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


def _wrn(name: str, depth: int, num_classes: int, widen_factor: object, dropout: object) -> nn.Module:
    return WideResNet(
        depth,
        num_classes,
        widen_factor=_check_int(name, "widen_factor", widen_factor, minimum=1),
        dropout=_check_probability(name, "dropout", dropout),
    )


@register("wrn10")
def wrn10(num_classes: int, *, widen_factor: int = 8, dropout: float = 0.0) -> nn.Module:
    return _wrn("wrn10", 10, num_classes, widen_factor, dropout)


@register("wrn16")
def wrn16(num_classes: int, *, widen_factor: int = 8, dropout: float = 0.0) -> nn.Module:
    return _wrn("wrn16", 16, num_classes, widen_factor, dropout)


@register("wrn22")
def wrn22(num_classes: int, *, widen_factor: int = 8, dropout: float = 0.0) -> nn.Module:
    return _wrn("wrn22", 22, num_classes, widen_factor, dropout)
