"""`interp reproduce NAME [--scale cpu|medium|paper] [--device ...] [--out DIR] [--quick] [--no-train]
[--results DIR] [--executor local|ray --workers N --address A]`: one report per seed claim.

The committed runs (--results, default results/reproduce/NAME-SCALE) are checked against their manifests
before they are used: an edited file is refused in one line naming it (interp.reproduce.manifest).

With --executor the runs to train (neither committed nor finished) are trained first as jobs, one per
run, on worker processes (local) or a Ray cluster (ray), each in OUT/runs/<label> and resumable as
without it; then the measurements, claims and report are made here, as in one process
(docs/scaling-runs.md)."""

from __future__ import annotations

import argparse
import os

from interp.cli.args import add_scale_out_arguments, check_out, executor_from_args, fail, output_path

# The reproductions whose SCALE defines "medium", stated here because the claim modules import torch
# and the command parses its arguments first (tests/test_cli_reproduce.py keeps it equal to
# interp.reproduce.engine.claim_scales).
MEDIUM = ("error-control", "retrieval", "reveal-gap", "sample-efficiency")


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="reproduce one seed claim (train, measure, claim table, report)",
                       description="Train the runs a seed claim needs (finished runs are reused, interrupted "
                                   "ones resume), measure, and write OUT/report.html with a 'claim | what was "
                                   "measured | verdict' table. Names: {reproductions}. With --executor the runs "
                                   "to train are trained first as parallel jobs, one per run, then measured here "
                                   "(docs/scaling-runs.md).")
    p.add_argument("name", metavar="NAME", help="the reproduction: {reproductions}")
    p.add_argument("--scale", default="cpu", metavar="SCALE",
                   help="cpu (about 30 minutes on 2 cores), medium (only " + ", ".join(MEDIUM) + ": the runs a "
                        "claim rests on at the source paper's size, CPU hours) or paper (the seeds' sizes; for a "
                        "GPU); default cpu")
    p.add_argument("--quick", action="store_true", help="toy sizes in seconds (a smoke test; numbers mean nothing)")
    p.add_argument("--device", default="cpu", help="torch device for training and measurement (default cpu)")
    p.add_argument("--out", type=output_path, default=None, help="output directory (default runs/reproduce/NAME-SCALE)")
    p.add_argument("--no-progress", action="store_true", help="hide the per-run progress bars")
    p.add_argument("--keep-unfinished", action="store_true",
                   help="after every chunk of an early-stopped run, copy its checkpoint into "
                        "results/reproduce/NAME-SCALE/unfinished/ so that another session resumes it")
    p.add_argument("--no-train", action="store_true",
                   help="train nothing: build the report from the runs and sweep rows committed under "
                        "results/reproduce/NAME-SCALE/ and the finished runs in OUT, listing what is not trained yet "
                        "(claims that need it read 'inconclusive')")
    p.add_argument("--results", type=output_path, default=None, metavar="DIR",
                   help="the committed runs to load instead of training (default results/reproduce/NAME-SCALE); "
                        "each is checked against its manifest.json and refused, naming the file, when edited")
    add_scale_out_arguments(p, unit="training run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from interp.reproduce import names, reproduce
    from interp.reproduce.engine import SCALES, TrainingFailed
    from models.storage.paths import DirectoryLocked

    if args.name not in names():
        return fail("reproduce", f"argument NAME: unknown reproduction {args.name!r}; choose from {', '.join(names())}")
    allowed = [s for s in SCALES if s != "quick"]
    if args.scale not in allowed:
        return fail("reproduce", f"argument --scale: {args.scale!r} is not a scale; choose from {', '.join(allowed)} "
                                 "(or --quick for a smoke run)")
    scale = "quick" if args.quick else args.scale
    refused = check_out("reproduce", args.out) if args.out is not None else None
    if refused is not None:
        return refused
    if args.results is not None and not os.path.isdir(args.results):   # never raises (a name too long)
        return fail("reproduce", f"argument --results: {str(args.results)[:200]!r} is not a directory")
    try:
        executor = executor_from_args(args, "reproduce")
    except ValueError as error:
        return fail("reproduce", error)
    try:
        report = reproduce(args.name, scale, args.out, args.device, progress=not args.no_progress,
                           keep_unfinished=args.keep_unfinished, train=not args.no_train, executor=executor,
                           results=args.results)
    except (ValueError, TypeError, DirectoryLocked, TrainingFailed) as error:
        return fail("reproduce", error)
    except OSError as error:   # a directory the preflight could not foresee failing (a read-only file system)
        return fail("reproduce", f"argument --out: {error}")
    finally:
        if executor is not None:
            executor.close()
    print(f"wrote {report}")
    return 0
