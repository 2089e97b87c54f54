"""The report's figures (matplotlib, no pyplot: no display, no global state) and the per-epoch curves of each
configuration for `dvc plots`."""

from __future__ import annotations

import csv
import io
import itertools
import math
import statistics
from typing import Any

from matplotlib.figure import Figure

from cheaptrain.aggregate import BASELINE, Run, config_key
from cheaptrain.report.cells import NOT_IN_PAPER, within_noise
from cheaptrain.report.equal_cost import TIME_SAVED, cost_points, implementation_of, panel

COLORS = {"baseline": "0.25", "dfp": "tab:blue", "random_prune": "tab:orange", "wus": "tab:green", "wus_lr": "tab:red",
          "infobatch": "tab:purple", "infobatch_unweighted": "tab:pink"}  # fmt: skip
FIGURES = (
    "test_acc.png", "acc_vs_time.png", "pruned_samples.png", "wus_phases.png", "time_saving.png", "acc_vs_cost.png",
)  # fmt: skip
LEDGER_FIGURES = {  # the runs at the papers' setting (grid or ledger): file -> what it shows
    "ledger_test_acc.png": "Test accuracy per epoch at the papers' setting",
    "ledger_acc_vs_cost.png": "Accuracy Δ against compute saved and time saved at the papers' setting",
    "ledger_wus_phases.png": "WUS phases over the papers' 200 epochs",
    "ledger_pruned_samples.png": "Sample-passes left out so far, per epoch, at the papers' setting",
    "ledger_claims.png": "Every published claim run so far: ours against the paper's, with the tolerance",
    "ledger_accuracy.png": "Our accuracy against the paper's, the baselines' included",
}


def configurations(runs: list[Run]) -> dict[tuple[str, str, str, str], list[Run]]:
    """Runs per (study, dataset, model, method), baseline first in each panel, seeds in order."""
    order = sorted(runs, key=lambda r: (r.study, r.dataset, r.model, r.method != BASELINE, r.method, r.seed))
    return {k: list(g) for k, g in itertools.groupby(order, key=lambda r: (r.study, r.dataset, r.model, r.method))}


def mean_curve(group: list[Run]) -> list[dict[str, float]]:
    """Per epoch, the mean over seeds of every history column all the runs have, plus cum_train_s."""
    epochs = min(len(r.history) for r in group)
    columns = [c for c in group[0].history[0] if all(c in r.history[0] for r in group)]
    curve = []
    for i in range(epochs):
        row = {c: statistics.fmean(r.history[i][c] for r in group if c in r.history[i]) for c in columns}
        row["cum_train_s"] = statistics.fmean(sum(h["epoch_train_s"] for h in r.history[: i + 1]) for r in group)
        curve.append(row)
    return curve


def curves_csv(group: list[Run]) -> str:
    curve = mean_curve(group)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(curve[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: round(v, 4) for k, v in row.items()} for row in curve)
    return out.getvalue()


