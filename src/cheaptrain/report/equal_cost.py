"""The methods at equal cost: each configuration by its compute saved, grouped into budgets, the best at each budget
named and its lead over each of the others weighed seed by seed (or by their 95% intervals), then the others' leads
over one another."""

from __future__ import annotations

from itertools import combinations
from typing import Any, NamedTuple

from cheaptrain.aggregate import BASELINE, Run, collapsed, config_key, describe, half_width, row_key
from cheaptrain.report.cells import (
    Column,
    Table,
    missing_figure,
    paired_note,
    paper,
    saving_cell,
    seed_count,
    seeds_text,
    stat,
)

COST_NOTE = (
    "Each method at each of its budgets (its named configurations, `methods.<name>.method`), paired by seed with "
    "the baseline. A budget holds the configurations whose compute saved lies within {within:g} points of the least "
    "in it (params `aggregate.agree_within.cost_points`): they cost the same. Δ: accuracy minus the baseline's, in "
    "points, ± the 95% t-interval over seeds (3+ seeds; (sd) with 2). Compute saved: 100·(1 − training FLOPs / the "
    "baseline's), exact; time saved: {time}, the robust estimate with its 95% interval (`src/cheaptrain/timing.py`). "
    "The best at a budget has the highest Δ. Its lead over each other configuration there, the runner-up first, is "
    "weighed seed by seed where the two share 3 or more seeds (the 95% t-interval of their accuracy differences, and "
    "the seeds it is ahead on, which show whether a seed or two carry the mean), else by whether their 95% intervals "
    "overlap; so is each other configuration's lead over those below it. A 95% interval holds for one look, and a "
    "comparison is read again as seeds are added: a lead is a finding where its interval excludes 0 widened for one "
    "look per seed count from 3 (Bonferroni; at 3 seeds the 95% interval itself); `python benchmarks/looks.py` prints "
    "each look, and widens for the looks a plan took. The paper's figures stand beside the configuration of the "
    "paper's own method and setting (its name, e.g. `dfp`); the papers publish time saved, not compute."
)


def implementation_of(runs: list[Run]) -> dict[tuple[str, ...], str]:
    """Per configuration (config_key), the registered method its runs trained: a named configuration's run.json
    holds it as config.method_args `method` (as cheaptrain.methods.implementation reads it, without torch)."""
    return {config_key(r): (r.config.get("method_args") or {}).get("method", r.method) for r in runs}


def panel(row: dict[str, Any]) -> tuple[str, ...]:
    """The rows one comparison holds: one study, dataset, model and recipe."""
    return row["study"], row["dataset"], row["model"], row.get("recipe", "")


def cost_points(summary: list[dict[str, Any]], implementations: dict[tuple[str, ...], str]) -> list[dict[str, Any]]:
    """The method rows with a compute saving and an accuracy Δ, each with its `implementation`; by panel, then by
    compute saved."""
    points = [
        row | {"implementation": implementations.get(row_key(row), row["method"])}
        for row in summary
        if row["method"] != BASELINE and None not in (row.get("compute_saving_pct_mean"), row.get("acc_delta_mean"))
    ]
    return sorted(points, key=lambda r: (panel(r), r["compute_saving_pct_mean"], r["method"]))


def budgets(points: list[dict[str, Any]], within: float) -> list[list[dict[str, Any]]]:
    """cost_points grouped by equal cost: within a panel, each point joins the last budget while its compute saved is
    within `within` points of that budget's least."""
    groups: list[list[dict[str, Any]]] = []
    for point in points:
        last = groups[-1][0] if groups else None
        saved = point["compute_saving_pct_mean"]
        if last and panel(last) == panel(point) and saved - last["compute_saving_pct_mean"] <= within:
            groups[-1].append(point)
        else:
            groups.append([point])
    return [sorted(g, key=lambda r: -r["acc_delta_mean"]) for g in groups]  # best first


