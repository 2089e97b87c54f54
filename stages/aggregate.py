"""DVC stage `aggregate`: every run of the grid, summarised over seeds beside the papers' published figures.

Writes under --out: summary.csv (one row per study, dataset, model and method), report.md (the papers' tables with
ours, and what matches), metrics.json (headline figures, `dvc metrics show`), figures/*.png, curves/*.csv (per-epoch
means, `dvc plots show`); logs them to the MLflow experiment `aggregate`. With --ledger-only it reads the results
ledger alone (no run of the grid needed: a fresh clone's report of the papers' scale) into results/ledger-only/.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain.cli import run_command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--runs", default="runs", help="runs root (default: %(default)s)")
    parser.add_argument(
        "--published", default="data/published_results.csv", help="the papers' figures (default: %(default)s)"
    )
    parser.add_argument("--out", help="output folder (default: results, with --ledger-only results/ledger-only)")
    parser.add_argument(
        "--ledger-only",
        action="store_true",
        help="the results ledger alone, as if the grid were empty: its report in seconds, with no run trained",
    )
    args = parser.parse_args()
    out = Path(args.out or ("results/ledger-only" if args.ledger_only else "results"))

    from cheaptrain.config import load_params
    from cheaptrain.report.stage import write_results

    params = load_params(args.params)
    if args.ledger_only:
        params["grid"] = {}
    summary, run_id = write_results(params, Path(args.runs), Path(args.published), out)
    print(f"{len(summary)} configurations -> {out}/ (summary.csv, report.md, metrics.json, figures, curves)")
    print(f"MLflow: experiment 'aggregate', run {run_id}")


if __name__ == "__main__":
    run_command(main)
