"""Sweeps: many training runs, each its own run directory, into one tidy table; local or on Ray.

    spec            load_spec(path or dict) -> SweepSpec: a grid, or the adaptive N* study
    table           ResultTable: out/results.jsonl keyed by trial_id(params), appended per trial
    jobs            Job, Outcome, the Executor interface, execute (one trial in a worker)
    executors       LocalExecutor (process pool), make_executor
    ray_executor    RayExecutor: Ray core tasks (optional dependency, `interp-seq[ray]`)
    run             Sweep (the resumable trial runner), run_spec
    runs            run_each: one analysis over many run directories, one job per run (eval, drift, heads)

May import: interp.analysis, interp.training, interp.tasks, models. Never interp.report or
interp.cli. interp.analysis never imports this package: the N* search there drives any callable
runner, and a Sweep is one.
"""
