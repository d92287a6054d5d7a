"""Analyses: what is measured on a model. Each returns plain result objects (arrays, dataclasses);
none draws or writes a report.

    interventions/  sites, interchange interventions, ablations, corruptions (docs/restoration.md)
    dynamics        Jacobians of recurrent mixers, spectra, Theorem 1, contraction
    error_control   the state-distinguishing subspace, drift q(t), Tcross, mp (docs/drift.md)
    heads           per-head DeltaNet beta analysis and head ablations
    sample_efficiency   the N* search (driving any runner callable), kappa, the finite-data trial
                    (docs/sample-efficiency.md)

May import: interp.training, interp.tasks, models, probes. Never interp.report, interp.sweep or
interp.cli.
"""
