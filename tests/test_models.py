"""Tests for the CIFAR model registry: parameter counts, shapes, conventions, option validation."""

import copy
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cheaptrain import UserError
from cheaptrain.models import MODELS, Conv2dNCHWInputGrad, MaxPool2x2, count_parameters, create_model, register

ALL_MODELS = sorted(MODELS)


@pytest.fixture(autouse=True, scope="module")
def _single_thread() -> Iterator[None]:
    """Batch-2 passes gain nothing from intra-op threads, and on a busy 2-core machine OpenMP threads
    waiting on each other made ResNet-50's forward/backward over 10x slower (10 s instead of 0.7 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _build(name: str, num_classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name, num_classes)


def _build_on_meta(name: str, num_classes: int = 10) -> nn.Module:
    """A model whose tensors have shapes but no storage: enough for structural checks, and free."""
    with torch.device("meta"):
        return create_model(name, num_classes)


def _modules_with_parameters(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if next(m.parameters(recurse=False), None) is not None]


def test_registry_has_all_paper_models() -> None:
    assert set(MODELS) == {
        "lenet", "alexnet", "vgg11", "vgg13", "vgg16", "vgg19",
        "resnet18", "resnet34", "resnet50", "wrn10", "wrn16", "wrn22",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        # kuangliu/pytorch-cifar figures
        ("resnet18", {}, 11_173_962),
        ("resnet34", {}, 21_282_122),
        ("resnet50", {}, 23_520_842),
        ("vgg16", {}, 14_728_266),
        # xternalz/WideResNet-pytorch WRN-16-8 (11.0M in the WRN paper), the default widen factor
        ("wrn16", {}, 10_961_370),
        ("wrn16", {"widen_factor": 8}, 10_961_370),
        # WRN paper Table: WRN-16-4 has 2.7M
        ("wrn16", {"widen_factor": 4}, 2_748_890),
        # LeNet-5: 456 + 2,416 + 48,120 + 10,164 + 850
        ("lenet", {}, 62_006),
        # bearpaw/pytorch-classification CIFAR AlexNet (2.47M in its README)
        ("alexnet", {}, 2_472_266),
    ],
)
def test_parameter_counts(name: str, kwargs: dict[str, object], expected: int) -> None:
    assert count_parameters(create_model(name, 10, **kwargs)) == expected


def test_count_parameters_includes_frozen() -> None:
    model = create_model("lenet", 10)
    total = count_parameters(model)
    model.features.requires_grad_(False)
    assert count_parameters(model) == total


@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_and_backward(name: str) -> None:
    model = _build(name).train()
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    nn.functional.cross_entropy(out, torch.tensor([0, 1])).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"parameters without a finite gradient: {no_grad}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_hundred_classes(name: str) -> None:
    model = _build(name, num_classes=100).eval()
    with torch.inference_mode():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)


# One model per family: the layers (and so any channels_last pitfall) are shared within a family.
@pytest.mark.parametrize("name", ["lenet", "alexnet", "vgg11", "resnet18", "wrn10"])
def test_channels_last_gives_the_same_logits(name: str) -> None:
    model = _build(name).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        out = model(x)
        out_cl = model.to(memory_format=torch.channels_last)(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(out_cl, out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["lenet", "alexnet"])
def test_pooling_before_relu_is_bitwise_the_textbook_order(name: str) -> None:
    """LeNet and AlexNet pool before their ReLU (cheaper); max-pool and ReLU commute, gradients included."""
    model = _build(name)
    textbook = copy.deepcopy(model)
    layers = [nn.MaxPool2d(2) if isinstance(layer, MaxPool2x2) else layer for layer in textbook.features]
    for i, layer in enumerate(layers[:-1]):  # and PyTorch's own pooling
        if isinstance(layer, nn.MaxPool2d) and isinstance(layers[i + 1], nn.ReLU):
            layers[i], layers[i + 1] = layers[i + 1], layer
    assert [type(m) for m in layers] != [type(m) for m in model.features]
    textbook.features = nn.Sequential(*layers)
    x = torch.randn(8, 3, 32, 32)
    outputs = [m(x) for m in (model, textbook)]
    for out in outputs:
        out.square().sum().backward()
    assert torch.equal(outputs[0], outputs[1])
    for (name_a, a), (_, b) in zip(model.named_parameters(), textbook.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name_a


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("shape", [(16, 6, 28, 28), (4, 3, 7, 9), (6, 5, 4)])
def test_maxpool2x2_is_pytorchs_max_pool(shape: tuple[int, ...], channels_last: bool) -> None:
    """The same output and input gradient as F.max_pool2d(x, 2), ties included (they go to a window's first
    maximum), odd sizes (the last row or column dropped) and unbatched input; channels_last stays so. NaN
    propagates; where its gradient goes does not matter (the trainer stops at a NaN loss)."""
    torch.manual_seed(0)
    x = torch.randn(shape).mul(1.5).round()  # many ties within windows, as in flat image regions
    x[..., 0, :4] = float("nan")  # NaN wins, as in PyTorch
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    outputs, grads = [], []
    for pool in (MaxPool2x2(), nn.MaxPool2d(2)):
        leaf = x.clone().requires_grad_()
        out = pool(leaf)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
        outputs.append(out)
        grads.append(leaf.grad)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0, equal_nan=True)
    finite = x.isfinite().unfold(-2, 2, 2).unfold(-2, 2, 2).flatten(-2).all(-1)  # windows without NaN
    finite = finite.repeat_interleave(2, -1).repeat_interleave(2, -2)
    finite = F.pad(finite, (0, x.shape[-1] % 2, 0, x.shape[-2] % 2), value=True)  # odd edges: zero gradient
    torch.testing.assert_close(grads[0][finite], grads[1][finite], rtol=0, atol=0)
    assert grads[0].stride() == x.stride()
    assert outputs[0].is_contiguous(memory_format=torch.channels_last) == (channels_last and x.dim() == 4)
    ties = x.unfold(-2, 2, 2).unfold(-2, 2, 2).flatten(-2)  # the windows
    assert ((ties == ties.amax(-1, keepdim=True)).sum(-1) > 1).any(), "the input should have tied windows"


def test_maxpool2x2_leaves_other_devices_to_pytorch() -> None:
    with torch.device("meta"):
        assert MaxPool2x2()(torch.empty(2, 6, 28, 28)).shape == (2, 6, 14, 14)


def _conv_pass(conv: nn.Conv2d, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Output, and the input's, weight's and bias's gradients, after a backward of a fixed random gradient."""
    conv.zero_grad(set_to_none=True)
    leaf = x.clone().requires_grad_()
    out = conv(leaf)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out, leaf.grad, conv.weight.grad, conv.bias.grad if conv.bias is not None else None


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize(
    "options",
    [{}, {"stride": 2, "padding": 1, "dilation": 2, "groups": 2, "bias": False}, {"stride": (1, 2), "padding": (2, 1)}],
)
def test_conv2d_nchw_input_grad_is_pytorchs_conv(options: dict, channels_last: bool) -> None:
    """nn.Conv2d's output and weight and bias gradients, bitwise; its input gradient up to float rounding, in the
    input's memory format."""
    torch.manual_seed(0)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    ours = Conv2dNCHWInputGrad(6, 16, 5, **options).to(memory_format=layout)
    pytorchs = nn.Conv2d(6, 16, 5, **options).to(memory_format=layout)
    pytorchs.load_state_dict(ours.state_dict())
    x = torch.randn(8, 6, 14, 14).to(memory_format=layout)
    out, grad_x, grad_weight, grad_bias = _conv_pass(ours, x)
    ref_out, ref_grad_x, ref_grad_weight, ref_grad_bias = _conv_pass(pytorchs, x)
    assert type(out.grad_fn).__name__ == "_Conv2dNCHWInputGradBackward"  # the path under test was taken
    assert torch.equal(out, ref_out)
    assert torch.equal(grad_weight, ref_grad_weight)
    assert (grad_bias is None) == ("bias" in options) and (grad_bias is None or torch.equal(grad_bias, ref_grad_bias))
    torch.testing.assert_close(grad_x, ref_grad_x)
    assert grad_x.is_contiguous(memory_format=layout)