def budget_label(group: list[dict[str, Any]]) -> str:
    low, high = (f"{f(r['compute_saving_pct_mean'] for r in group):.1f}" for f in (min, max))
    return f"{low}%" if low == high else f"{low}–{high}%"


def acc_interval(row: dict[str, Any]) -> tuple[float, float] | None:
    """The 95% t-interval of the accuracy Δ over seeds; None under 3 seeds."""
    mean, ci = row["acc_delta_mean"], row.get("acc_delta_ci95")
    return None if ci is None else (mean - ci, mean + ci)


def point_text(row: dict[str, Any]) -> str:
    """'dfp_p50 (dfp): Δ -0.40 [-0.60, -0.20] points at 21.3% compute saved', and '(2 of 3 seeds)' after the Δ
    where some of its seeds' baselines are still to run (paired_note)."""
    name = row["method"] if row["method"] == row["implementation"] else f"{row['method']} ({row['implementation']})"
    found = acc_interval(row)
    shown = f"{row['acc_delta_mean']:+.2f}" + (f" [{found[0]:+.2f}, {found[1]:+.2f}]" if found else "")
    shown += f" points{paired_note(row, 'acc_delta')}"
    if failed := seeds_text(row.get("collapsed_seeds")):
        shown += f" ({failed} ended at chance, left out)"
    return f"{name}: Δ {shown} at {row['compute_saving_pct_mean']:.1f}% compute saved"


def seed_accuracies(summary: list[dict[str, Any]], runs: list[Run]) -> dict[tuple[str, ...], dict[int, float]]:
    """Per configuration (config_key), each seed's accuracy by its row's measure: two configurations side by side.
    A run that ended at chance (aggregate.collapsed) has none: the summary leaves it out."""
    measures = {row_key(row): row["acc_measure"] for row in summary}
    accuracies: dict[tuple[str, ...], dict[int, float]] = {}
    for run in runs:
        if (key := config_key(run)) in measures and not collapsed(run):
            accuracies.setdefault(key, {})[run.seed] = run.metrics[measures[key]]
    return accuracies


def looks_at(seeds: int) -> int:
    """The times a comparison of `seeds` seeds in common may have been read: once per seed count from 3."""
    return seeds - 2


class Paired(NamedTuple):
    """Two configurations' accuracies compared seed by seed (paired_difference).

    Seeds come in over time (the ledger grows a seed or two at a time) and a comparison is read again at each count,
    so its 95% interval holds for one look only. `widened` holds for every count from 3 to `seeds` at once, one look
    each (Bonferroni: a 1 - 0.05 / looks t-interval, as `benchmarks/looks.py` widens it for the looks a plan took):
    a lead is a finding only where that interval excludes 0 too."""

    seeds: int  # seeds in common
    mean: float  # the first's accuracy minus the second's, averaged over them
    ci: float  # the 95% t-interval's half-width
    ahead: int  # seeds on which the first is ahead
    level: int  # seeds on which the two are equal
    widened: float  # the half-width widened for `looks`

    @classmethod
    def of(cls, differences: list[float]) -> Paired:
        """The differences' mean, its 95% t-interval (aggregate.describe), the seeds ahead and level, and the interval
        widened for its looks (3+ values)."""
        mean, _, ci = describe(differences)
        n = len(differences)
        widened = half_width(differences, looks=looks_at(n))
        assert ci is not None and widened is not None  # 3 or more values
        ahead, level = sum(d > 0 for d in differences), sum(d == 0 for d in differences)
        return cls(n, mean, ci, ahead, level, widened)

    @property
    def looks(self) -> int:
        """The times it may have been read (looks_at)."""
        return looks_at(self.seeds)

    def interval_text(self) -> str:
        """'+0.60 [+0.10, +1.09]': the mean difference and its 95% t-interval."""
        return f"{self.mean:+.2f} [{self.mean - self.ci:+.2f}, {self.mean + self.ci:+.2f}]"

    def excludes_zero(self, widened: bool = False) -> bool:
        half = self.widened if widened else self.ci
        return self.mean - half > 0 or self.mean + half < 0

    def looks_text(self) -> str:
        """'widened for its 3 looks (one per seed count from 3), [-1.00, +6.00]'."""
        low, high = self.mean - self.widened, self.mean + self.widened
        return f"widened for its {self.looks} looks (one per seed count from 3), [{low:+.2f}, {high:+.2f}]"

    def seeds_text(self) -> str:
        """'ahead on 18 of 20 seeds', and ', level on 1' where some are equal: how the mean came about, which an
        outlying seed can move."""
        return f"ahead on {self.ahead} of {self.seeds} seeds" + (f", level on {self.level}" if self.level else "")


