"""`interp eval RUN_DIR [RUN_DIR ...]`: final-state accuracy by length and mp of trained runs (RUN_DIR/eval.json,
written under the run directory's lock: models.storage.paths.locked).

Several run directories, or --executor local|ray (--workers N, --address A): each run is one job
(`eval_job`, interp.sweep.runs.run_each) on worker processes or a Ray cluster; each writes its own
eval.json, identical to what `interp eval RUN_DIR` writes in a process with one torch thread
(docs/scaling-runs.md); a run that fails is one error line and the others go on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (add_scale_out_arguments, check_run_free, check_runs, check_workload, device_name,
                            executor_from_args, fail, fraction, length_list, over_runs, run_directory,
                            seed_value, sequence_count)


def add_parser(sub) -> None:
    ev = sub.add_parser("eval", help="accuracy by length and mp of trained runs",
                        description="Evaluate run directories: final-state accuracy at each length, "
                                    "mp, written to RUN_DIR/eval.json. Several run directories run one "
                                    "after another, or as parallel jobs with --executor local|ray (one job "
                                    "per run; docs/scaling-runs.md).")
    ev.add_argument("run_dir", type=run_directory, nargs="+", metavar="run_dir",
                    help="one or more run directories written by `interp train`")
    ev.add_argument("--lengths", type=length_list, default=[60, 100, 200, 500, 1000],
                    help="comma-separated lengths (default 60,100,200,500,1000)")
    ev.add_argument("--n", type=sequence_count, default=256, help="sequences per length")
    ev.add_argument("--seed", type=seed_value, default=1, help="evaluation seed")
    ev.add_argument("--threshold", type=fraction, default=0.9, help="mp accuracy threshold")
    ev.add_argument("--device", type=device_name, default="cpu", help="torch device")
    add_scale_out_arguments(ev, unit="run directory")
    ev.set_defaults(func=run)


def evaluate_run(run_dir: str | Path, lengths, n: int = 256, seed: int = 1, threshold: float = 0.9,
                 device: str = "cpu") -> dict:
    """`interp eval` on one run: evaluate, write RUN_DIR/eval.json under the run directory's lock;
    returns {"summary": the printed mp row, "eval": eval.json's content}."""
    import models
    from interp.report.evaluation import mp_rows
    from interp.tasks import make_task
    from interp.training import checkpoint as ckpt
    from interp.training.evaluate import evaluate_lengths
    from models.storage.paths import inside, locked

    config = ckpt.read_config(run_dir)
    task = make_task(config["task"]["name"], **config["task"].get("options", {}))
    check_workload(task, n, max(lengths), "--n", "--lengths")
    model = models.load(run_dir, device=device)
    result = evaluate_lengths(model, task, lengths, n=n, seed=seed, threshold=threshold, device=device)
    data = result.to_dict()
    with locked(run_dir, "run directory"):
        ckpt.write_json(inside(run_dir, "eval.json"), data)
    return {"summary": mp_rows({config["model"]["mixer"]: result}, threshold)[0], "eval": data}


def eval_job(params: dict, run_dir: str) -> dict:
    """The executor's job for one run (interp.sweep.runs.run_each): evaluate_run(run_dir, **params)."""
    return evaluate_run(Path(run_dir), **params)


def show(row: dict, run_dir: Path) -> None:
    for key, value in row["summary"].items():
        print(f"{key:>10}: {value}")
    print(f"wrote {run_dir / 'eval.json'}")


def run(args: argparse.Namespace) -> int:
    try:
        executor = executor_from_args(args, "eval")
    except ValueError as error:
        return fail("eval", error)
    params = dict(lengths=args.lengths, n=args.n, seed=args.seed, threshold=args.threshold, device=args.device)
    if len(args.run_dir) > 1 or executor is not None:
        refused = check_runs("eval", args.run_dir)
        if refused is not None:
            if executor is not None:
                executor.close()
            return refused
        return over_runs("eval", eval_job, args.run_dir, executor, params, show)
    from models.storage.paths import DirectoryLocked

    run_dir = args.run_dir[0]
    refused = check_run_free("eval", run_dir)
    if refused is not None:
        return refused
    try:
        row = evaluate_run(run_dir, **params)
    except (ValueError, TypeError, KeyError, OSError, DirectoryLocked) as error:
        return fail("eval", error)
    show(row, run_dir)
    return 0
