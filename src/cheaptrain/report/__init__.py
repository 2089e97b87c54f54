"""The reader's view of the summary: the papers' tables with our figures beside theirs, findings, figures, MLflow.

Outputs under results/ (the aggregate stage, `stage.write_results`): report.md, figures/*.png,
curves/<study>-<dataset>-<model>-<method>.csv (per-epoch means over seeds, for `dvc plots`), and one MLflow run in
the experiment `aggregate`.

report.md opens with "Reproduced at the papers' scale" (`claims`): every claim the papers publish about a method,
against our runs at the paper's setting (from the grid or the results ledger), with a verdict and one coverage line.
The rest is the grid's (`stage.report_markdown`): its setting, the papers' tables with its figures and the findings
(`tables`), the methods at equal cost (`equal_cost`), figures and curves (`figures`); a ledger run joins them only
as a seed of one of the grid's configurations. summary.csv and metrics.json hold every configuration.

"Accuracy against cost" compares the methods at equal cost: each method across its budgets (named configurations,
`methods.<name>.method`), grouped by compute saved, the best at each budget named and its lead weighed seed by seed
against its 95% interval.

Wall-clock savings are shown with their 95% interval and beside the compute saved, their bound (`cheaptrain.timing`).
A time saving is "within noise" of a figure, 0 or the paper's, when its interval contains it; a time saving against
the baseline's run (`time_saving_pct`) below 0 of a method that did less work is within noise too, since the interval
cannot see a machine that was busier during one run than during the other. That does not hold for the saving against
the run's own full epochs (`own_time_saving_pct`): both sides come from one run, priced on its own evaluation clock,
so a cheaper epoch slower than a full one is the method's own overhead, a figure like any other. A figure within
noise is neither called a finding nor a mismatch; against the paper's figure, one within `aggregate.agree_within`
points of it matches (`tables.time_kind`). A time saving whose interval lies wholly more than those points above the
compute saved, its bound, is noise whether the paper has a figure or not (`tables.above_bound`): the machine's speed
moved, not the work.

    cells       a summary figure as a table cell; the Table every section builds
    tables      the papers' tables with ours, and the findings: what matches the papers and what does not
    equal_cost  the methods at equal cost: budgets, the best at each and its lead
    claims      "Reproduced at the papers' scale": every published claim against our runs at the paper's setting
    figures     the figures and per-epoch curves
    stage       report.md, the MLflow run and the aggregate stage itself
"""