def _panels(n: int, title: str, width: float = 5.2, height: float = 3.8, cols: int = 0) -> tuple[Figure, list]:
    """A figure of n panels, at most 3 a row (2 for 4), with a title; unused panels hidden."""
    n = max(n, 1)
    cols = cols or (2 if n == 4 else min(3, n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(width * cols, height * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=13)
    return fig, axes


def _empty(title: str, text: str) -> Figure:
    fig, (ax,) = _panels(1, title, 6.5, 2.6)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11, color="0.3")
    ax.set_axis_off()
    return fig


def _color(method: str) -> str:
    return COLORS.get(method, f"C{5 + sum(map(ord, method)) % 5}")


def curve_figure(runs: list[Run], x: str, xlabel: str, title: str) -> Figure:
    """Test accuracy (mean over seeds, ±1 sd band) against `x`, one panel per study, dataset and model."""
    if not runs:
        return _empty(title, "No runs here yet: no curve to show.")
    configs = configurations(runs)
    panels = sorted({k[:3] for k in configs})
    fig, axes = _panels(len(panels), title)
    for ax, where in zip(axes, panels, strict=False):
        for key, group in configs.items():
            if key[:3] != where:
                continue
            curve = mean_curve(group)
            xs = [row[x] for row in curve]
            acc = [row["test_acc"] for row in curve]
            label = f"{key[3]} ({len(group)} seed{'s' * (len(group) > 1)})"
            implements = implementation_of(group)[config_key(group[0])]  # a named configuration: its method's color
            style = {"color": _color(implements), "ls": "-" if implements == key[3] else "--"}
            ax.plot(xs, acc, label=label, lw=1.8, marker="o" if len(xs) <= 20 else None, ms=3, **style)
            if len(group) > 1:
                sd = [statistics.stdev(r.history[i]["test_acc"] for r in group) for i in range(len(curve))]
                ax.fill_between(
                    xs,
                    [a - s for a, s in zip(acc, sd, strict=True)],
                    [a + s for a, s in zip(acc, sd, strict=True)],
                    color=style["color"],
                    alpha=0.15,
                )
        ax.set(title=f"{where[0]} study · {where[1]} · {where[2]}", xlabel=xlabel, ylabel="test accuracy (%)")
        ax.grid(alpha=0.3)
        many = len(ax.get_lines()) > 5  # in one column, a panel's many configurations would hide its curves
        ax.legend(fontsize=7 if many else 9, loc="lower right", ncols=2 if many else 1)
    return fig


def pruned_figure(runs: list[Run], title: str = "", cumulative: bool = False) -> Figure:
    """Samples left out per epoch (mean over seeds), one panel per study, dataset and model. `cumulative`: the share
    of the sample-passes a full run would have trained by each epoch that were left out, where a schedule of 200
    epochs alternating pruned and full ones would draw as a solid block; it ends at the run's sample saving."""
    title = title or "Samples pruned per epoch (mean over seeds)"
    configs = {k: g for k, g in configurations(runs).items() if all("pruned_samples" in r.history[0] for r in g)}
    if not configs:
        return _empty(title, "No pruning method (dfp, random_prune, infobatch) here yet: nothing to show.")
    implements = implementation_of(runs)
    panels = sorted({k[:3] for k in configs})
    fig, axes = _panels(len(panels), title)
    for ax, where in zip(axes, panels, strict=False):
        drawn: dict[tuple[float, ...], str] = {}  # a curve already drawn -> its configuration
        for key, group in configs.items():
            if key[:3] != where:
                continue
            curve = mean_curve(group)
            ys = [row["pruned_samples"] for row in curve]
            if cumulative:
                passes = list(itertools.accumulate(row["pruned_samples"] + row["trained_samples"] for row in curve))
                ys = [100 * left / n for left, n in zip(itertools.accumulate(ys), passes, strict=True)]
            total = statistics.fmean(sum(h["pruned_samples"] for h in r.history) for r in group)
            label = f"{key[3]} ({total:,.0f} in all)"
            method = implements[config_key(group[0])]
            style = {"color": _color(method), "ls": "-" if method == key[3] else "--", "lw": 1.8}
            shape = tuple(round(y, 6) for y in ys)
            if same := drawn.get(shape):  # one schedule, two selections: keep both visible
                label, style["lw"], style["ls"] = f"{label}, as {same}", 1.0, ":"
            drawn.setdefault(shape, key[3])
            epochs = [row["epoch"] for row in curve]
            if cumulative:
                ax.plot(epochs, ys, label=label, **style)
            else:
                ax.step(epochs, ys, where="mid", label=label, **style)
        ylabel = "sample-passes left out so far (%)" if cumulative else "samples left out"
        ax.set(title=f"{where[0]} study · {where[1]} · {where[2]}", xlabel="epoch", ylabel=ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if len(ax.get_lines()) > 5:  # below the panel: inside, a dozen entries would hide the curves
            ax.legend(fontsize=7, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))
        else:
            ax.legend(fontsize=9)
    return fig


def spans(epochs: list[int]) -> list[tuple[int, int]]:
    """Ascending epochs as runs of consecutive ones: [3, 4, 5, 8] -> [(3, 5), (8, 8)]."""
    runs: list[tuple[int, int]] = []
    for e in epochs:
        if runs and e == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], e)
        else:
            runs.append((e, e))
    return runs


