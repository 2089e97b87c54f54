"""The regression gate: results/summary.csv against the thresholds in params `check`, and against a reference summary.

Thresholds are per method. Accuracy is each study's measure (the summary's `acc_measure`: DFP best-3, WUS final), and
every comparison with the baseline is paired by seed and averaged over seeds (the summary's `*_mean` columns). A
threshold for a method with no runs is not a violation, nor is a method without thresholds: both are listed as not
checked. A null threshold switches that check off for that method. A run that ended at chance accuracy fails the gate
whatever the thresholds: the summary leaves it out of every figure (`cheaptrain.aggregate.collapsed`), so no
threshold would see it.

Compute saved (training FLOPs) is the same on any machine, so its gate cannot flake. The wall-clock gates use the
robust training time (`cheaptrain.timing`) and are evaluated only where params `check.wall_clock` is `gate`, which a
setting claims only on a quiet machine; under `report` (the default) they are listed as not checked, and the figures
stay in report.md.

The gate judges the grid's configurations. Those of the results ledger alone (summary `source` ledger: runs at a
paper's setting, trained elsewhere and kept in the repository) are listed as not checked: report.md compares them
with the papers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cheaptrain import UserError, is_number
from cheaptrain.aggregate import BASELINE, CHANCE_MARGIN, KEY, read_summary
from cheaptrain.report.cells import missing_figure

GATES = {  # params key: (summary column, "max" for a largest drop or "min" for a smallest value, what, unit)
    "max_acc_drop": ("acc_delta_mean", "max", "accuracy drop vs baseline", "pts"),
    "min_acc": ("acc_mean", "min", "accuracy", "%"),
    "min_compute_saving": ("compute_saving_pct_mean", "min", "compute saved vs baseline", "%"),
    "min_time_saving": ("time_saving_pct_mean", "min", "time saved vs baseline", "%"),
    "min_own_time_saving": ("own_time_saving_pct_mean", "min", "time saved vs its own full epochs", "%"),
    "min_sample_saving": ("sample_saving_pct_mean", "min", "sample-passes saved vs baseline", "%"),
    "min_params_reduction": ("updated_params_reduction_pct_mean", "min", "updated-parameter reduction", "%"),
}
WALL_CLOCK_GATES = ("min_time_saving", "min_own_time_saving")
WALL_CLOCK = ("report", "gate")  # check.wall_clock: the first is the default
NOT_GATED = "not checked (wall-clock reported, not gated: check.wall_clock is report)"
OPTIONS = ("reference", "reference_margin", "wall_clock")
BASELINE_GATES = ("min_acc",)  # the baseline is what the others are compared with: only its own accuracy applies
COLLAPSED = "final accuracy at chance: the network stopped learning (left out of the summary's figures)"
LEDGER_ONLY = "from the results ledger alone, not the grid (not gated; report.md compares it with the papers)"


@dataclass(frozen=True)
class Gate:
    thresholds: dict[str, dict[str, float | None]]  # params key -> method -> limit (None: not checked)
    reference: str | None  # path of the accepted summary
    reference_margin: float  # points the accuracy delta may lose against the reference
    wall_clock: str  # report | gate: whether WALL_CLOCK_GATES are evaluated


@dataclass(frozen=True)
class Check:
    status: str  # pass | FAIL | skip
    config: str  # study dataset/model/method, or the method alone
    check: str
    value: str = ""
    limit: str = ""


def load_gate(params: dict[str, Any]) -> Gate:
    """Params `check`, validated: a UserError lists every unknown key, every bad value and every method name that is
    neither registered nor a section of params `methods` (a misspelt one would leave its method ungated, silently)."""
    from cheaptrain.methods import METHODS  # late: methods import torch

    section = params.get("check") or {}
    known = {*METHODS, *(params.get("methods") or {})}  # the baseline is a registered method
    if not isinstance(section, dict):
        raise UserError("params `check` must be a mapping of thresholds (see README: The gate)")
    accepted = (*GATES, *OPTIONS)
    problems = [f"check.{k}: unknown key (accepted: {', '.join(accepted)})" for k in section if k not in accepted]
    thresholds: dict[str, dict[str, float | None]] = {}
    for key in GATES:
        per_method = section.get(key) or {}
        if not isinstance(per_method, dict):
            problems.append(f"check.{key}: must map method names to numbers, e.g. {{dfp: 1.0}}")
            continue
        thresholds[key] = {}
        for method, limit in per_method.items():
            if method not in known:
                problems.append(f"check.{key}.{method}: no method of that name (accepted: {', '.join(sorted(known))})")
            elif limit is not None and not is_number(limit):
                problems.append(f"check.{key}.{method}: {limit!r} is not a finite number (or null: not checked)")
            elif method == BASELINE and key not in BASELINE_GATES and limit is not None:
                problems.append(f"check.{key}.{method}: the baseline is the reference; only {BASELINE_GATES} apply")
            else:
                thresholds[key][method] = None if limit is None else float(limit)
    reference = section.get("reference")
    if reference is not None and not (isinstance(reference, str) and reference):
        problems.append(f"check.reference: {reference!r} is not a path (or null: no reference)")
    margin = section.get("reference_margin", 1.0)
    if not (is_number(margin) and margin >= 0):
        problems.append(f"check.reference_margin: {margin!r} is not accepted; accepted: a number >= 0 (points)")
    wall_clock = section.get("wall_clock", WALL_CLOCK[0])
    if wall_clock not in WALL_CLOCK:
        problems.append(f"check.wall_clock: {wall_clock!r} is not accepted; accepted: {' | '.join(WALL_CLOCK)}")
    if problems:
        raise UserError("invalid params `check`:\n" + "\n".join(f"  - {p}" for p in problems))
    return Gate(thresholds, reference, float(margin), wall_clock)


def _where(row: dict[str, Any]) -> str:
    return f"{row['study']} {row['dataset']}/{row['model']}/{row['method']}"


def evaluate(summary: list[dict[str, Any]], gate: Gate, reference: list[dict[str, Any]] | None = None) -> list[Check]:
    """Every check of the gate, in order: runs that ended at chance, thresholds per method, the reference comparison,
    then the ledger's own configurations as not checked (module docstring)."""
    ledger_only = [Check("skip", _where(r), LEDGER_ONLY) for r in summary if r.get("source") == "ledger"]
    summary = [r for r in summary if r.get("source") != "ledger"]
    checks = [
        Check("FAIL", _where(r), COLLAPSED, f"seeds {r['collapsed_seeds']}", f"> chance + {CHANCE_MARGIN:g} pts")
        for r in summary
        if r.get("collapsed_seeds")
    ]
    methods = list(dict.fromkeys(r["method"] for r in summary))
    for key, (column, sense, what, unit) in GATES.items():
        for method, limit in gate.thresholds[key].items():
            rows = [r for r in summary if r["method"] == method]
            if limit is None:
                checks.append(Check("skip", method, f"{key}: null (switched off)"))
                continue
            if key in WALL_CLOCK_GATES and gate.wall_clock != "gate":
                checks.append(Check("skip", method, f"{key}: {NOT_GATED}"))
                continue
            if not rows:
                checks.append(Check("skip", method, f"{key}: no runs in the summary (not a violation)"))
                continue
            for row in rows:
                value = row.get(column)
                bound = f"{'<=' if sense == 'max' else '>='} {limit:.2f} {unit}"
                if value is None or math.isnan(value):
                    why = missing_figure(row, column.removesuffix("_mean"))  # as the report says it
                    checks.append(Check("FAIL", _where(row), f"{what}: {why}", "—", bound))
                    continue
                shown = -value if sense == "max" else value  # a drop is the negative delta
                ok = shown <= limit if sense == "max" else shown >= limit
                checks.append(Check("pass" if ok else "FAIL", _where(row), what, f"{shown:.2f} {unit}", bound))
    gated = {m for per_method in gate.thresholds.values() for m in per_method}
    checks += [Check("skip", m, "no threshold in params `check` (not gated)") for m in methods if m not in gated]
    if reference is not None:
        grid_reference = [r for r in reference if r.get("source") != "ledger"]
        checks += compare_reference(summary, grid_reference, gate.reference_margin)
    return checks + ledger_only


