"""The benchmark scripts: they run on the training code as it is, and a bad count is a usage error."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def benchmark(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args], capture_output=True, text=True, cwd=REPO
    )


@pytest.mark.parametrize("script", ["loader", "malloc", "dfp", "wus", "noise", "checkpoint", "guards", "shapes"])
def test_a_benchmark_given_no_repeats_says_so_instead_of_a_traceback(script):
    option = {"malloc": "--rounds", "wus": "--batches", "noise": "--threads", "shapes": "--epochs"}.get(
        script, "--repeats"
    )
    result = benchmark(script, option, "0")
    assert result.returncode == 2, result.stderr
    assert f"argument {option}: '0' is not accepted: an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_wus_benchmark_times_every_phase_through_the_training_loop():
    result = benchmark("wus", "--models", "lenet", "--batches", "2")
    assert result.returncode == 0, result.stderr
    header, row = (line.split() for line in result.stdout.splitlines()[1:3])
    assert header[:5] == ["model", "batches", "normal", "skip", "forward"]
    assert row[:2] == ["lenet", "2"]
    assert all(float(ms) > 0 for ms in row[2:5])


def test_the_checkpoint_benchmark_times_epochs_without_a_checkpoint_and_with_one_each_way():
    result = benchmark("checkpoint", "--model", "lenet", "--epoch-s", "0.05", "--epochs", "2", "--repeats", "1")
    assert result.returncode == 0, result.stderr
    title, *ways, ratio = result.stdout.splitlines()
    assert title.startswith("lenet: a ") and "checkpoint after each epoch of about 0.05 s" in title
    assert [line.split()[0] for line in ways] == ["none", "in", "behind"]
    assert ways[0].endswith("+0.0% on an epoch without") and ratio.startswith("behind / in line: ")