def phases_figure(
    runs: list[Run], title: str = "WUS phases: skip epochs (shaded) update only the last layer's bias"
) -> Figure:
    """Per WUS run (first seed): test accuracy with the skip epochs shaded, the baseline's and the lr drops."""
    configs = {k: g for k, g in configurations(runs).items() if all("phase" in r.history[0] for r in g)}
    if not configs:
        return _empty(title, "No wus or wus_lr runs here yet: no phases to show.")
    baselines = {(r.study, r.dataset, r.model, r.seed): r for r in runs if r.method == BASELINE}
    fig, axes = _panels(len(configs), title)
    for ax, (key, group) in zip(axes, configs.items(), strict=False):
        run = group[0]
        epochs = [h["epoch"] for h in run.history]
        skip = [h["epoch"] for h in run.history if h["phase"] >= 0.5]
        for i, (first, last) in enumerate(spans(skip)):  # one patch per run of epochs: 200-epoch runs draw fast
            ax.axvspan(first - 0.5, last + 0.5, color=_color(key[3]), alpha=0.15, lw=0,
                       label="skip epoch" if i == 0 else None)  # fmt: skip
        drops = [h["epoch"] - 0.5 for prev, h in itertools.pairwise(run.history) if h["lr"] != prev["lr"]]
        for i, e in enumerate(drops):
            ax.axvline(e, color="0.4", ls=":", lw=1.2, label="lr change" if i == 0 else None)
        if base := baselines.get((run.study, run.dataset, run.model, run.seed)):
            ax.plot(
                [h["epoch"] for h in base.history],
                [h["test_acc"] for h in base.history],
                color=_color(BASELINE),
                ls="--",
                lw=1.4,
                label="baseline",
            )
        ax.plot(
            epochs,
            [h["test_acc"] for h in run.history],
            color=_color(key[3]),
            lw=1.8,
            label=key[3],
            marker="o" if len(epochs) <= 20 else None,
            ms=3,
        )
        ax.set(
            title=f"{key[3]} · {key[1]} · {key[2]} · s{run.seed}: {len(skip)} skip epochs of {len(epochs)}",
            xlabel="epoch",
            ylabel="test accuracy (%)",
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower right")
    return fig


def saving_figure(summary: list[dict[str, Any]]) -> Figure:
    """Per method and configuration: compute saved, time saved against the baseline and against the run's own full
    epochs (95% intervals; 'noise' where within noise of 0), and the paper's time saved (hatched)."""
    title = "Saved against the baseline (same recipe, paired by seed)"
    bars = (  # (column, offset, label, style)
        ("compute_saving_pct", -0.3, "compute saved (exact: the bound)", {"alpha": 0.45}),
        ("time_saving_pct", -0.1, "time saved (95% interval)", {}),
        ("own_time_saving_pct", 0.1, "time saved vs own full epochs (95% interval)", {"hatch": "..", "alpha": 0.7}),
    )
    rows = [r for r in summary if r["method"] != BASELINE and any(r.get(f"{b[0]}_mean") is not None for b in bars)]
    if not rows:
        return _empty(title, "No method has a saving to show yet.")
    studies = list(dict.fromkeys(r["study"] for r in rows))
    most = max(sum(r["study"] == s for r in rows) for s in studies)
    fig, axes = _panels(len(studies), title, width=max(6.5, 1.8 * most), height=4.4, cols=1)
    for ax, study in zip(axes, studies, strict=False):
        shown = [r for r in rows if r["study"] == study]
        xs = range(len(shown))
        for name, offset, label, style in bars:
            drawn = [(x, r) for x, r in zip(xs, shown, strict=True) if r.get(f"{name}_mean") is not None]
            if not drawn:
                continue
            means = [r[f"{name}_mean"] for _, r in drawn]
            err = None
            if all(f"{name}_lo" in r for _, r in drawn):  # the compute saved is exact: no bar
                err = [[m - r[f"{name}_lo"] for m, (_, r) in zip(means, drawn, strict=True)],
                       [r[f"{name}_hi"] - m for m, (_, r) in zip(means, drawn, strict=True)]]  # fmt: skip
            colors = [_color(r["method"]) for _, r in drawn]
            ax.bar([x + offset for x, _ in drawn], means, 0.2, yerr=err, capsize=3, color=colors, label=label, **style)
            for x, r in drawn:
                if within_noise(r, name, 0.0):
                    top = max(r.get(f"{name}_hi", 0.0), r[f"{name}_mean"], 0.0)
                    ax.text(x + offset, top, "noise", rotation=90, ha="center", va="bottom", fontsize=8)
        theirs = [r.get("paper_time_saving_pct") for r in shown]
        if any(t is not None for t in theirs):
            ax.bar(
                [x + 0.3 for x, t in zip(xs, theirs, strict=True) if t is not None],
                [t for t in theirs if t is not None],
                0.2,
                color="white",
                edgecolor="0.3",
                hatch="//",
                label="paper's time saved",
            )
        for x, t in zip(xs, theirs, strict=True):
            if t is None:
                ax.text(x + 0.3, 0, NOT_IN_PAPER, rotation=90, ha="center", va="bottom", fontsize=8, color="0.4")
        ax.axhline(0, color="0.2", lw=0.8)
        ax.set_xticks(list(xs), [f"{r['dataset']}\n{r['model']}\n{r['method']}" for r in shown], fontsize=9)
        ax.set_xlim(-0.7, len(shown) - 0.3)
        ax.set(title=f"{study} study", ylabel="saved (%)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def cost_figure(
    summary: list[dict[str, Any]],
    implementations: dict[tuple[str, ...], str],
    time_figure: str = "time_saving_pct",
    title: str = "Accuracy against cost: each method across its budgets, against the baseline (95% intervals)",
) -> Figure:
    """Per study, dataset and model: accuracy Δ (95% t-interval over seeds) against compute saved (left) and time
    saved (right, `time_figure` of TIME_SAVED, with its 95% interval), one line per method through its budgets; the
    papers' points (stars) beside the time saved, the only cost they publish."""
    points = cost_points(summary, implementations)
    if not points:
        return _empty(title, "No method with a compute saving and a paired baseline here yet.")
    panels = list(dict.fromkeys(panel(p) for p in points))
    fig, axes = _panels(2 * len(panels), title, cols=2)
    axes_x = (("compute_saving_pct", "compute saved (%, exact)"), (time_figure, TIME_SAVED[time_figure].axis))
    for i, key in enumerate(panels):
        shown = [p for p in points if panel(p) == key]
        for ax, (x, xlabel) in zip(axes[2 * i : 2 * i + 2], axes_x, strict=True):
            labels: list[tuple[str, float, float]] = []
            ax.axhline(0, color="0.2", lw=0.8)
            ax.plot([0], [0], marker="s", color=_color(BASELINE), ls="none", label=BASELINE)
            for name in dict.fromkeys(p["implementation"] for p in shown):
                line = sorted((p for p in shown if p["implementation"] == name and p.get(f"{x}_mean") is not None),
                              key=lambda p: p[f"{x}_mean"])  # fmt: skip
                if not line:
                    continue
                xs, ys = [p[f"{x}_mean"] for p in line], [p["acc_delta_mean"] for p in line]
                yerr = [p.get("acc_delta_ci95") or 0.0 for p in line]
                xerr = None
                if all(p.get(f"{x}_lo") is not None for p in line):
                    xerr = [
                        [p[f"{x}_mean"] - p[f"{x}_lo"] for p in line],
                        [p[f"{x}_hi"] - p[f"{x}_mean"] for p in line],
                    ]
                ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, color=_color(name), marker="o", capsize=3, lw=1.6, label=name)
                labels += [(budget_label(p), px, py) for p, px, py in zip(line, xs, ys, strict=True)]
            published = [p for p in shown if None not in (p.get("paper_time_saving_pct"), p.get("paper_acc_delta"))]
            for p in published if x == time_figure else []:
                ax.plot(p["paper_time_saving_pct"], p["paper_acc_delta"], marker="*", ms=13, mfc="white", ls="none",
                        mec=_color(p["implementation"]), label=f"paper: {p['method']}")  # fmt: skip
            ax.set(title=f"{key[0]} study · {key[1]} · {key[2]}", xlabel=xlabel, ylabel="accuracy Δ (points)")
            ax.grid(alpha=0.3)
            _label_points(ax, labels)
        _same_y(axes[2 * i : 2 * i + 2])
        _legend_beside(axes[2 * i : 2 * i + 2])
    return fig


