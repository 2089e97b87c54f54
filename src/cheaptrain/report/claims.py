"""The section "Reproduced at the papers' scale": every figure the papers publish about a method against our runs
at the paper's setting (grid or results ledger), with a verdict, a coverage line, the methods at equal cost there,
WUS on networks the paper lacks, and the figures of those runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from matplotlib.figure import Figure

from cheaptrain.aggregate import BASELINE, CHANCE_MARGIN, KEY, PAPER_MEASURE, Run, collapsed, config_key, row_key
from cheaptrain.ledger import divergence
from cheaptrain.papers import network_deviations
from cheaptrain.papers import paper_setting as paper_setting_of
from cheaptrain.report.cells import (
    CHEAP_EPOCH_NOTE,
    MEASURE_LABEL,
    MEASURE_SHORT,
    NOT_IN_PAPER,
    Table,
    cheap_epoch_cell,
    fmt,
    md_table,
    missing_figure,
    paired_note,
    paired_seeds,
    seed_count,
    stat,
)
from cheaptrain.report.equal_cost import cost_table, implementation_of, seed_accuracies
from cheaptrain.report.figures import (
    LEDGER_FIGURES,
    claims_figure,
    cost_figure,
    curve_figure,
    phases_figure,
    pruned_figure,
)
from cheaptrain.report.tables import time_kind

CLAIMS = {  # a published metric of a method: (our statistic, what it is, digits)
    "accuracy_best3": ("acc_delta", "accuracy Δ (points)", 2),  # DFP Table 2, against the paper's own baseline
    "accuracy": ("acc_delta", "accuracy Δ (points)", 2),  # WUS Table 2
    # DFP Table 1, WUS Table 1: ours against the run's own full epochs, which needs no baseline trained on the same
    # machine (several runs at once on a GPU, another CPU); the tables above show the paired saving too
    "time_saving": ("own_time_saving_pct", "time saved % (vs its own full epochs)", 1),
    "updated_params_reduction": ("updated_params_reduction_pct", "updated-parameter reduction %", 1),  # WUS Table 3
}
ACCURACIES = [metric for metric, (figure, _, _) in CLAIMS.items() if figure == "acc_delta"]  # the papers' Tables 2
WITHIN, OUTSIDE, NOISE, NOT_RUN = "within tolerance", "outside tolerance", "within noise", "not yet run"
CLAIMS_FIGURE = "ledger_claims.png"
ACCURACY_FIGURE = "ledger_accuracy.png"
OURS_COLOR = "tab:blue"
VERDICT_COLORS = {WITHIN: "tab:green", OUTSIDE: "tab:red", NOISE: "tab:orange"}
UNAVAILABLE = {  # datasets these machines cannot obtain: (verdict, why)
    "cifar100": (
        "CIFAR-100 unavailable",
        "CIFAR-100 cannot be obtained on these machines: they reach no download site, and `../shared/datasets/` "
        "holds CIFAR-10 only",
    ),
}
JPEG_NOTE = (
    "CIFAR-10 here is the shared archive's JPEG re-encoding of the official images (`../shared/datasets/README.md`): "
    "accuracies on it run a little below those on the official data, so an accuracy a little below the paper's is "
    "expected; a Δ compares two runs on the same data."
)


@dataclass(frozen=True)
class Claim:
    """One figure a paper publishes about a method: its accuracy Δ against the paper's baseline, its time saved, or
    (WUS) its reduction of updated parameters."""

    study: str
    dataset: str
    model: str
    method: str
    figure: str  # the summary's statistic: acc_delta | time_saving_pct | updated_params_reduction_pct
    what: str
    digits: int
    published: float


def published_claims(published: dict[tuple, float]) -> list[Claim]:
    """Every claim of the papers' tables about a method, in the order of the tables' networks."""
    order: dict[tuple, int] = {}
    for key in published:
        order.setdefault(key[:3], len(order))
    figures = list(dict.fromkeys(figure for figure, _, _ in CLAIMS.values()))
    claims = []
    for (study, dataset, model, method, metric), value in published.items():
        if method == BASELINE or metric not in CLAIMS:
            continue
        figure, what, digits = CLAIMS[metric]
        if figure == "acc_delta":
            baseline = published.get((study, dataset, model, BASELINE, metric))
            if baseline is None:
                continue
            value -= baseline
        claims.append(Claim(study, dataset, model, method, figure, what, digits, value))
    return sorted(claims, key=lambda c: (order[c.study, c.dataset, c.model], c.method, figures.index(c.figure)))


def paper_setting(run: Run) -> tuple[bool, list[str]]:
    """Whether a run counts as trained at its paper's setting (papers.paper_setting), with its model arguments and
    where its network differs from the paper's named as deviations."""
    counted, notes = paper_setting_of(run.study, run.config.get("recipe") or {}, run.model)
    model_args = run.config.get("model_args") or {}
    if counted and model_args:
        notes.append(f"model arguments {model_args}")
    if counted:
        notes += network_deviations(run.study, run.model, model_args)
    return counted, notes


