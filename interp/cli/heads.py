"""`interp heads RUN_DIR`: the per-head analysis of a trained DeltaNet run (see `interp.analysis.heads`).

Prints one row per head (beta statistics, minimum transition eigenvalue, state effective ranks,
reveal accuracy with the head's beta clamped to [0, 1] or pinned to its mean) and writes an HTML
report (default RUN_DIR/heads.html). Kept free of heavy imports so `interp --help` stays fast.

Several run directories, or --executor local|ray (--workers N, --address A): each run is one job
(`heads_job`, interp.sweep.runs.run_each) on worker processes or a Ray cluster, writing its own
RUN_DIR/heads.html, the numbers identical to `interp heads RUN_DIR` in a process with one torch
thread (docs/scaling-runs.md); a run that fails is one error line and the others go on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (add_scale_out_arguments, check_out, check_runs, check_workload, device_name,
                            executor_from_args, fail, length_count, output_path, over_runs, run_directory,
                            seed_value, sequence_count)

IMPLS = ("auto", "naive", "chunked", "triton")


def add_parser(sub) -> None:
    heads = sub.add_parser(
        "heads", help="per-head beta / state-rank analysis and beta ablations of a DeltaNet run",
        description="Per-head analysis of a trained DeltaNet run on fresh traces of its task (REPL or "
                    "PFSA): beta distribution, fraction of beta > 1, minimum transition eigenvalue, "
                    "effective rank of each head's state, and reveal accuracy with each head's beta "
                    "clamped to [0, 1] (and pinned to its mean, a control). Writes an HTML report. Several "
                    "run directories run one after another, or as parallel jobs with --executor local|ray "
                    "(one job per run; docs/scaling-runs.md).")
    heads.add_argument("run_dir", type=run_directory, nargs="+", metavar="run_dir",
                       help="one or more run directories of DeltaNet models")
    heads.add_argument("--n", type=sequence_count, default=256, help="traces to evaluate (default 256)")
    heads.add_argument("--length", type=length_count, default=None,
                       help="task length (default: the run's training length)")
    heads.add_argument("--seed", type=seed_value, default=1, help="evaluation seed")
    heads.add_argument("--impl", choices=IMPLS, default=None,
                       help="delta-rule kernel for the ablations (default: the model's own; triton on CUDA)")
    heads.add_argument("--out", type=output_path, default=None,
                       help="HTML report path (default RUN_DIR/heads.html; one run only)")
    heads.add_argument("--device", type=device_name, default="cpu", help="torch device")
    add_scale_out_arguments(heads, unit="run directory")
    heads.set_defaults(func=run)


def task_misfit(run_dir: Path, config: dict, task) -> str | None:
    """Why the run's task does not fit the head analysis (what it needs), or None when it does."""
    if "reveal" in task.sample(1, 2, 0).roles:
        return None
    mixer = config["model"].get("mixer", "?") if isinstance(config["model"], dict) else "?"
    return (f"{run_dir} is a {mixer} run on {task.name!r}; interp heads needs a DeltaNet "
            "run (a delta-rule mixer such as deltanet) trained on REPL or PFSA: it scores the model at the "
            f"task's reveal positions, which {task.name!r} has none of")


def run(args: argparse.Namespace) -> int:
    try:
        executor = executor_from_args(args, "heads")
    except ValueError as error:
        return fail("heads", error)
    params = dict(n=args.n, length=args.length, seed=args.seed, impl=args.impl, device=args.device)
    if len(args.run_dir) > 1 or executor is not None:
        refused = check_runs("heads", args.run_dir, args.out if len(args.run_dir) > 1 else None, locks=False) or next(
            (status for run_dir in args.run_dir
             if (status := check_out("heads", args.out or run_dir / "heads.html", file=True,
                                     flag="--out" if args.out else "run_dir")) is not None), None)
        if refused is not None:
            if executor is not None:
                executor.close()
            return refused
        return over_runs("heads", heads_job, args.run_dir, executor, dict(params, out=args.out and str(args.out)),
                         show)
    run_dir = args.run_dir[0]
    out = args.out or run_dir / "heads.html"
    refused = check_out("heads", out, file=True, flag="--out" if args.out else "run_dir")
    if refused is not None:
        return refused
    try:
        row = heads_run(run_dir, out, **params)
    except (ValueError, TypeError, KeyError, OSError) as error:
        return fail("heads", error)
    show(row, run_dir)
    return 0


def heads_run(run_dir: str | Path, out: str | Path | None = None, n: int = 256, length: int | None = None,
              seed: int = 1, impl: str | None = None, device: str = "cpu") -> dict:
    """`interp heads` on one run: the checks (task_misfit, check_workload), the analysis and the HTML
    report (default RUN_DIR/heads.html); {"baseline", "n", "rows": one per head, "out"}."""
    from interp.analysis.heads import analyze_run
    from interp.cli.drift import run_task
    from interp.report.heads import write_heads_report

    run_dir = Path(run_dir)
    out = Path(out or run_dir / "heads.html")
    config, task = run_task(run_dir)
    unfit = task_misfit(run_dir, config, task)
    if unfit is not None:
        raise ValueError(unfit)
    check_workload(task, n, length or config["train"]["train_length"], "--n", "--length" if length else None)
    analysis = analyze_run(run_dir, n=n, length=length, seed=seed, impl=impl, device=device)
    write_heads_report(analysis, out, title=f"Head analysis of {run_dir}")
    return {"baseline": analysis.ablation.baseline, "n": n, "rows": analysis.rows(), "out": str(out)}


def heads_job(params: dict, run_dir: str) -> dict:
    """The executor's job for one run (interp.sweep.runs.run_each): heads_run(run_dir, **params)."""
    return heads_run(Path(run_dir), **params)


def show(row: dict, run_dir: Path) -> None:
    rows = row["rows"]
    columns = list(rows[0])
    print(f"unablated reveal accuracy {row['baseline']:.4f} on {row['n']} traces")
    print(" ".join(f"{c:>12}" for c in columns))
    for head in rows:
        print(" ".join(f"{v:>12.4g}" if isinstance(v, float) else f"{v!s:>12}" for v in head.values()))
    print(f"wrote {row['out']}")