def compare_reference(summary: list[dict[str, Any]], reference: list[dict[str, Any]], margin: float) -> list[Check]:
    """Against the accepted summary: the accuracy delta of every method, and the accuracy of every baseline, may lose
    at most `margin` points. Rows of another setting (recipe, epochs, accuracy measure) are not compared."""
    accepted = {tuple(r[k] for k in KEY): r for r in reference}
    checks = []
    for row in summary:
        column = "acc_mean" if row["method"] == BASELINE else "acc_delta_mean"
        what = "accuracy vs the reference's" if row["method"] == BASELINE else "accuracy Δ vs the reference's"
        ref = accepted.get(tuple(row[k] for k in KEY))
        if row.get(column) is None:
            continue  # no baseline to compare with: the thresholds above say so
        if ref is None or ref.get(column) is None:
            checks.append(Check("skip", _where(row), f"{what}: not in the reference (accept it with --accept)"))
        elif differs := _setting_changes(ref, row):
            checks.append(Check("skip", _where(row), f"{what}: the reference has another setting ({differs})"))
        else:
            lost = ref[column] - row[column]
            sign = "" if column == "acc_mean" else "+"
            value = f"{row[column]:{sign}.2f} (ref {ref[column]:{sign}.2f})"
            checks.append(
                Check("pass" if lost <= margin else "FAIL", _where(row), what, value, f">= ref - {margin:.2f} pts")
            )
    return checks


