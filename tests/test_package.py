"""The package root's small helpers, shared by the stages and the benchmark scripts."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from cheaptrain import positive_int

REPO = Path(__file__).resolve().parents[1]


def test_positive_int_accepts_counts_and_rejects_the_rest_as_a_usage_error():
    assert positive_int("1") == 1 and positive_int("12") == 12
    for text in ("0", "-3", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="an integer >= 1"):
            positive_int(text)


@pytest.mark.parametrize("script", ["loader", "layers", "malloc", "dfp", "wus"])
def test_a_benchmark_given_no_repeats_says_so_instead_of_a_traceback(script):
    option = {"malloc": "--rounds", "wus": "--batches"}.get(script, "--repeats")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), option, "0"], capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert f"argument {option}: '0' is not accepted: an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr
