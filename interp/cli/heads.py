"""`interp heads RUN_DIR`: the per-head analysis of a trained DeltaNet run (see `interp.analysis.heads`).

Prints one row per head (beta statistics, minimum transition eigenvalue, state effective ranks,
reveal accuracy with the head's beta clamped to [0, 1] or pinned to its mean) and writes an HTML
report (default RUN_DIR/heads.html). Kept free of heavy imports so `interp --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (check_out, check_workload, device_name, fail, non_negative_int, output_path,
                            positive_int, run_directory)

IMPLS = ("auto", "naive", "chunked", "triton")


def add_parser(sub) -> None:
    heads = sub.add_parser(
        "heads", help="per-head beta / state-rank analysis and beta ablations of a DeltaNet run",
        description="Per-head analysis of a trained DeltaNet run on fresh traces of its task (REPL or "
                    "PFSA): beta distribution, fraction of beta > 1, minimum transition eigenvalue, "
                    "effective rank of each head's state, and reveal accuracy with each head's beta "
                    "clamped to [0, 1] (and pinned to its mean, a control). Writes an HTML report.")
    heads.add_argument("run_dir", type=run_directory, help="a run directory of a DeltaNet model")
    heads.add_argument("--n", type=positive_int, default=256, help="traces to evaluate (default 256)")
    heads.add_argument("--length", type=positive_int, default=None,
                       help="task length (default: the run's training length)")
    heads.add_argument("--seed", type=non_negative_int, default=1, help="evaluation seed")
    heads.add_argument("--impl", choices=IMPLS, default=None,
                       help="delta-rule kernel for the ablations (default: the model's own; triton on CUDA)")
    heads.add_argument("--out", type=output_path, default=None, help="HTML report path (default RUN_DIR/heads.html)")
    heads.add_argument("--device", type=device_name, default="cpu", help="torch device")
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
    from interp.analysis.heads import analyze_run
    from interp.cli.drift import run_task
    from interp.report.heads import write_heads_report

    out = args.out or args.run_dir / "heads.html"
    refused = check_out("heads", out, file=True, flag="--out" if args.out else "run_dir")
    if refused is not None:
        return refused
    try:
        config, task = run_task(args.run_dir)
        unfit = task_misfit(args.run_dir, config, task)
        if unfit is not None:
            return fail("heads", unfit)
        check_workload(task, args.n, args.length or config["train"]["train_length"], "--n",
                       "--length" if args.length else None)
        analysis = analyze_run(args.run_dir, n=args.n, length=args.length, seed=args.seed,
                               impl=args.impl, device=args.device)
        write_heads_report(analysis, out, title=f"Head analysis of {args.run_dir}")
    except (ValueError, TypeError, KeyError, OSError) as error:
        return fail("heads", error)
    rows = analysis.rows()
    columns = list(rows[0])
    print(f"unablated reveal accuracy {analysis.ablation.baseline:.4f} on {args.n} traces")
    print(" ".join(f"{c:>12}" for c in columns))
    for row in rows:
        print(" ".join(f"{v:>12.4g}" if isinstance(v, float) else f"{v!s:>12}" for v in row.values()))
    print(f"wrote {out}")
    return 0
