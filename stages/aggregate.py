"""DVC stage `aggregate`: every run of the grid, summarised over seeds beside the papers' published figures.

Writes under --out: summary.csv (one row per study, dataset, model and method), report.md (the papers' tables with
ours, and what matches), metrics.json (headline figures, `dvc metrics show`), figures/*.png, curves/*.csv (per-epoch
means, `dvc plots show`); logs them to the MLflow experiment `aggregate`.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain import run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--runs", default="runs", help="runs root (default: %(default)s)")
    parser.add_argument(
        "--published", default="data/published_results.csv", help="the papers' figures (default: %(default)s)"
    )
    parser.add_argument("--out", default="results", help="output folder (default: %(default)s)")
    args = parser.parse_args()

    from cheaptrain.config import load_params
    from cheaptrain.report import write_results

    summary, run_id = write_results(load_params(args.params), Path(args.runs), Path(args.published), Path(args.out))
    print(f"{len(summary)} configurations -> {args.out}/ (summary.csv, report.md, metrics.json, figures, curves)")
    print(f"MLflow: experiment 'aggregate', run {run_id}")


if __name__ == "__main__":
    run_main(main)