def paired_difference(
    first: dict[str, Any], second: dict[str, Any], accuracies: dict[tuple[str, ...], dict[int, float]]
) -> Paired | None:
    """`first`'s accuracy minus `second`'s seed by seed (seed_accuracies), on their seeds in common; None under 3
    seeds in common. Both are paired with the baseline of the same seed, so its noise cancels."""
    ours, theirs = accuracies.get(row_key(first), {}), accuracies.get(row_key(second), {})
    differences = [ours[s] - theirs[s] for s in sorted(ours.keys() & theirs.keys())]
    return Paired.of(differences) if len(differences) >= 3 else None


def paired_lead(
    first: dict[str, Any], second: dict[str, Any], accuracies: dict[tuple[str, ...], dict[int, float]]
) -> str | None:
    """The lead of `first` over `second` seed by seed (paired_difference) with its 95% t-interval and what it says;
    None under 3 seeds in common."""
    if (paired := paired_difference(first, second, accuracies)) is None:
        return None
    if not paired.excludes_zero():
        said = "it includes 0: not a finding"
    elif paired.looks == 1:
        said = "it excludes 0: a finding"
    elif paired.excludes_zero(widened=True):
        said = f"it excludes 0, as it does {paired.looks_text()}: a finding"
    else:
        said = f"it excludes 0 at one look but not {paired.looks_text()}: not a finding"
    if paired.excludes_zero() and paired.mean < 0:  # behind seed by seed: its higher Δ is over seeds of its own
        said = f"{second['method']} leads on the seeds they share; {said}"
    return f"seed by seed ({paired.seeds_text()}) the lead is {paired.interval_text()} points; {said}"


def lead_over(
    first: dict[str, Any],
    other: dict[str, Any],
    accuracies: dict[tuple[str, ...], dict[int, float]],
    described: bool = True,
) -> str:
    """How far `first` leads `other`, `other`'s point where `described` (else its name), and whether the lead is
    larger than its 95% interval: seed by seed where `accuracies` (seed_accuracies) pairs them, else whether their
    intervals overlap."""
    shown = point_text(other) if described else other["method"]
    lead = f"{first['acc_delta_mean'] - other['acc_delta_mean']:.2f} points ahead of {shown}"
    ours, theirs = acc_interval(first), acc_interval(other)
    if paired := paired_lead(first, other, accuracies):
        verdict = paired
    elif ours is None or theirs is None:
        verdict = "under 3 seeds: no 95% interval to weigh the lead against"
    elif ours[0] > theirs[1]:
        verdict = "the lead is larger than the 95% intervals (they do not overlap)"
    else:
        verdict = "the lead is within the 95% intervals (they overlap): not a finding"
    return f"{lead}; {verdict}"


