"""The `interp` command (one module per subcommand; `args` holds the shared argument types): train and evaluate runs, analyse them, and the main job `interp demo`.

    interp demo [--out DIR] [--quick]
    interp train --model tanh_rnn --task S3 --train-length 60 --steps N --out runs/x
    interp eval runs/x [runs/y ...] --lengths 60,100,200,500,1000
    interp heads runs/x [runs/y ...] [--n 256] [--impl triton]     per-head analysis of DeltaNet runs
    interp drift runs/x [runs/y ...] [--lengths 60,...,1000] [--out report.html]   U, q(t), Tcross, contraction, mp
    interp patch runs/ar [--method both|exact|attribution] [--hooks ...] [--positions all|key,value,query]
    interp sweep spec.yaml --out sweeps/x [--executor local|ray] [--workers N]   grid or N* study, resumable
    interp sample-efficiency --models lstm,transformer --tasks Z5 --max-length 6 --out sweeps/se
    interp reproduce NAME [--scale cpu|medium|paper] [--device D] [--out DIR] [--quick]   one report per seed claim

eval, drift, heads and reproduce take --executor local|ray [--workers N] [--address A]: one job per
run directory (or per run to train) on worker processes or a Ray cluster (docs/scaling-runs.md).
"""

from __future__ import annotations

import argparse
import sys

from interp.cli import circuit, demo, drift, eval as eval_command, heads, patch, reproduce, sample_efficiency, sweep, train
from interp.cli.args import HelpFormatter, Parser

SUBCOMMANDS = (demo, train, eval_command, heads, drift, patch, circuit, sweep, sample_efficiency, reproduce)  # each: add_parser(sub), run(args) -> exit status


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="interp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    for subparser in sub.choices.values():
        subparser.formatter_class = HelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
