"""`interp sample-efficiency`: the N* / kappa study from flags (an n_star spec built for you).

    interp sample-efficiency --models lstm,transformer --tasks Z5 --formats outcome,acot \\
        --max-length 6 --out sweeps/se [--executor ray --workers 8]

Runs N* for every model x task x format at each length 2..L and jointly, then kappa and the joint
model's accuracy at 2L and 4L; writes the table, n_star.jsonl, kappa.jsonl and report.html.
The same study as a file: `interp sweep SPEC` with kind: n_star (see interp.sweep.spec).
"""

from __future__ import annotations

import argparse
import re

from interp.cli.args import (BATCH, LEARNING_RATE, ModelSize, count, length_count, real, seed_value, sequence_count,
                            step_count)
from interp.cli.sweep import add_executor_arguments, run_loaded


def names(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list; got {text!r}")
    return values


def numbers(each):
    """A comma-separated list of values of the Bounded type `each` (its limit applies to each)."""
    def parse(text: str) -> list:
        return [each(v) for v in names(text)]

    parse.limit = f"each {each.limit}"
    return parse


DATASET = count(1 << 30, "interp.training.preflight.BOUNDS' dataset_size: past it a typo")
VAL_THRESHOLD = real(0, 100, "a cross-entropy in nats: every trial starts below ln(vocab) < 16", low_open=True)


SPEC_FLAGS = {  # a word of the spec's error -> the flag that set it
    "models": "--models", "tasks": "--tasks", "formats": "--formats", "max_length": "--max-length",
    "lrs": "--lrs", "seeds": "--seeds", "steps": "--steps", "batch_size": "--batch-size", "val_size": "--val-size",
    "val_threshold": "--val-threshold", "n0": "--n0", "resolution": "--resolution", "n_max": "--n-max",
    "n_layers": "--n-layers", "model_options": "--n-layers",
}


def _flag_named(error: Exception) -> str:
    """The flags whose spec entries the spec's error names (the first of --models ... otherwise)."""
    named = [flag for word, flag in SPEC_FLAGS.items() if re.search(rf"\b{word}\b", str(error))]
    return "/".join(dict.fromkeys(named)) or "--models/--tasks/--formats"


def add_parser(sub) -> None:
    parser = sub.add_parser("sample-efficiency", help="N* and kappa for models x tasks x formats",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=names, default=["transformer", "lstm", "dense_ssm", "mamba"],
                        help="model presets, comma-separated (default transformer,lstm,dense_ssm,mamba)")
    parser.add_argument("--tasks", type=names, default=["Z5"], help="groups, e.g. Z5,S5 (default Z5)")
    parser.add_argument("--formats", type=names, default=["outcome", "cot", "acot"],
                        help="supervision formats (default outcome,cot,acot)")
    parser.add_argument("--max-length", type=length_count, required=True, help="L: lengths 2..L and joint")
    parser.add_argument("--lrs", type=numbers(LEARNING_RATE), default=[1e-3, 3e-3], help="learning rates (default 0.001,0.003)")
    parser.add_argument("--seeds", type=numbers(seed_value), default=[0, 1], help="seeds (default 0,1)")
    parser.add_argument("--steps", type=step_count, default=1000, help="step budget per trial (default 1000)")
    parser.add_argument("--batch-size", type=BATCH, default=32, help="sequences per step (default 32)")
    parser.add_argument("--val-size", type=sequence_count, default=256, help="validation sequences (default 256)")
    parser.add_argument("--val-threshold", type=VAL_THRESHOLD, default=0.01,
                        help="convergence: validation loss below this (default 0.01)")
    parser.add_argument("--n0", type=DATASET, default=16, help="first N of the geometric phase (default 16)")
    parser.add_argument("--resolution", type=real(0, 1, "a share of N*; the search takes [0, 1)", sanity=False), default=0.1, help="relative resolution of N* (default 0.1)")
    parser.add_argument("--n-max", type=DATASET, default=1 << 16, help="largest N tried (default 65536)")
    parser.add_argument("--n-layers", type=ModelSize("n_layers"), default=None, help="transformer depth (the seed: 6)")
    add_executor_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from interp.cli.args import fail
    from interp.sweep.spec import load_spec

    spec = {"kind": "n_star", "name": "sample-efficiency", "models": args.models, "tasks": args.tasks,
            "formats": args.formats, "max_length": args.max_length, "lrs": args.lrs, "seeds": args.seeds,
            "search": {"n0": args.n0, "resolution": args.resolution, "n_max": args.n_max},
            "train": {"steps": args.steps, "batch_size": args.batch_size, "val_size": args.val_size,
                      "val_threshold": args.val_threshold}}
    if args.n_layers is not None:
        spec["model_options"] = {"transformer": {"n_layers": args.n_layers}}
    try:
        loaded = load_spec(spec)
    except ValueError as error:
        return fail("sample-efficiency", f"argument {_flag_named(error)}: {error}")
    return run_loaded(loaded, args, "sample-efficiency")
