"""Presentation: plotly figure builders (each returns a go.Figure) and the offline HTML report.

    evaluation      accuracy by length, mp tables, training curves, generic curves
    interventions   restoration heatmaps, short-conv ablation bars
    heads           per-head beta figures and the `interp heads` report
    dynamics        drift q(t), Tcross vs mp, Jacobian spectra, states on U, the `interp drift` report
    sample_efficiency   N* vs length, kappa bars, kappa vs OOD accuracy, the study's report
    html            Text / Table sections and write_report (one self-contained HTML file)
    plotlyjs        how a report carries plotly.js offline: embedded compressed, or shared per directory
    style           the shared colour cycle and argument checks

May import: interp.analysis, interp.training, interp.tasks, models, probes. Never interp.cli
or interp.sweep (its peer: figures take the sweep's rows as plain dicts).
"""
