"""DVC stage `check`: the regression gate over results/summary.csv.

Reads the thresholds of params `check` (per method: largest accuracy drop against the baseline, smallest time saving,
...) and, when `check.reference` names one, the reference summary (the last accepted results). Exits 1 with a table of
every violation, 0 with a table of what passed; 2 for bad input. `--accept` copies the summary to the reference path
instead: the current results become the accepted ones (commit the file).

Each evaluation is one MLflow run in the experiment `check`: every check's value, limit and verdict, and the outcome.
A run of its own, not a part of the aggregate run: the gate is re-run alone (other thresholds, another reference)
on the same results, and each verdict then stays beside the thresholds it was reached with. `--no-mlflow` (or a
machine without MLflow) evaluates and writes the outcome all the same, and logs nothing.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's code, also in DVC's temp copies

from cheaptrain import UserError, atomic_write
from cheaptrain.cli import run_command


def write(path: Path, data: bytes) -> None:
    """atomic_write, with a UserError naming the path where it cannot be written (a file where a folder must be)."""
    try:
        atomic_write(path, data)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml", help="params file (default: %(default)s)")
    parser.add_argument("--summary", default="results/summary.csv", help="the summary (default: %(default)s)")
    parser.add_argument("--reference", help="reference summary (default: params check.reference)")
    parser.add_argument("--out", default="results/check.json", help="the gate's outcome (default: %(default)s)")
    parser.add_argument("--accept", action="store_true", help="copy the summary to the reference path and exit")
    parser.add_argument("--no-mlflow", action="store_true", help="evaluate the gate without logging it to MLflow")
    args = parser.parse_args()

    from cheaptrain.aggregate import read_summary
    from cheaptrain.check import evaluate, load_gate, load_reference, render
    from cheaptrain.config import load_params
    from cheaptrain.tracking import ensure_experiment, log_check, mlflow_installed

    track = not args.no_mlflow and not args.accept
    track = track and mlflow_installed("the gate is not tracked (its outcome is still written)")
    gate = load_gate(load_params(args.params))
    if track:
        ensure_experiment("check")  # an unusable store fails here, before the gate
    summary = read_summary(Path(args.summary))  # validates it before anything is accepted or checked
    if args.accept:
        target = args.reference or gate.reference
        if target is None:
            raise UserError("no reference path: set params check.reference or pass --reference PATH")
        write(Path(target), Path(args.summary).read_bytes())
        print(f"accepted {args.summary} ({len(summary)} configurations) as the reference {target}: commit it")
        return

    checks = evaluate(summary, gate, load_reference(gate, args.reference))
    failed = sum(c.status == "FAIL" for c in checks)
    reference = args.reference or gate.reference
    source = f"{args.summary} against params `check` of {args.params}" + (f" and {reference}" if reference else "")
    print(render(checks, source), end="")
    outcome = {
        "passed": not failed,
        "checks": sum(c.status != "skip" for c in checks),
        "violations": failed,
        "not_checked": sum(c.status == "skip" for c in checks),
    }
    write(Path(args.out), (json.dumps(outcome, indent=2) + "\n").encode())
    if track:
        inputs = {"params": args.params, "summary": args.summary, "reference": reference}
        print(f"MLflow: experiment 'check', run {log_check([dataclasses.asdict(c) for c in checks], outcome, inputs)}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    run_command(main)