def first_runs(runs: list[Run]) -> dict[tuple[str, ...], Run]:
    """One run per configuration (its runs share the recipe), by configuration key."""
    first: dict[tuple[str, ...], Run] = {}
    for run in runs:
        first.setdefault(config_key(run), run)
    return first


def paper_scale_rows(summary: list[dict[str, Any]], runs: list[Run]) -> dict[tuple, tuple[dict[str, Any], list[str]]]:
    """Per (study, dataset, model, method): the summary row at the paper's setting and its deviations; of several,
    the one with the fewest deviations, then the most seeds."""
    first = first_runs(runs)
    chosen: dict[tuple, tuple[dict[str, Any], list[str]]] = {}
    for row in summary:
        counted, notes = paper_setting(first[row_key(row)])
        if not counted:
            continue
        theirs = PAPER_MEASURE[row["study"]]
        if row["acc_measure"] != theirs:
            notes = [*notes, f"accuracy: {MEASURE_LABEL[row['acc_measure']]} (paper: {MEASURE_LABEL[theirs]})"]
        key = tuple(row[k] for k in KEY)
        if key not in chosen or (len(notes), -row["seeds"]) < (len(chosen[key][1]), -chosen[key][0]["seeds"]):
            chosen[key] = (row, notes)
    return chosen


def claim_verdict(claim: Claim, row: dict[str, Any] | None, agree: dict[str, float]) -> str:
    """Within tolerance (`agree_within` points, or the paper's figure inside our 95% t-interval), outside it, within
    noise (a time saving: time_kind), not yet run, or the dataset unavailable here."""
    if row is None:
        return UNAVAILABLE[claim.dataset][0] if claim.dataset in UNAVAILABLE else NOT_RUN
    value = row.get(f"{claim.figure}_mean")
    if value is None:
        return NOT_RUN
    if claim.figure == "own_time_saving_pct":
        kind = time_kind(row, claim.published, agree["saving_points"], claim.figure)
        return {"match": WITHIN, "mismatch": OUTSIDE}.get(kind, NOISE)
    tol = agree["acc_points"] if claim.figure == "acc_delta" else agree["saving_points"]
    return WITHIN if abs(value - claim.published) <= max(tol, row.get(f"{claim.figure}_ci95") or 0) else OUTSIDE


def interval(row: dict[str, Any], name: str) -> tuple[float, float, float] | None:
    """The figure's 95% interval (its own, or the t-interval over 3+ seeds) as (mean, lo, hi); None without one."""
    mean = row.get(f"{name}_mean")
    if mean is None:
        return None
    if row.get(f"{name}_lo") is not None:
        return mean, row[f"{name}_lo"], row[f"{name}_hi"]
    if row.get(f"{name}_ci95") is not None:
        return mean, mean - row[f"{name}_ci95"], mean + row[f"{name}_ci95"]
    return None


def figure_cell(row: dict[str, Any], name: str, digits: int, sign: bool) -> str:
    """Our figure `name`: 'mean [lo, hi]' with its 95% interval; stat() under 3 seeds; why it is missing."""
    if row.get(f"{name}_mean") is None:
        return f"— ({missing_figure(row, name)})"
    if (bounds := interval(row, name)) is None:
        return stat(row, name, digits, sign=sign, note=False)  # the seeds column says over how many
    mean, lo, hi = bounds
    form = f"{'+' if sign else ''}.{digits}f"
    return f"{mean:{form}} [{lo:{form}}, {hi:{form}}]"


def claim_figure(row: dict[str, Any] | None, claim: Claim) -> str:
    """A claim's figure of ours (figure_cell, signed); '—' without a run."""
    return "—" if row is None else figure_cell(row, claim.figure, claim.digits, sign=True)


