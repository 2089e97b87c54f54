"""Data-parallel training on CPU: two real processes started by torchrun (gloo) train a run as one process does.
The methods see the same global batches, so DFP prunes the same samples and WUS decides the same phases; a killed
data-parallel run resumes from its checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_reliability import (
    ONE_THREAD,
    assert_each_epoch_once,
    checkpointed_epochs,
    make_repo,
    only_run,
    stage_env,
    wait_for_checkpoint,
)

from cheaptrain import distributed

from conftest import read_csv, run_in

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
RUNS = ["dfp:baseline", "dfp:dfp", "wus:wus"]


def params_for(repo, **train) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"] |= {"threads": 1, **train}
    params["methods"]["dfp"] = dict(params["methods"]["dfp"]) | {  # pruning epochs 2, 4, 6: a quarter left out
        "window": 2, "starting_point": 0, "block": 2, "count": 1, "prune_num": 0.25,
    }  # fmt: skip
    params["methods"]["wus"] = params["methods"]["wus"] | {"std_window": 2, "std_threshold": 50.0, "patience": 2}
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        above = todo.pop()
        children = [child for child, parent in parents.items() if parent == above]
        found += children
        todo += children
    return found


def test_two_processes_train_the_baseline_dfp_and_wus_as_one_process_does(tmp_path):
    repo = make_repo(tmp_path / "repo", None)
    params_for(repo)
    run_in(repo, sys.executable, "tests/distributed_runs.py", "one", *RUNS, env=ONE_THREAD)
    run_in(repo, *TORCHRUN, "tests/distributed_runs.py", "two", *RUNS, env=ONE_THREAD)
    for run in RUNS:
        study, method = run.split(":")
        name = f"cifar10-lenet-{method}-s0"
        one, two = (read_csv(repo / folder / study / name / "history.csv") for folder in ("one", "two"))
        assert len(one) == len(two) == 6
        for a, b in zip(one, two, strict=True):
            for key in ("trained_samples", "train_flops", "pruned_samples", "phase", "updated_params"):
                assert a.get(key) == b.get(key), f"{name} epoch {a['epoch']}: {key}"
            assert float(a["test_acc"]) == pytest.approx(float(b["test_acc"]), abs=1.0), f"{name} epoch {a['epoch']}"
        if method == "dfp":
            assert [r["pruned_samples"] for r in two] == ["0", "64", "0", "64", "0", "64"]
            assert [r["flagged_samples"] for r in one] == [r["flagged_samples"] for r in two]
        if method == "wus":
            assert "1" in [r["phase"] for r in two]  # it skipped, with DDP rebuilt for the kept biases


def test_a_killed_data_parallel_run_resumes_from_its_checkpoint(tmp_path, empty_store):
    repo = make_repo(tmp_path / "repo", empty_store)
    params_for(repo, processes=2)  # the stage starts itself again under torchrun
    stage = ["python", "stages/train.py", "--study", "dfp", "--dataset", "cifar10", "--model", "lenet",
             "--method", "stateful", "--seed", "0"]  # fmt: skip
    proc = subprocess.Popen(stage, cwd=repo, env=stage_env(STATEFUL_EPOCH_SLEEP="0.5"), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for_checkpoint(proc, repo, 2)
    finally:
        for pid in [proc.pid, *descendants(proc.pid)]:  # torchrun and its workers (in sessions of their own)
            with contextlib.suppress(ProcessLookupError):  # one that ended since it was listed
                os.kill(pid, signal.SIGKILL)  # with no chance to react, as at a power loss
        proc.wait()
    killed_after = checkpointed_epochs(repo)
    assert 2 <= killed_after < 6
    resumed = run_in(repo, *stage, env=ONE_THREAD)
    assert f"resuming after epoch {killed_after}" in resumed.stderr
    history = read_csv(repo / "runs" / "dfp" / "cifar10-lenet-stateful-s0" / "history.csv")
    assert [int(r["epoch"]) for r in history] == [1, 2, 3, 4, 5, 6]
    assert [r["stateful_selections"] for r in history] == ["0", "1", "2", "3", "4", "5"]
    store = f"sqlite:///{repo / 'mlflow.db'}"
    run = only_run(store, "cifar10-lenet-stateful-s0")
    assert run.info.status == "FINISHED" and run.data.params["processes"] == "2"
    assert_each_epoch_once(store, run, history)
    assert not list((repo / "checkpoints" / "dfp").iterdir())


def test_a_rank_on_cuda_makes_its_gpu_current_before_joining_nccl(monkeypatch):
    """NCCL starts each rank's communicator on the current device: without selecting the rank's GPU first, every
    rank would start on GPU 0. On a CPU (gloo) nothing is selected."""
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: calls.append(("join", backend)))
    second = distributed.Processes(rank=1, world=2, local_rank=1, local_world=2)
    distributed.start(second, distributed.device_of(second, torch.device("cuda")))
    assert calls == [("set_device", torch.device("cuda", 1)), ("join", "nccl")]
    calls.clear()
    distributed.start(second, distributed.device_of(second, torch.device("cpu")))
    assert calls == [("join", "gloo")]