def budget_verdict(
    group: list[dict[str, Any]], accuracies: dict[tuple[str, ...], dict[int, float]] | None = None
) -> str:
    """Which configuration of a budget (best first) keeps the most accuracy, and its lead over the runner-up, then
    over each further configuration there, a sentence each (lead_over); then each other configuration's lead over
    those below it, as a researcher comparing two of them asks."""
    first, accuracies = group[0], accuracies or {}
    where = f"{first['study'].upper()} {first['dataset']}/{first['model']}, compute saved {budget_label(group)}"
    if len(group) == 1:
        return f"{where}: {point_text(first)}, alone at this cost: nothing to compare with."
    runner_up, *others = (lead_over(first, other, accuracies) for other in group[1:])
    return (
        f"{where}: best {point_text(first)}; {runner_up}."
        + "".join(f" It is also {lead}." for lead in others)
        + "".join(
            f" Of the others, {upper['method']} is {lead_over(upper, lower, accuracies, described=False)}."
            for upper, lower in combinations(group[1:], 2)
        )
    )


def unplaced_text(summary: list[dict[str, Any]], points: list[dict[str, Any]]) -> str:
    """The method configurations at no budget (not among cost_points), each with why, as missing_figure says it:
    a method trained before its baseline would otherwise leave the table without a word."""
    placed = {row_key(r) for r in points}
    said = [
        f"{r['study'].upper()} {r['dataset']}/{r['model']} {r['method']} ({missing_figure(r, 'compute_saving_pct')})"
        for r in summary
        if r["method"] != BASELINE and row_key(r) not in placed
    ]
    return f"At no budget: {'; '.join(said)}." if said else ""


class TimeSaved(NamedTuple):
    """How a time figure of the cost table and figure is shown."""

    header: str  # the table's column
    axis: str  # the figure's x axis
    against: str  # what it is measured against, for the table's note


TIME_SAVED = {  # the cost table's time figure: against the baseline's run, or against the run's own full epochs
    "time_saving_pct": TimeSaved("time saved % [95%]", "time saved (%, 95% interval)", "against the baseline's run"),
    "own_time_saving_pct": TimeSaved(
        "own time saved % [95%]",
        "time saved vs own full epochs (%, 95% interval)",
        "against the run's own full epochs (it needs no baseline trained on the same machine)",
    ),
}


def cost_columns(time_figure: str) -> list[Column]:
    """The columns of the cost table, its time saving `time_figure` (TIME_SAVED)."""
    return [
        ("dataset", lambda r: r["dataset"]),
        ("model", lambda r: r["model"]),
        ("budget: compute saved", lambda r: r["budget"]),
        ("method", lambda r: r["method"]),
        ("implements", lambda r: r["implementation"]),
        ("seeds", seed_count),
        ("compute saved %", lambda r: stat(r, "compute_saving_pct", 1)),
        (TIME_SAVED[time_figure].header, lambda r: saving_cell(r, time_figure)),
        ("Δ vs baseline", lambda r: stat(r, "acc_delta", sign=True)),
        ("paper time saved %", lambda r: paper(r, "paper_time_saving_pct")),
        ("paper Δ", lambda r: paper(r, "paper_acc_delta", sign=True)),
    ]


def cost_table(
    summary: list[dict[str, Any]],
    implementations: dict[tuple[str, ...], str],
    within: float,
    time_figure: str = "time_saving_pct",
    accuracies: dict[tuple[str, ...], dict[int, float]] | None = None,
) -> Table:
    """The table "accuracy against cost": every method configuration by budget, best first, and in its note one
    verdict per budget (budget_verdict, seed by seed with `accuracies`); its time saving is `time_figure`
    (TIME_SAVED)."""
    points = cost_points(summary, implementations)
    groups = budgets(points, within)
    columns = cost_columns(time_figure)
    rows = [[f(r | {"budget": budget_label(g)}) for _, f in columns] for g in groups for r in g]
    note = COST_NOTE.format(within=within, time=TIME_SAVED[time_figure].against)
    lines = [f"- {budget_verdict(g, accuracies)}" for g in groups]
    if unplaced := unplaced_text(summary, points):
        lines.append(f"- {unplaced}")
    if not groups:
        note = f"No method with a compute saving and a paired baseline here yet. {note}"
    if lines:
        note += "\n\n" + "\n".join(lines)
    return Table("accuracy_vs_cost", "Accuracy against cost", note, [h for h, _ in columns], rows)