def test_conv2d_nchw_input_grad_gradcheck() -> None:
    """Input, weight and bias gradients against finite differences (float64), strided, padded, dilated, grouped."""
    conv = Conv2dNCHWInputGrad(4, 6, 3, stride=2, padding=1, dilation=2, groups=2).double()
    x = torch.randn(2, 4, 9, 11, dtype=torch.double, requires_grad=True)

    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(conv, {"weight": weight, "bias": bias}, (x,))
        assert type(out.grad_fn).__name__ == "_Conv2dNCHWInputGradBackward"
        return out

    assert torch.autograd.gradcheck(forward, (x, conv.weight, conv.bias))


def test_conv2d_nchw_input_grad_leaves_the_rest_to_pytorch() -> None:
    """An input that needs no gradient (LeNet's first layer, WUS's frozen ones), unbatched input and other devices
    take nn.Conv2d's path; frozen weights still get the input's gradient, and nothing for themselves."""
    torch.manual_seed(0)
    conv = Conv2dNCHWInputGrad(6, 16, 5)
    assert type(conv(torch.randn(2, 6, 14, 14)).grad_fn).__name__ == "ConvolutionBackward0"
    unbatched = conv(torch.randn(6, 14, 14, requires_grad=True))
    assert unbatched.shape == (16, 10, 10)
    assert type(unbatched.grad_fn.next_functions[0][0]).__name__ == "ConvolutionBackward0"  # under a squeeze
    with torch.device("meta"):
        assert Conv2dNCHWInputGrad(6, 16, 5)(torch.empty(2, 6, 14, 14, requires_grad=True)).shape == (2, 16, 10, 10)
    pytorchs = nn.Conv2d(6, 16, 5)
    pytorchs.load_state_dict(conv.state_dict())
    x = torch.randn(2, 6, 14, 14)
    _, ref_grad_x, _, _ = _conv_pass(pytorchs, x)
    conv.requires_grad_(False)
    out, grad_x, grad_weight, grad_bias = _conv_pass(conv, x)
    assert type(out.grad_fn).__name__ == "_Conv2dNCHWInputGradBackward"
    assert grad_weight is None and grad_bias is None
    torch.testing.assert_close(grad_x, ref_grad_x)


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize("num_classes", [10, 100])
def test_last_module_with_parameters_is_the_classifier(name: str, num_classes: int) -> None:
    model = _build_on_meta(name, num_classes)
    last = _modules_with_parameters(model)[-1]
    assert isinstance(last, nn.Linear)
    assert last.out_features == num_classes
    assert last.bias is not None
    assert model.classifier is last
    assert next(reversed(list(model.named_parameters())))[0] == "classifier.bias"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_modules_are_defined_in_forward_order(name: str) -> None:
    """Weight Update Skipping takes modules() to be the data-flow order: check it against a forward."""
    model = _build_on_meta(name)
    called: list[nn.Module] = []
    handles = [
        m.register_forward_pre_hook(lambda module, _args: called.append(module))
        for m in _modules_with_parameters(model)
    ]
    model(torch.randn(2, 3, 32, 32, device="meta"))
    for handle in handles:
        handle.remove()
    assert called == _modules_with_parameters(model)  # each layer once, in definition order