def drawn_bounds(row: dict[str, Any], name: str) -> tuple[float | None, float | None]:
    """What claims_figure draws around our figure `name`: its 95% interval, else ±1 sd (a t-interval over seeds
    that has 2), else none."""
    if (bounds := interval(row, name)) is not None:
        return bounds[1], bounds[2]
    mean, std = row[f"{name}_mean"], row.get(f"{name}_std")
    return (None, None) if std is None else (mean - std, mean + std)


def claim_point(claim: Claim, row: dict[str, Any], verdict: str, agree: dict[str, float]) -> dict[str, Any]:
    """A claim that ran, as claims_figure draws it: ours with its bounds (drawn_bounds), the paper's figure and the
    tolerance of the verdict."""
    name = claim.figure
    mean = row[f"{name}_mean"]
    lo, hi = drawn_bounds(row, name)
    label = f"{claim.dataset} · {claim.model} · {claim.method}{paired_note(row, name)}"
    return {
        "panel": claim.what, "label": label, "ours": mean, "lo": lo,
        "hi": hi, "paper": claim.published, "verdict": verdict, "color": VERDICT_COLORS[verdict],
        "tolerance": agree["acc_points"] if name == "acc_delta" else agree["saving_points"],
    }  # fmt: skip


def collapsed_note(failed: list[Run]) -> str:
    """The report's line on the runs that ended at chance accuracy (aggregate.collapsed)."""
    named = ", ".join(
        f"{r.study} {r.dataset}/{r.model}/{r.method} seed {r.seed} ({ending(r)})"
        for r in sorted(failed, key=lambda r: (r.study, r.dataset, r.model, r.method, r.seed))
    )
    return (
        f"Runs that ended at chance accuracy (within {CHANCE_MARGIN:g} point of 100 / classes: the network stopped "
        f"learning), left out of every figure: {named}. A method's run of a seed whose baseline did so is left out of "
        "its accuracy Δ and the other figures paired with the baseline (seeds: '2 of 3'), and counted in its own "
        "(time saved against its own full epochs, reduction)."
    )


def ending(run: Run) -> str:
    """'final 10.00%', or 'loss diverged in epoch 6' for a run whose loss became NaN or infinite (its last epoch before
    it is not its end)."""
    return divergence(run.metrics) or f"final {run.metrics['final_acc']:.2f}%"


CLAIM_HEADERS = [
    "study", "dataset", "model", "method", "claim", "ours [95% interval]", "seeds", "device", "paper", "diff",
    "compute saved % (bound)", "cheaper epoch: time / work", "setting", "verdict",
]  # fmt: skip


def claim_cells(claim: Claim, found: tuple[dict[str, Any], list[str]] | None, verdict: str) -> list[str]:
    """One row of the claims table (CLAIM_HEADERS); `found`: the row at the paper's setting and its deviations."""
    row, notes = found or (None, [])
    digits, signed = claim.digits, claim.figure == "acc_delta"
    mean = row.get(f"{claim.figure}_mean") if row else None
    timed = row is not None and claim.figure == "own_time_saving_pct"
    compute = stat(row, "compute_saving_pct", 1) if timed else ""
    cheap = cheap_epoch_cell(row) if timed else ""
    return [
        claim.study, claim.dataset, claim.model, claim.method, claim.what, claim_figure(row, claim),
        seeds_cell(row, claim.figure) if row else "—", (row.get("devices") or "—") if row else "—",
        fmt(claim.published, digits, signed), fmt(None if mean is None else mean - claim.published, digits, True),
        compute, cheap, ("; ".join(notes) or "paper's") if row else "—", verdict,
    ]  # fmt: skip


def seeds_cell(row: dict[str, Any], name: str) -> str:
    """The seeds the claim's figure is over: '3', or '2 of 3' for a paired one whose baselines are still to run."""
    over, seeds = paired_seeds(row, name), int(row["seeds"])
    return seed_count(row, f"{over} of {seeds}" if row.get(f"{name}_mean") is not None and over < seeds else None)


ACCURACY_HEADERS = ["study", "dataset", "model", "method", "measure", "ours [95% interval]", "seeds", "device", "paper",
                    "diff", "setting"]  # fmt: skip


