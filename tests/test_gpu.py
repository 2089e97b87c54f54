"""On a CUDA device: the loader's crops and flips against the CPU's, compiled bf16 training of every method against
eager fp32 (in the default mode and as CUDA graphs; WUS's phases each in graphs of their own, also after a resume in
a skip phase), a BatchNorm network's statistics under CUDA graphs, timing between device synchronisations, a
checkpoint written on the GPU and resumed there, and the GPU's UUID recorded as nvidia-smi names it.

Every test is marked `cuda` and skipped (counted as skipped) without a CUDA device. `python benchmarks/gpu_check.py
OUT` runs them on a GPU machine (`pytest -m cuda tests/test_gpu.py`).
"""

import dataclasses
import io
import re
import time

import pytest
import torch
import torch.nn.functional as F
from test_compile import (
    ALL_METHODS,
    METHODS,
    check_a_new_phase_compiles_its_own_graphs,
    check_each_kind_of_epoch_compiles_once,
    check_infobatch,
    check_skip_epochs_change_only_the_kept_bias,
    decisions,
    run,
)
from torch._dynamo.utils import counters

from cheaptrain.data import PAD, DeviceData, channel_stats, crop, random_crop_flip
from cheaptrain.methods import Method, create_method
from cheaptrain.tracking import machine_here
from cheaptrain.trainer import fit, prepare, run_epoch

from conftest import small_config, synthetic_split

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TRAIN, TEST = synthetic_split(300, seed=1), synthetic_split(100, seed=2)


def test_crops_and_flips_on_the_gpu_equal_the_cpus():
    """The same draws (replayed from the device's generator) crop and flip the same bytes on both devices; the
    normalised batch is the same up to float rounding, in channels_last."""
    split = synthetic_split(64, seed=3)
    padded = F.pad(torch.from_numpy(split.images), (0, 0, PAD, PAD, PAD, PAD))
    indices = torch.randperm(64, generator=torch.Generator().manual_seed(0))[:40]
    on_gpu = random_crop_flip(padded.cuda(), indices.cuda(), PAD, torch.Generator("cuda").manual_seed(5))
    replay = torch.Generator("cuda").manual_seed(5)  # the draws random_crop_flip makes, in its order
    dy, dx = torch.randint(0, 2 * PAD + 1, (2, 40), generator=replay, device="cuda")
    flip = torch.rand(40, generator=replay, device="cuda") < 0.5
    assert flip.any() and not flip.all() and len(dx.unique()) > 1  # the draws exercise both paths
    assert torch.equal(on_gpu.cpu(), crop(padded, indices, PAD, dy.cpu(), dx.cpu(), flip.cpu()))

    mean, std = channel_stats(torch.from_numpy(split.images))
    x_cpu, y_cpu = DeviceData(split, torch.device("cpu"), mean, std, channels_last=True).batch(indices)
    x_gpu, y_gpu = DeviceData(split, torch.device("cuda"), mean, std, channels_last=True).batch(indices.cuda())
    assert x_gpu.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x_gpu.cpu(), x_cpu)
    assert torch.equal(y_gpu.cpu(), y_cpu)


@pytest.mark.parametrize("method", METHODS)
def test_compiled_bf16_training_on_the_gpu_decides_and_learns_as_eager_fp32(method):
    """tests/test_compile.py's runs (and tolerances: the same decisions, accuracy within 3 points, one graph for each
    phase's training and evaluation) on the GPU."""
    eager, compiled = run(method, False, "off", "cuda"), run(method, True, "bf16", "cuda")
    assert decisions(compiled.history) == decisions(eager.history)
    assert eager.history[-1]["test_acc"] >= 95
    assert compiled.history[-1]["test_acc"] == pytest.approx(eager.history[-1]["test_acc"], abs=3)
    check_each_kind_of_epoch_compiles_once(compiled)
    if method.startswith("wus"):
        check_a_new_phase_compiles_its_own_graphs(compiled)
        check_skip_epochs_change_only_the_kept_bias(compiled)


def test_infobatch_compiled_in_bf16_on_the_gpu_prunes_and_learns_as_eager_fp32():
    """InfoBatch's selection (below-mean scores, a draw from its own generator on the device) and weighted losses on
    the GPU, under tests/test_compile.py's checks for it."""
    eager, compiled = run("infobatch", False, "off", "cuda"), run("infobatch", True, "bf16", "cuda")
    assert compiled.history[-1]["test_acc"] == pytest.approx(eager.history[-1]["test_acc"], abs=3)
    check_infobatch(eager, compiled)


@pytest.mark.parametrize("method", ALL_METHODS)
def test_cuda_graphs_train_every_method_as_eager_fp32(method):
    """`train.compile: reduce-overhead` (CUDA graphs, bf16): every compiled graph runs as CUDA graphs (none skipped),
    while the epochs' shorter last batches, whose sizes vary with pruning, run uncompiled between the replays; the
    methods decide as in eager fp32 (InfoBatch under check_infobatch's tolerances), learn as well, and a skip epoch
    changes only the kept bias."""
    eager, graphs = run(method, False, "off", "cuda"), run(method, "reduce-overhead", "bf16", "cuda")
    assert graphs.cudagraph_skips == 0
    assert graphs.history[-1]["test_acc"] == pytest.approx(eager.history[-1]["test_acc"], abs=3)
    if method == "infobatch":
        check_infobatch(eager, graphs)
    else:
        assert decisions(graphs.history) == decisions(eager.history)
        check_each_kind_of_epoch_compiles_once(graphs)
    if method.startswith("wus"):
        check_a_new_phase_compiles_its_own_graphs(graphs)
        check_skip_epochs_change_only_the_kept_bias(graphs)