def _setting_changes(ref: dict[str, Any], row: dict[str, Any]) -> str:
    """What differs between the settings of two summary rows ('' when they are comparable)."""
    keys = ("recipe", "epochs", "acc_measure")
    return ", ".join(f"{k} {_show(ref.get(k))} vs {_show(row.get(k))}" for k in keys if ref.get(k) != row.get(k))


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_reference(gate: Gate, override: str | None = None) -> list[dict[str, Any]] | None:
    """The reference summary of `override` (--reference), else of params check.reference; None where neither names
    one."""
    path = override or gate.reference
    if path is None:
        return None
    if not Path(path).is_file():
        fix = (
            f"accept the current results into it with `python stages/check.py --accept --reference {path}`, or pass "
            "another path"
            if override
            else "accept the current results with `python stages/check.py --accept`, or set check.reference to null"
        )
        where = "--reference" if override else "params check.reference"
        raise UserError(f"the reference summary {path} ({where}) does not exist: {fix}")
    return read_summary(Path(path))


def table(checks: list[Check]) -> str:
    """Checks as an aligned text table."""
    header = Check("status", "configuration", "check", "value", "limit")
    rows = [header, *checks]
    widths = [max(len(getattr(c, f)) for c in rows) for f in ("status", "config", "check", "value", "limit")]
    lines = []
    for i, c in enumerate(rows):
        cells = (c.status, c.config, c.check, c.value, c.limit)
        lines.append("  ".join(v.ljust(w) for v, w in zip(cells, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render(checks: list[Check], source: str) -> str:
    """The gate's report: every violation (or, when none, everything that passed), then what was not checked."""
    failed = [c for c in checks if c.status == "FAIL"]
    passed = [c for c in checks if c.status == "pass"]
    skipped = [c for c in checks if c.status == "skip"]
    lines = [f"Regression gate: {source}"]
    if failed:
        lines += ["", f"FAILED: {len(failed)} violation(s) of {len(failed) + len(passed)} checks:", "", table(failed)]
        lines += ["", f"{len(passed)} other check(s) passed."]
    else:
        lines += ["", f"PASSED: all {len(passed)} checks:", "", table(passed) if passed else "(nothing to check)"]
    if skipped:  # grouped by reason: one line each
        reasons = {c.check: [d.config for d in skipped if d.check == c.check] for c in skipped}
        lines += ["", "Not checked:"] + [f"  - {why}: {', '.join(where)}" for why, where in reasons.items()]
    return "\n".join(lines) + "\n"
