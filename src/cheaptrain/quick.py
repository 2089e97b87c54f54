"""Run the pipeline on an overlay of params.yaml (default: params.quick.yaml) as a DVC experiment.

    python -m cheaptrain.quick                    # dvc exp run -S <every leaf of params.quick.yaml>
    python -m cheaptrain.quick --dry-run          # print the command only
    python -m cheaptrain.quick -- --temp          # anything after -- goes to `dvc exp run`

The experiment runs in the workspace, so its runs, results and MLflow runs land there; then params.yaml is put back
as it was, so that the checkout is unchanged (`git status` clean) and a later `dvc repro` trains the papers' setting,
not the quick one. `dvc exp show` lists the experiment with its quick params. A source named in the environment
(CIFAR10_SOURCE=...) becomes the experiment's `download.cifar10.source`, so that DVC prepares the data from it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cheaptrain import UserError, atomic_write
from cheaptrain.cli import run_command
from cheaptrain.config import read_yaml
from cheaptrain.prepare import DATASETS, resolve_source


def overrides(overlay: dict[str, Any], prefix: str = "") -> list[str]:
    """{'a': {'b': [1, 2]}} -> ['a.b=[1, 2]']: one `-S` value per leaf (lists are leaves)."""
    out = []
    for key, value in overlay.items():
        if isinstance(value, dict) and value:
            out += overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value)}")  # JSON is YAML, which is how DVC reads -S values
    return out


def with_env_sources(
    overlay: dict[str, Any], params: dict[str, Any], root: Path, environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """The overlay with each $<DATASET>_SOURCE of `environ` as its `download.<dataset>.source`, a path made absolute
    against `root` (the repository the experiment runs in, as the download stage resolves it): a variable alone is
    invisible to DVC, which would keep data prepared from another source. Its sha256 goes (null) unless the variable
    names the source the overlay or params.yaml (`params`) already name: it is that archive's."""
    overlay = copy.deepcopy(overlay)
    for dataset in DATASETS:
        if not (value := environ.get(f"{dataset.upper()}_SOURCE", "").strip()):
            continue
        given = [(layer.get("download") or {}).get(dataset) or {} for layer in (overlay, params)]
        current = next((g["source"] for g in given if g.get("source")), "")
        entry = overlay.setdefault("download", {}).setdefault(dataset, {})
        entry["source"] = resolve_source(dataset, value, environment=False, root=root)
        if not current or resolve_source(dataset, current, environment=False, root=root) != entry["source"]:
            entry["sha256"] = None
    return overlay


def load_overlay(path: Path) -> dict[str, Any]:
    """The overlay file's params (an empty file: none); a UserError names the file and what is wrong with it."""
    if not path.is_file():
        raise UserError(f"overlay file {path} not found (run from the repository root, or name the file)")
    try:
        overlay = read_yaml(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"overlay file {path} is not valid YAML: {' '.join(str(e).split())}") from e
    if not isinstance(overlay, dict):
        raise UserError(f"overlay file {path} must hold a mapping of params sections, got {type(overlay).__name__}")
    return overlay


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cheaptrain.quick",
        usage="%(prog)s [-h] [--dry-run] [overlay] [-- DVC_EXP_RUN_ARGS ...]",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("overlay", nargs="?", default="params.quick.yaml", help="overlay file (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc command without running it")
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)  # what follows -- is dvc's alone, flags too
    overlay = load_overlay(Path(args.overlay))
    params = Path("params.yaml")
    overlay = with_env_sources(overlay, read_yaml(params.read_text()) or {} if params.is_file() else {}, Path.cwd())
    command = ["dvc", "exp", "run", *[a for o in overrides(overlay) for a in ("-S", o)], *extra]
    print(shlex.join(command), flush=True)
    if args.dry_run:
        return
    original = params.read_bytes()
    for signum in (signal.SIGTERM, signal.SIGHUP):  # a closed terminal, a CI timeout: params.yaml is still put back
        signal.signal(signum, lambda number, frame: sys.exit(128 + number))
    try:
        returncode = subprocess.run(command).returncode
    except FileNotFoundError:
        raise UserError("dvc is not on PATH: run in the project's environment (`source .venv/bin/activate`)") from None
    finally:
        atomic_write(params, original)  # `dvc exp run -S` wrote the overlay into it
    sys.exit(returncode)


if __name__ == "__main__":
    run_command(main)
