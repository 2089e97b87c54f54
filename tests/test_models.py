"""Tests for the CIFAR model registry: parameter counts, shapes, conventions, option validation."""

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from cheaptrain import UserError
from cheaptrain.models import MODELS, count_parameters, create_model, register

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
        ("resnet18", {"batch_norm": False}, ["model resnet18.batch_norm: unknown parameter (accepted: none)"]),
        ("vgg16", {"bn": False}, ["model vgg16.bn: unknown parameter (accepted: batch_norm)"]),
        ("vgg16", {"batch_norm": "no"}, ["model vgg16.batch_norm: 'no' is invalid; accepted: true or false"]),
        ("wrn16", {"widen_factor": 0}, ["model wrn16.widen_factor: 0 is invalid; accepted: an integer >= 1"]),
        ("wrn16", {"widen_factor": 2.5}, ["model wrn16.widen_factor: 2.5 is invalid"]),
        ("wrn16", {"widen_factor": True}, ["model wrn16.widen_factor: True is invalid"]),
        ("wrn22", {"dropout": 1.0}, ["model wrn22.dropout: 1.0 is invalid; accepted: a number in [0, 1)"]),
        ("wrn10", {"depth": 28}, ["model wrn10.depth: unknown parameter (accepted: widen_factor, dropout)"]),
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
    assert MODELS["lenet"].factory(10).__class__.__name__ == "LeNet"