def _same_y(row: list) -> None:
    """One accuracy scale for a row's panels, the paper's stars included: the same points against two costs read
    alike, and a lone point is not blown up to fill a panel of its own."""
    lows, highs = zip(*(ax.get_ylim() for ax in row), strict=True)
    for ax in row:
        ax.set_ylim(min(lows), max(highs))


def budget_label(point: dict[str, Any]) -> str:
    """A point's label on its method's line: the configuration's name less the implementation the line names
    (dfp_p70 -> p70), or the whole name for the implementation's own defaults."""
    return point["method"].removeprefix(f"{point['implementation']}_")


def _label_points(ax: Any, labels: list[tuple[str, float, float]]) -> None:
    """Each point's label beside it, toward the middle of the panel, so none runs out of it into the next."""
    left, right = ax.get_xlim()
    for text, x, y in labels:
        rightward = x < (left + right) / 2
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(4 if rightward else -4, 4), fontsize=7,
                    ha="left" if rightward else "right")  # fmt: skip


def _legend_beside(row: list) -> None:
    """One legend for a row of panels, right of its last, outside every panel: inside one it hides points."""
    unique = {label: handle for ax in row for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    row[-1].legend(unique.values(), unique.keys(), loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8)


def claims_figure(points: list[dict[str, Any]], title: str) -> Figure:
    """One panel per kind of claim, one line per claim that ran: the paper's figure (star) inside its tolerance band
    (grey), ours (dot, colored by its verdict) with its interval. A point: panel, label, ours, lo, hi (None: no
    interval), paper, tolerance (None: no band), verdict, color."""
    if not points:
        return _empty(title, "No published claim has been run at the paper's setting yet.")
    panels = list(dict.fromkeys(p["panel"] for p in points))
    height = max(len([p for p in points if p["panel"] == name]) for name in panels)
    fig, axes = _panels(len(panels), title, width=5.6, height=1.2 + 0.45 * height, cols=min(3, len(panels)))
    for ax, name in zip(axes, panels, strict=False):
        shown = [p for p in points if p["panel"] == name][::-1]  # the table's first claim on top
        for y, p in enumerate(shown):
            if p["tolerance"] is not None:
                band = (p["paper"] - p["tolerance"], p["paper"] + p["tolerance"])
                ax.plot(band, (y, y), color="0.85", lw=9, solid_capstyle="butt", label="paper ± tolerance")
            ax.plot(p["paper"], y, marker="*", ms=12, mfc="white", mec="0.2", ls="none", label="paper")
            xerr = None if p["lo"] is None else [[p["ours"] - p["lo"]], [p["hi"] - p["ours"]]]
            ax.errorbar(p["ours"], y, xerr=xerr, marker="o", ms=6, color=p["color"], capsize=3, lw=1.6,
                        label=p["verdict"])  # fmt: skip
        ax.set_yticks(range(len(shown)), [p["label"] for p in shown], fontsize=9)
        ax.set_ylim(-0.7, len(shown) - 0.3)
        ax.set_title(name)
        ax.grid(alpha=0.3, axis="x")
    fig.supxlabel("ours (dot: 95% interval; ±1 sd for a t-interval of 2 seeds) and the paper's (star)", fontsize=10)
    _legend_beside(axes[: len(panels)])
    return fig


def figures(summary: list[dict[str, Any]], runs: list[Run]) -> dict[str, Figure]:
    return {
        "test_acc.png": curve_figure(runs, "epoch", "epoch", "Test accuracy per epoch (mean over seeds, band: ±1 sd)"),
        "acc_vs_time.png": curve_figure(
            runs, "cum_train_s", "cumulative training time (s, this machine)", "Test accuracy against training time"
        ),
        "pruned_samples.png": pruned_figure(runs),
        "wus_phases.png": phases_figure(runs),
        "time_saving.png": saving_figure(summary),
        "acc_vs_cost.png": cost_figure(summary, implementation_of(runs)),
    }


def png(fig: Figure) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    return out.getvalue()
