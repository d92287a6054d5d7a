"""The `interp` command. Subcommands are added by their issues; `demo` is the main job."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the main job (placeholder: a forward pass of every model)")
    demo.set_defaults(func=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    import torch

    import models

    tokens = torch.randint(0, 8, (2, 16))
    for name in models.list_models():
        model = models.build(name, vocab_size=8)
        logits, cache = model.run_with_cache(tokens)
        print(f"{name:>20}: logits {tuple(logits.shape)}, {len(cache)} hooks cached")
    print("(placeholder demo: training and the report come with the tasks-and-training issue)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
