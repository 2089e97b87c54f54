"""DVC stage `aggregate`: read every run of the grid and write results/summary.csv and results/report.md."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain import run_main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--runs", default="runs", help="runs root (default: %(default)s)")
    parser.add_argument("--out", default="results", help="output folder (default: %(default)s)")
    args = parser.parse_args()

    from cheaptrain.aggregate import collect, report_markdown, summarize, write_csv
    from cheaptrain.config import load_params

    summary = summarize(collect(load_params(args.params), Path(args.runs)))
    out = Path(args.out)
    write_csv(out / "summary.csv", summary)
    (out / "report.md").write_text(report_markdown(summary))
    print(f"{len(summary)} configurations -> {out}/summary.csv, {out}/report.md")


if __name__ == "__main__":
    run_main(main)
