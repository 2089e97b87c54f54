"""Cheaper CIFAR training: Data Fine-Pruning and Weight Update Skipping, reproduced.

The package root holds what every module may import without importing another: the error types, atomic writes, and
`Param`, the one way methods and models declare and validate their parameters.
"""

import argparse
import math
import os
import secrets
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UserError(Exception):
    """A problem with the user's input or environment: stages print its message, not a traceback."""


class ConfigError(UserError):
    """Bad params: one line per problem, each naming the key and what it accepts."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid params:\n" + "\n".join(f"  - {p}" for p in problems))


def run_main(main: Callable[[], None]) -> None:
    """Run a stage's main(): a UserError exits with its message and status 2 instead of a traceback."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write via a temporary file and a rename: readers see the old file or the new one, never half of one. A new
    file gets the permissions open() would give it (the umask's), a replaced one keeps its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the kernel applies the umask, as open() does
    try:
        with os.fdopen(fd, "wb") as f:
            if path.exists():
                os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def is_int(value: Any) -> bool:
    """An integer param, not a bool (YAML's true is an int to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float param, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def positive_int(text: str) -> int:
    """argparse type of a count (repeats, epochs, batches): an integer >= 1, or a usage error, not a traceback."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not accepted: an integer >= 1")
    return value


@dataclass(frozen=True)
class Param:
    """A declared parameter: its default, the test a value must pass, and what it accepts (for the error line)."""

    default: Any
    valid: Callable[[Any], bool]
    accepted: str


def check_params(
    key: str, declared: Mapping[str, Param], given: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The declared parameters with `given` over their defaults, and the problems by name (one line each, under
    `key`): an unknown name, or a value that fails its test."""
    accepted = ", ".join(declared) or "none"
    problems = {k: f"{key}.{k}: unknown parameter (accepted: {accepted})" for k in given if k not in declared}
    values = {k: p.default for k, p in declared.items()} | {k: v for k, v in given.items() if k in declared}
    problems |= {
        k: f"{key}.{k}: {values[k]!r} is invalid; accepted: {p.accepted}"
        for k, p in declared.items()
        if k in given and not p.valid(values[k])
    }
    return values, problems
