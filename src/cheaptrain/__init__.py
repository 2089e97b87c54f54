"""Cheaper CIFAR training: Data Fine-Pruning and Weight Update Skipping, reproduced."""

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


class UserError(Exception):
    """A problem with the user's input or environment: stages print its message, not a traceback."""


def run_main(main: Callable[[], None]) -> None:
    """Run a stage's main(): a UserError exits with its message and status 2 instead of a traceback."""
    import sys

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write via a temporary file and a rename: readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_int(value: Any) -> bool:
    """An integer param, not a bool (YAML's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float param, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(text: str) -> int:
    """argparse type of a count (repeats, epochs, batches): an integer >= 1, or a usage error, not a traceback."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted: an integer >= 1")
    return value
