"""What is done to models. Packages by concern, imports pointing one way:

    cli -> {report, sweep} -> analysis -> training -> tasks   (and every one of them -> models, probes)

    tasks/      synthetic data with ground-truth latent state and named positions
    training/   the training loop, finite data sets, run directories, evaluation by length
    analysis/   interventions, dynamics, error control, per-head analyses, sample efficiency (N*,
                kappa) (results, no drawing)
    sweep/      sweep specs, executors (local process pool, Ray), the resumable results table
    report/     plotly figures and offline HTML reports
    cli/        the `interp` command, one module per subcommand
    nnsight.py  wrap(model): the nnsight face of every model

tests/test_layering.py reads the imports and enforces the arrows.
"""