def accuracy_level(
    chosen: dict[tuple, tuple[dict[str, Any], list[str]]], published: dict[tuple, float]
) -> tuple[Table, list[dict[str, Any]]]:
    """Our accuracy beside each accuracy the papers publish (their Tables 2, the baselines' included) that has a run at
    the paper's setting: how far the level of our runs lies from the paper's, which a claim's Δ, a method against its
    own baseline, does not show. Returns the table and its points for claims_figure."""
    rows, points, gaps = [], [], {}
    cells = [(key, value) for key, value in published.items() if key[4] in ACCURACIES]
    for (study, dataset, model, method, _), theirs in cells:
        if (found := chosen.get((study, dataset, model, method))) is None:
            continue
        row, notes = found
        ours, measure = row.get("acc_mean"), MEASURE_SHORT[row["acc_measure"]]
        rows.append([study, dataset, model, method, measure, figure_cell(row, "acc", 2, sign=False),
                     seed_count(row), row.get("devices") or "—", fmt(theirs, 2),
                     fmt(None if ours is None else ours - theirs, 2, True), "; ".join(notes) or "paper's"])  # fmt: skip
        if ours is None:  # every seed ended at chance
            continue
        lo, hi = drawn_bounds(row, "acc")
        points.append({"panel": f"{study.upper()}, {dataset}: {measure}", "label": f"{model} · {method}",
                       "ours": ours, "lo": lo, "hi": hi, "paper": theirs, "tolerance": None, "verdict": "ours",
                       "color": OURS_COLOR})  # fmt: skip
        if method == BASELINE:
            gaps.setdefault(study.upper(), []).append(ours - theirs)
    spans = [
        f"{study}'s {min(g):+.2f} to {max(g):+.2f} points ({len(g)} network{'s' * (len(g) > 1)})"
        for study, g in gaps.items()
    ]
    finals: dict[tuple[str, str], dict[str, float]] = {}  # a network's baselines under each study's recipe
    for (study, dataset, model, method), (row, _) in chosen.items():
        if method == BASELINE and row.get("final_acc_mean") is not None:
            finals.setdefault((dataset, model), {})[study] = row["final_acc_mean"]
    both = [
        f"{dataset}/{model} " + ", ".join(f"{study} {acc:.2f}" for study, acc in sorted(by_study.items()))
        for (dataset, model), by_study in sorted(finals.items())
        if len(by_study) > 1
    ]
    note = (
        "Our test accuracy beside each accuracy the papers publish (DFP Table 2, WUS Table 2, each in its paper's "
        "measure), the baselines' among them, where a run at the paper's setting exists: the mean over seeds and its "
        "95% t-interval (3+ seeds; (sd) with 2); diff: ours minus the paper's. The claims above compare each method "
        "with its own baseline; this table shows how far the level of our runs lies from the paper's. "
        + (f"Our baselines against the papers': {', '.join(spans)}. " if spans else "")
        + (
            "The networks trained by both studies' recipes (docs/methods.md), their baselines' final-epoch accuracy "
            f"under each: {'; '.join(both)}. "
            if both
            else ""
        )
        + f"{len(cells) - len(rows)} of the papers' {len(cells)} accuracies have no run at the paper's setting."
    )
    return Table("ledger_accuracy", "Accuracy against the papers'", note, ACCURACY_HEADERS, rows), points


