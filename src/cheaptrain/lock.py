"""The lock: constraints.txt pins every package that `make` installs into .venv (cheaptrain's dependencies, its `dev`
extra's, and theirs), so that every machine gets the versions CI passed with, and the torch that trained the ledger's
CPU entries, which a replay needs to reproduce them digit for digit (run.json: `torch_version`).

    python -m cheaptrain.lock            # write constraints.txt from this environment, once `make test` passed in it
    python -m cheaptrain.lock --check    # exit 1 naming each package installed here at another version than the lock's

To upgrade a package: install it into .venv (`.venv/bin/pip install -U torch`), run `make test`, then `make lock`.
The lock lists what the platform it was written on installs; a package another platform installs beside it (or
another Python's backport) is not in it and installs unpinned there: `make lock` runs on Linux x86-64, CI's platform.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cheaptrain import UserError, atomic_write
from cheaptrain.cli import run_command

LOCK = Path(__file__).resolve().parents[2] / "constraints.txt"
HEADER = """\
# The exact versions `make` installs into .venv (pip install -c constraints.txt -e '.[dev]'): the packages CI passed
# with, and the torch that trained the ledger's CPU entries. Written by `make lock` (python -m cheaptrain.lock) from an
# environment in which `make test` passed, on Linux x86-64; `python -m cheaptrain.lock --check` compares one with it.
"""


def installed(root: str = "cheaptrain", extras: tuple[str, ...] = ("dev",)) -> dict[str, str]:
    """Every distribution that `root` with `extras` requires here, directly or through another, by name: version."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(root, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if (key := (canonicalize_name(name), wanted)) in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as e:
            raise UserError(f"{name} is required but not installed here: run `make test`, which installs it") from e
        if key[0] != canonicalize_name(root):
            found[dist.metadata["Name"]] = dist.version
        for line in dist.requires or []:
            required = Requirement(line)
            # a marker names a platform, a Python or an extra: "" stands for a requirement of no extra
            if required.marker is None or any(required.marker.evaluate({"extra": e}) for e in wanted | {""}):
                todo.append((required.name, frozenset(required.extras)))
    return found


def by_name(packages: dict[str, str]) -> list[tuple[str, str]]:
    """(name, version) in the order of names, whatever their case."""
    return sorted(packages.items(), key=lambda item: item[0].lower())


def read_lock(path: Path) -> dict[str, str]:
    """The lock's pins, by canonical name: version."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not (line := line.split("#", 1)[0].strip()):
            continue
        name, sep, version = (part.strip() for part in line.partition("=="))
        if not (sep and name and version):
            raise UserError(f"{path}:{number}: {line!r} is not name==version")
        pins[canonicalize_name(name)] = version
    return pins


def differences(pins: dict[str, str], here: dict[str, str]) -> list[str]:
    """Each package installed here that the lock does not pin, or pins at another version, in words."""
    found = []
    for name, version in by_name(here):
        pinned = pins.get(canonicalize_name(name))
        if pinned is None:
            found.append(f"{name} {version}: not in the lock")
        elif pinned != version:
            found.append(f"{name} {version}: the lock pins {pinned}")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.lock", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare this environment with the lock, write nothing")
    parser.add_argument("--lock", type=Path, default=LOCK, help="the lock file (default: the checkout's %(default)s)")
    args = parser.parse_args(argv)
    here = installed()
    if not args.check:
        pins = [f"{name}=={version}\n" for name, version in by_name(here)]
        atomic_write(args.lock, HEADER + "".join(pins))
        print(f"{args.lock}: {len(here)} packages pinned")
        return
    if not args.lock.is_file():
        raise UserError(f"{args.lock}: no such lock file")
    if found := differences(read_lock(args.lock), here):
        print("\n".join(found))
        print(f"{len(found)} of {len(here)} packages differ from {args.lock}: reinstall (rm .venv/bin/.installed; make "
              "test), or, to keep these versions, run `make lock` once `make test` passes")  # fmt: skip
        sys.exit(1)
    print(f"{len(here)} packages installed as {args.lock} pins them")


if __name__ == "__main__":
    run_command(main)
