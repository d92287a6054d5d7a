"""`interp eval RUN_DIR`: final-state accuracy by length and mp of a trained run (RUN_DIR/eval.json,
written under the run directory's lock: models.paths.locked)."""

from __future__ import annotations

import argparse
from pathlib import Path

from interp.cli.args import (check_run_free, check_workload, device_name, fail, fraction, length_list,
                            non_negative_int, positive_int, run_directory)


def add_parser(sub) -> None:
    ev = sub.add_parser("eval", help="accuracy by length and mp of a trained run",
                        description="Evaluate a run directory: final-state accuracy at each length, "
                                    "mp, written to RUN_DIR/eval.json.")
    ev.add_argument("run_dir", type=run_directory, help="a run directory written by `interp train`")
    ev.add_argument("--lengths", type=length_list, default=[60, 100, 200, 500, 1000],
                    help="comma-separated lengths (default 60,100,200,500,1000)")
    ev.add_argument("--n", type=positive_int, default=256, help="sequences per length")
    ev.add_argument("--seed", type=non_negative_int, default=1, help="evaluation seed")
    ev.add_argument("--threshold", type=fraction, default=0.9, help="mp accuracy threshold")
    ev.add_argument("--device", type=device_name, default="cpu", help="torch device")
    ev.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import models
    from interp.training import checkpoint as ckpt
    from interp.training.evaluate import evaluate_lengths
    from interp.report.evaluation import mp_rows
    from interp.tasks import make_task
    from models.paths import DirectoryLocked, inside, locked

    refused = check_run_free("eval", args.run_dir)
    if refused is not None:
        return refused
    try:
        config = ckpt.read_config(args.run_dir)
        task = make_task(config["task"]["name"], **config["task"].get("options", {}))
        check_workload(task, args.n, max(args.lengths), "--n", "--lengths")
        model = models.load(args.run_dir, device=args.device)
        result = evaluate_lengths(model, task, args.lengths, n=args.n, seed=args.seed,
                                  threshold=args.threshold, device=args.device)
        with locked(args.run_dir, "run directory"):
            ckpt.write_json(inside(args.run_dir, "eval.json"), result.to_dict())
    except (ValueError, TypeError, KeyError, OSError, DirectoryLocked) as error:
        return fail("eval", error)
    row = mp_rows({config["model"]["mixer"]: result}, args.threshold)[0]
    for key, value in row.items():
        print(f"{key:>10}: {value}")
    print(f"wrote {args.run_dir / 'eval.json'}")
    return 0