def wus_schedule_table(runs: list[Run], published: dict[tuple, float]) -> Table:
    """Per WUS or WUS+LR run at the paper's setting on a network the paper lacks: its share of skip epochs and its
    Eq. 1 reduction, beside the range of Table 3 on the same dataset."""
    table3: dict[str, list[float]] = {}
    for (study, dataset, _, _, metric), value in published.items():
        if study == "wus" and metric == "updated_params_reduction":
            table3.setdefault(dataset, []).append(value)
    networks = {k[:3] for k in published}
    rows = []
    for run in sorted(runs, key=lambda r: (r.dataset, r.model, r.method, r.seed)):
        if run.study != "wus" or run.method == BASELINE or (run.study, run.dataset, run.model) in networks:
            continue
        counted, notes = paper_setting(run)
        skip, normal = run.metrics.get("skip_epochs"), run.metrics.get("normal_epochs")
        if not counted or skip is None or normal is None:
            continue
        theirs = table3.get(run.dataset)
        rows.append([
            run.name, run.device or "—", f"{run.metrics['epochs']:.0f}", f"{skip:.0f}",
            fmt(100 * skip / (skip + normal) if skip + normal else None, 1),
            fmt(run.metrics.get("updated_params_reduction_pct"), 1),
            f"{min(theirs):.0f}–{max(theirs):.0f}" if theirs else NOT_IN_PAPER, "; ".join(notes) or "paper's",
        ])  # fmt: skip
    note = (
        "The WUS paper trains none of these networks. Skip epochs: epochs that updated only the last layer's biases; "
        "reduction: Eq. 1, N = E_skip·b + E_normal·(b + w), against a baseline that updates every parameter every "
        "epoch; Table 3: the range of the paper's reductions on the same dataset (its 4 networks, WUS and WUS+LR)."
    )
    if not rows:
        note = f"No WUS or WUS+LR run at the paper's setting on a network the paper lacks yet. {note}"
    headers = ["run", "device", "epochs", "skip epochs", "skip share %", "reduction %", "Table 3 %", "setting"]
    return Table("ledger_wus_schedule", "WUS through its whole schedule, on networks the paper lacks", note, headers,
                 rows)  # fmt: skip