def test_cuda_graphs_of_a_run_resumed_in_a_skip_phase_train_every_weight_when_it_falls_back():
    """tests/test_compile.py's resume in a skip phase, as CUDA graphs: the normal epoch after it records graphs of
    its own and trains every weight."""
    resumed = run("wus_lr", "reduce-overhead", "bf16", "cuda", resume_after=5)
    assert [row["phase"] for row in resumed.history] == [0, 0, 0, 0, 0, 1, 0, 1]
    assert resumed.cudagraph_skips == 0
    check_skip_epochs_change_only_the_kept_bias(resumed)
    check_a_new_phase_compiles_its_own_graphs(resumed)


def test_cuda_graphs_replay_a_batchnorm_networks_running_statistics():
    """ResNet-18, the GPU runs' model: each training step of its BatchNorm layers updates their running statistics,
    which the CUDA graphs must replay rather than skip or lose. No graph is skipped, every layer counts every batch
    (10 a epoch), and the statistics end as in the same compiled bf16 steps without graphs. The steps hold the weights
    (lr 0), so the two runs see the same activations: with learning weights two bf16 runs drift apart (on an H100,
    5 of a layer's 64 running means beyond 0.02 + 5% after 20 steps), and the comparison would say nothing."""
    states, skips = {}, {}
    for compile in (True, "reduce-overhead"):
        cfg = small_config(epochs=2, model="resnet18", lr=0.0)
        cfg = dataclasses.replace(cfg, compile=compile, amp="bf16", device="cuda")
        torch._dynamo.reset()
        before = counters["inductor"]["cudagraph_skips"]
        last: dict = {}  # the checkpoint state of the last epoch
        fit(cfg, TRAIN, TEST, Method(), on_epoch_end=lambda history, state, last=last: last.update(state))
        states[compile], skips[compile] = last["model"], counters["inductor"]["cudagraph_skips"] - before
    assert skips["reduce-overhead"] == 0
    graphs, plain = states["reduce-overhead"], states[True]
    tracked = [name for name in graphs if name.endswith("num_batches_tracked")]
    assert tracked and all(graphs[name].item() == 20 for name in tracked)  # 300 samples in batches of 32, 2 epochs
    for name in tracked:
        layer = name.removesuffix("num_batches_tracked")
        assert not torch.equal(graphs[layer + "running_var"], torch.ones_like(graphs[layer + "running_var"]))
        for statistic in ("running_mean", "running_var"):
            torch.testing.assert_close(graphs[layer + statistic], plain[layer + statistic], rtol=0.01, atol=1e-3)


def test_an_epoch_on_the_gpu_is_timed_between_device_synchronisations(monkeypatch):
    """Each clock read of the training and evaluation timers comes right after a device synchronisation, so the
    seconds are work done, not work queued."""
    t = prepare(dataclasses.replace(small_config(), device="cuda"), TRAIN, TEST, Method())
    events = []
    synchronize, perf_counter = torch.cuda.synchronize, time.perf_counter
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: (events.append("sync"), synchronize(device))[1])
    monkeypatch.setattr(time, "perf_counter", lambda: (events.append("clock"), perf_counter())[1])
    row = run_epoch(t, 1)
    clocks = [i for i, event in enumerate(events) if event == "clock"]
    assert len(clocks) == 4  # training: start, end; evaluation: start, end
    assert all(events[i - 1] == "sync" for i in clocks)
    assert row["epoch_train_s"] > 0 and row["eval_s"] > 0


def test_a_checkpoint_written_on_the_gpu_resumes_the_run_there(monkeypatch):
    """DFP (its counts and generator on the device) saved after epoch 2 and read back as the runner reads it
    (torch.load onto the CPU), then resumed on the GPU: the uninterrupted history. cuDNN is made deterministic, so
    only DFP's float atomics (its batch means) may move a loss in the last bits."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    knobs = dict(window=3, starting_point=1, attenuation=1.0, block=2, count=1, prune_num=60)  # prunes epochs 2, 4
    cfg = dataclasses.replace(small_config(epochs=4, method="dfp", milestones=(3,)), device="cuda")
    saved = {}

    def keep_epoch_2(history, state):
        if len(history) == 2:
            assert state["model"]["classifier.bias"].is_cuda and "cuda" in state["rng"]
            buffer = io.BytesIO()
            torch.save(state, buffer)
            saved["state"] = buffer.getvalue()

    full = fit(cfg, TRAIN, TEST, create_method("dfp", knobs), on_epoch_end=keep_epoch_2)
    state = torch.load(io.BytesIO(saved["state"]), map_location="cpu", weights_only=False)
    resumed = fit(cfg, TRAIN, TEST, create_method("dfp", knobs), resume=state)
    assert [row["pruned_samples"] for row in resumed] == [0, 60, 0, 60]
    for a, b in zip(full, resumed, strict=True):
        assert a.keys() == b.keys()
        for key in a.keys() - {"epoch_train_s", "eval_s", "selection_s"}:
            expected = pytest.approx(a[key], rel=1e-5) if isinstance(a[key], float) else a[key]
            assert b[key] == expected, f"epoch {a['epoch']}: {key}"


def test_a_run_on_the_gpu_records_its_uuid():
    """Two rented GPUs of one name are two machines (aggregate.machine_difference): the UUID tells them apart."""
    here = machine_here("cuda")
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", here["gpu_uuid"]), here
    assert here["device"] == torch.cuda.get_device_name() and machine_here("auto") == here
