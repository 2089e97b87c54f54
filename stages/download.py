"""DVC stage `download`: fetch one CIFAR dataset and write it prepared to data/prepared/<dataset>/.

Reads params section `download.<dataset>` (source, sha256, train_size). The environment variable <DATASET>_SOURCE
(e.g. CIFAR10_SOURCE=../shared/datasets/cifar10-jpg.tar.gz) overrides the source, for offline machines.
Runs first: it also checks the params of every run of the grid and the MLflow store (before downloading), and
creates the MLflow experiments, in the workspace, so that their artifact stores never point into a temporary copy
of the repository. Logs one MLflow run (experiment `download`, named after the dataset): the source, the archive's
checksum, the images per split and class, and the seconds that fetching and preparing took. Where MLflow is not
installed (a GPU machine with PyTorch alone) or with `--no-mlflow`, it prepares the data and logs nothing.
"""

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain import UserError
from cheaptrain.cli import run_command
from cheaptrain.config import DATASETS

SETTINGS = ("source", "sha256", "train_size")  # of download.<dataset>; prepare_dataset reads these only


def download_settings(params: dict[str, Any], dataset: str) -> dict[str, Any]:
    """Params `download.<dataset>`, its types checked, and the keys of every dataset's section (before validate_grid,
    which reads every dataset's section)."""
    section = params.get("download") or {}
    if not isinstance(section, dict):
        raise UserError(f"download: {section!r} is invalid; accepted: a mapping of datasets and dataset sections")
    for name, settings in section.items():
        if name == "datasets":
            continue
        if name not in DATASETS:  # a misspelt section would pass unseen: `cifar-10: {train_size: 5000}` trains on all
            raise UserError(f"download.{name}: unknown; accepted: datasets, {', '.join(DATASETS)}")
        if not isinstance(settings or {}, dict):
            raise UserError(f"download.{name}: {settings!r} is invalid; accepted: a mapping ({', '.join(SETTINGS)})")
        # a typo would pass unseen: `sha_256:` turns the check off, `trainsize:` trains on every image
        if unknown := [f"download.{name}.{key}" for key in settings or {} if key not in SETTINGS]:
            raise UserError(f"{', '.join(unknown)}: unknown; accepted: {', '.join(SETTINGS)}")
    settings = section.get(dataset) or {}
    source, sha256 = settings.get("source", "torchvision"), settings.get("sha256")
    if not isinstance(source, str):
        raise UserError(f"download.{dataset}.source: {source!r} is invalid; accepted: torchvision, a URL or a path")
    if not (sha256 is None or isinstance(sha256, str)):
        raise UserError(f"download.{dataset}.sha256: {sha256!r} is invalid; accepted: null or the archive's SHA-256")
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, help="cifar10 or cifar100")
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--out", default="data/prepared", help="prepared data root (default: %(default)s)")
    parser.add_argument("--cache", default="data/raw", help="download cache (default: %(default)s)")
    parser.add_argument("--no-mlflow", action="store_true", help="prepare the data without logging to MLflow")
    args = parser.parse_args()

    from cheaptrain.config import load_params, validate_grid
    from cheaptrain.prepare import prepare_dataset, resolve_source
    from cheaptrain.tracking import ensure_experiment, log_download, mlflow_installed

    track = not args.no_mlflow and mlflow_installed("the download is not tracked (the prepared data is still written)")
    params = load_params(args.params)
    settings = download_settings(params, args.dataset)
    validate_grid(params)
    for experiment in ("download", *(params.get("grid") or {})) if track else ():
        ensure_experiment(experiment)
    param = settings.get("source", "torchvision")
    started = time.perf_counter()
    out = Path(args.out) / args.dataset
    manifest = prepare_dataset(
        args.dataset, param, out, Path(args.cache), sha256=settings.get("sha256"), train_size=settings.get("train_size")
    )
    seconds = time.perf_counter() - started
    source = resolve_source(args.dataset, param)
    counts = ", ".join(f"{split} {info['count']}" for split, info in manifest["splits"].items())
    print(f"{args.dataset}: {counts} images from {source} in {seconds:.1f} s")
    if track:
        print(f"MLflow: experiment 'download', run {log_download(out, source, seconds)}")


if __name__ == "__main__":
    run_command(main)