@pytest.mark.parametrize("name", ALL_MODELS)
def test_bias_conventions(name: str) -> None:
    """Convs keep the bias their reference has (LeNet, AlexNet, VGG), ResNet/WRN convs have none."""
    model = _build_on_meta(name)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    conv_bias = name.startswith(("lenet", "alexnet", "vgg"))
    assert all((m.bias is not None) == conv_bias for m in convs)
    assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Linear))
    assert all(m.affine for m in model.modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize("name", ["vgg11", "vgg13", "vgg16", "vgg19"])
def test_vgg_batch_norm_option(name: str) -> None:
    with_bn = create_model(name, 10)
    without_bn = create_model(name, 10, batch_norm=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in with_bn.modules())
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in without_bn.modules())
    bn_layers = [m for m in with_bn.modules() if isinstance(m, nn.BatchNorm2d)]
    bn_params = sum(count_parameters(m) for m in bn_layers)
    assert count_parameters(without_bn) == count_parameters(with_bn) - bn_params
    assert count_parameters(without_bn) != count_parameters(with_bn)
    assert without_bn(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_vgg16_without_batch_norm_count() -> None:
    # 14,728,266 minus 2 x 4,224 BN parameters (13 BN layers).
    assert count_parameters(create_model("vgg16", 10, batch_norm=False)) == 14_719_818


@pytest.mark.parametrize("name", ["wrn10", "wrn16", "wrn22"])
def test_widen_factor_changes_count(name: str) -> None:
    counts = [count_parameters(create_model(name, 10, widen_factor=k)) for k in (1, 2, 8)]
    assert counts[0] < counts[1] < counts[2]
    assert counts[2] == count_parameters(create_model(name, 10))  # 8 is the default


def test_wrn_dropout_adds_no_parameters() -> None:
    plain = create_model("wrn10", 10, widen_factor=1)
    dropped = create_model("wrn10", 10, widen_factor=1, dropout=0.3)
    assert not any(isinstance(m, nn.Dropout) for m in plain.modules())
    assert any(isinstance(m, nn.Dropout) and m.p == 0.3 for m in dropped.modules())
    assert count_parameters(dropped) == count_parameters(plain)


def test_unknown_model_names_the_accepted_ones() -> None:
    with pytest.raises(UserError, match="unknown model 'resnet101'") as info:
        create_model("resnet101", 10)
    assert all(name in str(info.value) for name in MODELS)


@pytest.mark.parametrize(
    ("name", "kwargs", "expected_in_message"),
    [
        ("resnet18", {"batch_norm": False}, ["'batch_norm'", "'resnet18' accepts no options"]),
        ("vgg16", {"bn": False}, ["'bn'", "'vgg16'", "batch_norm (default True)"]),
        ("vgg16", {"batch_norm": "no"}, ["batch_norm must be true or false", "'vgg16'"]),
        ("wrn16", {"widen_factor": 0}, ["widen_factor must be an integer >= 1", "'wrn16'", "dropout"]),
        ("wrn16", {"widen_factor": 2.5}, ["widen_factor", "widen_factor (default 8)"]),
        ("wrn16", {"widen_factor": True}, ["widen_factor"]),
        ("wrn22", {"dropout": 1.0}, ["dropout must be a number in [0, 1)", "'wrn22'"]),
        ("wrn10", {"depth": 28}, ["'depth'", "widen_factor (default 8)", "dropout (default 0.0)"]),
    ],
)
def test_bad_options_name_the_accepted_ones(
    name: str, kwargs: dict[str, object], expected_in_message: list[str]
) -> None:
    with pytest.raises(UserError) as info:
        create_model(name, 10, **kwargs)
    for expected in expected_in_message:
        assert expected in str(info.value)


@pytest.mark.parametrize("num_classes", [1, 0, -3, True, 2.0, "10"])
def test_bad_num_classes(num_classes: object) -> None:
    with pytest.raises(UserError, match="num_classes"):
        create_model("lenet", num_classes)  # type: ignore[arg-type]


def test_two_classes_is_enough() -> None:
    assert create_model("lenet", 2)(torch.randn(2, 3, 32, 32)).shape == (2, 2)


def test_registering_a_name_twice_fails() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register("lenet")(lambda num_classes: nn.Linear(1, num_classes))
    assert MODELS["lenet"](10).__class__.__name__ == "LeNet"