def paper_scale(
    summary: list[dict[str, Any]], runs: list[Run], published: dict[tuple, float], agree: dict[str, float]
) -> tuple[str, list[Table], dict[str, Figure]]:
    """The section "Reproduced at the papers' scale": every published claim against our runs at the paper's setting,
    from the grid or the results ledger, with a verdict and one coverage line; the methods at equal cost at that
    setting (every configuration, not only the papers' networks); WUS on networks the paper lacks; figures of those
    runs. Returns the markdown, its tables (MLflow: tables/ledger.json, ledger_accuracy_vs_cost.json,
    ledger_wus_schedule.json) and its figures (LEDGER_FIGURES)."""
    claims = published_claims(published)
    chosen = paper_scale_rows(summary, runs)
    judged = [(c, chosen.get((c.study, c.dataset, c.model, c.method))) for c in claims]
    verdicts = [claim_verdict(c, found[0] if found else None, agree) for c, found in judged]
    cells = [claim_cells(c, found, v) for (c, found), v in zip(judged, verdicts, strict=True)]
    count = {v: verdicts.count(v) for v in (WITHIN, OUTSIDE, NOISE, NOT_RUN)}
    unavailable = [f"{verdicts.count(label)} {label}" for label, _ in UNAVAILABLE.values() if label in verdicts]
    ran = count[WITHIN] + count[OUTSIDE] + count[NOISE]
    coverage = (
        f"**{ran} of {len(claims)} published claims run, {count[WITHIN]} within tolerance** ({count[NOISE]} within "
        f"noise, {count[OUTSIDE]} outside tolerance, {count[NOT_RUN]} not yet run"
        + "".join(f", {u}" for u in unavailable)
        + ")."
    )
    notes = [
        "Ours: the mean over seeds and its 95% interval (accuracy Δ and reduction: the t-interval over seeds, from 3 "
        "seeds, with 2 the standard deviation (sd), with 1 the mean alone; time saved: the interval of "
        "`cheaptrain.timing` at any number of seeds, which also sees how epochs scatter within a run, each put at the "
        "run's typical machine speed, read from its evaluation passes); time saved is the run's against its own full "
        "epochs (the saving against its baseline's run, which needs both on one machine, is in the tables below). Δ: "
        "method minus the baseline of the same recipe and seed; the paper's: its method minus its baseline. diff: "
        "ours minus the paper's.",
        f"Verdict: within tolerance when ours lies within ±{agree['acc_points']:g} points (accuracy Δ) or "
        f"±{agree['saving_points']:g} points (time saved, reduction) of the paper's figure (params "
        "`aggregate.agree_within`) or, for the accuracy Δ and the reduction, the paper's figure lies within our 95% "
        "t-interval. A time saving further from the paper's is within noise, never outside tolerance, when its "
        "interval contains the paper's figure; one whose interval lies wholly more than those points above the compute "
        "saved, its bound, is within noise however close to the paper's. Not yet run: no run "
        "at the paper's setting, or (accuracy Δ) no baseline of any of its seeds yet; with some, the Δ is over those "
        "(seeds: '2 of 3').",
        "Compute saved: 100·(1 − training FLOPs / the baseline's), paired by seed: what an ideal implementation "
        "saves, so it bounds the time saving on any hardware; a paper's time saving above it cannot come from the "
        "work the method leaves out alone.",
        CHEAP_EPOCH_NOTE,
        *(f"{why}." for _, why in UNAVAILABLE.values()),
        JPEG_NOTE,
    ]
    excluded, first = [], first_runs(runs)
    for row in summary:
        counted, differences = paper_setting(first[row_key(row)])
        if "ledger" in row.get("source", "") and not counted:
            excluded.append(
                f"{row['study']} {row['dataset']}/{row['model']}/{row['method']} ({'; '.join(differences)})"
            )
    if excluded:
        notes.append("Ledger runs not at the paper's setting, not counted: " + ", ".join(excluded) + ".")
    if failed := [run for run in runs if collapsed(run)]:
        notes.append(collapsed_note(failed))
    learned = [run for run in runs if not collapsed(run)]  # what the tables and figures below show
    claims_table = Table("ledger", "Every published claim", coverage, CLAIM_HEADERS, cells)
    level, level_points = accuracy_level(chosen, published)
    wus = wus_schedule_table(learned, published)
    at_scale = [row for row, _ in chosen.values()]
    keys = {row_key(row) for row in at_scale}
    at_scale_runs = [run for run in learned if config_key(run) in keys]
    implements = implementation_of(runs)
    cost = replace(
        cost_table(
            at_scale,
            implements,
            agree["cost_points"],
            "own_time_saving_pct",
            seed_accuracies(at_scale, runs),
        ),
        slug="ledger_accuracy_vs_cost",
        title="Accuracy against cost at the papers' setting",
    )
    where = "At the papers' setting"
    ran_points = [
        claim_point(c, found[0], v, agree)
        for (c, found), v in zip(judged, verdicts, strict=True)
        if found and v in VERDICT_COLORS
    ]
    figs = {
        "ledger_test_acc.png": curve_figure(
            at_scale_runs, "epoch", "epoch", f"{where}: test accuracy per epoch (mean over seeds, ±1 sd)"
        ),
        "ledger_acc_vs_cost.png": cost_figure(
            at_scale, implements, "own_time_saving_pct", f"{where}: accuracy against cost (95% intervals)"
        ),
        "ledger_wus_phases.png": phases_figure(at_scale_runs, f"{where}: WUS phases (skip epochs shaded)"),
        "ledger_pruned_samples.png": pruned_figure(
            at_scale_runs, f"{where}: sample-passes left out so far (mean over seeds)", cumulative=True
        ),
        CLAIMS_FIGURE: claims_figure(
            ran_points, f"{where}: every published claim run so far, ours against the paper's"
        ),
        ACCURACY_FIGURE: claims_figure(level_points, f"{where}: our accuracy against the paper's"),
    }
    lines = [
        "## Reproduced at the papers' scale",
        "",
        coverage,
        "",
        "Every figure the papers publish about a method (`data/published_results.csv`: DFP Tables 1 and 2, WUS "
        "Tables 1 to 3), against our runs at the paper's setting: 200 epochs and the study's paper recipe, on any "
        "device, from the grid (`runs/`) or the results ledger (`ledger/`, runs kept in the repository). A setting "
        "of one network in `recipes.<study>.per_model` is a documented deviation: its runs count, and the column "
        "setting names it, as it names where a network differs from the paper's (the WUS paper names BatchNorm for "
        "ResNet-18 alone; our VGGs keep it, docs/models.md).",
        "",
        md_table(CLAIM_HEADERS, cells),
        "",
        *(f"- {note}" for note in notes),
        "",
        f"![{LEDGER_FIGURES[CLAIMS_FIGURE]}](figures/{CLAIMS_FIGURE})",  # the table above, at a glance
        "",
        level.markdown(),
        f"![{LEDGER_FIGURES[ACCURACY_FIGURE]}](figures/{ACCURACY_FIGURE})",
        "",
        cost.markdown(),
        wus.markdown(),
        *(
            f"![{what}](figures/{name})\n"
            for name, what in LEDGER_FIGURES.items()
            if name not in (CLAIMS_FIGURE, ACCURACY_FIGURE)
        ),
    ]
    return "\n".join(lines), [claims_table, level, cost, wus], figs
