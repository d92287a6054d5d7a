"""The `interp` command: train and evaluate runs, analyse them, and the main job `interp demo`.

    interp demo [--out DIR] [--quick]
    interp train --model tanh_rnn --task S3 --train-length 60 --steps N --out runs/x
    interp eval runs/x --lengths 60,100,200,500,1000
    interp heads runs/x [--n 256] [--impl triton]     per-head analysis of a DeltaNet run
    interp drift runs/x [--lengths 60,...,1000] [--out report.html]   U, q(t), Tcross, contraction, mp
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path


def checked_number(parse, allowed, what: str):
    """An argparse type: parse the text, keep it if allowed(value), else name what is allowed."""

    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not allowed(value):
            raise argparse.ArgumentTypeError(f"must be {what}; got {text!r}")
        return value

    return check


positive_int = checked_number(int, lambda v: v >= 1, "a positive integer")
non_negative_int = checked_number(int, lambda v: v >= 0, "a non-negative integer")
positive_float = checked_number(float, lambda v: 0 < v < float("inf"), "a positive finite number")
non_negative_float = checked_number(float, lambda v: 0 <= v < float("inf"), "a non-negative finite number")
fraction = checked_number(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")


def length_list(text: str) -> list[int]:
    """'60,100,200' -> [60, 100, 200] (positive, comma-separated)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated positive integers like 60,100,200; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers like 60,100,200; got {text!r}")
    return sorted(set(values))


def model_name(text: str) -> str:
    import models

    names = models.list_models()
    if text not in names:
        close = difflib.get_close_matches(text, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"unknown model {text!r}{hint}; choose from {', '.join(names)}")
    return text


MODEL_OVERRIDES = {  # flag -> (ModelConfig field, type, help)
    "--d-model": ("d_model", positive_int, "residual width"),
    "--n-layers": ("n_layers", positive_int, "number of blocks"),
    "--d-hidden": ("d_hidden", positive_int, "recurrent width of RNN mixers"),
    "--d-state": ("d_state", positive_int, "SSM state size per channel"),
    "--n-heads": ("n_heads", positive_int, "number of heads"),
    "--expand": ("expand", positive_int, "inner width factor of gated mixers"),
    "--d-conv": ("d_conv", positive_int, "short convolution width"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="interp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_train(sub)
    _add_eval(sub)
    _add_heads(sub)
    _add_drift(sub)
    return parser


def _add_demo(sub) -> None:
    demo = sub.add_parser(
        "demo", help="the main job: tanh RNN vs Mamba on S3, accuracy by length, HTML report",
        description="Train a tanh RNN and a Mamba model on the S3 word problem (acot, length 60), "
                    "evaluate both at lengths up to 1000, write an offline HTML report and print a "
                    "summary. Under 5 minutes on 2 CPU cores. Re-running with the same --out reuses "
                    "finished runs.")
    demo.add_argument("--out", type=Path, default=None,
                      help="output directory (default runs/demo, or runs/demo-quick with --quick)")
    demo.add_argument("--quick", action="store_true", help="toy sizes, tens of seconds (a smoke test)")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    demo.set_defaults(func=_demo)


def _add_train(sub) -> None:
    train = sub.add_parser("train", help="train a model on a task into a run directory",
                           description="Train a model on a task; writes config.json, model.safetensors, "
                                       "optimizer state and metrics.jsonl to --out.")
    train.add_argument("--model", type=model_name, required=True, help="model preset (see models.list_models())")
    train.add_argument("--task", required=True, help="task spec, e.g. S3, C2, A4xZ5, AR")
    train.add_argument("--format", default=None, choices=("outcome", "acot", "cot"),
                       help="supervision format of group word problems (default acot)")
    train.add_argument("--train-length", type=positive_int, default=60, help="training sequence length")
    train.add_argument("--steps", type=positive_int, required=True, help="optimizer steps")
    train.add_argument("--out", type=Path, required=True, help="run directory to create (or resume)")
    train.add_argument("--batch-size", type=positive_int, default=64)
    train.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate")
    train.add_argument("--weight-decay", type=non_negative_float, default=0.01)
    train.add_argument("--warmup", type=non_negative_int, default=None,
                       help="warmup steps (default min(50, steps // 10))")
    train.add_argument("--grad-clip", type=positive_float, default=1.0)
    train.add_argument("--seed", type=non_negative_int, default=0)
    train.add_argument("--curriculum", action="store_true",
                       help="length curriculum: start at 2, double after k evaluations at >= 95%%")
    train.add_argument("--eval-every", type=positive_int, default=25)
    train.add_argument("--checkpoint-every", type=positive_int, default=500)
    train.add_argument("--device", default="cpu")
    train.add_argument("--resume", action="store_true", help="continue the run in --out (configs must match)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    for flag, (_, kind, text) in MODEL_OVERRIDES.items():
        train.add_argument(flag, type=kind, default=None, help=f"model override: {text}")
    train.set_defaults(func=_train)


def _add_heads(sub) -> None:
    from interp.heads_cli import add_parser  # implementation: interp.heads (issue 7)

    add_parser(sub)


def _add_drift(sub) -> None:
    from interp.drift_cli import add_parser  # implementation: interp.error_control (issue 6)

    add_parser(sub)


def _add_eval(sub) -> None:
    ev = sub.add_parser("eval", help="accuracy by length and mp of a trained run",
                        description="Evaluate a run directory: final-state accuracy at each length, "
                                    "mp, written to RUN_DIR/eval.json.")
    ev.add_argument("run_dir", type=Path, help="a run directory written by `interp train`")
    ev.add_argument("--lengths", type=length_list, default=[60, 100, 200, 500, 1000],
                    help="comma-separated lengths (default 60,100,200,500,1000)")
    ev.add_argument("--n", type=positive_int, default=256, help="sequences per length")
    ev.add_argument("--seed", type=non_negative_int, default=1, help="evaluation seed")
    ev.add_argument("--threshold", type=fraction, default=0.9, help="mp accuracy threshold")
    ev.add_argument("--device", default="cpu")
    ev.set_defaults(func=_eval)


def _fail(command: str, error: Exception) -> int:
    print(f"interp {command}: error: {error}", file=sys.stderr)
    return 2


def _demo(args: argparse.Namespace) -> int:
    from interp.demo import run_demo

    out = args.out or Path("runs/demo-quick" if args.quick else "runs/demo")
    try:
        run_demo(out, quick=args.quick, progress=not args.no_progress)
    except (ValueError, FileExistsError) as error:
        return _fail("demo", error)
    return 0


def _train(args: argparse.Namespace) -> int:
    import models
    from interp.tasks import make_task
    from interp.train import TrainConfig, train

    options = {"format": args.format} if args.format else {}
    try:
        task = make_task(args.task, **options)
    except (ValueError, TypeError) as error:
        return _fail("train", f"argument --task{'/--format' if args.format else ''}: {error}")
    overrides = {field: getattr(args, flag[2:].replace("-", "_"))
                 for flag, (field, _, _) in MODEL_OVERRIDES.items()}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    warmup = args.warmup if args.warmup is not None else min(50, args.steps // 10)
    try:
        model_config = models.preset_config(args.model, vocab_size=task.vocab_size, **overrides)
        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          weight_decay=args.weight_decay, warmup=warmup, grad_clip=args.grad_clip,
                          train_length=args.train_length, curriculum=args.curriculum,
                          eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
                          seed=args.seed, device=args.device)
        result = train(model_config, task, cfg, args.out, resume=args.resume, progress=not args.no_progress,
                       label=args.model)
    except (ValueError, TypeError, FileExistsError, RuntimeError) as error:
        return _fail("train", error)
    last = [r for r in result.metrics if r["kind"] == "eval"]
    tail = f"; eval accuracy {last[-1]['accuracy']:.3f} at length {last[-1]['length']}" if last else ""
    print(f"trained {args.model} on {task.name} for {result.step} steps in {result.seconds:.1f} s{tail}; "
          f"run directory {args.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import models
    from interp import checkpoint as ckpt
    from interp.evaluate import evaluate_lengths
    from interp.figures import mp_rows
    from interp.tasks import make_task

    try:
        config = ckpt.read_config(args.run_dir)
        task = make_task(config["task"]["name"], **config["task"].get("options", {}))
        model = models.load(args.run_dir, device=args.device)
        result = evaluate_lengths(model, task, args.lengths, n=args.n, seed=args.seed,
                                  threshold=args.threshold, device=args.device)
        ckpt.write_json(args.run_dir / "eval.json", result.to_dict())
    except (ValueError, TypeError, FileNotFoundError) as error:
        return _fail("eval", error)
    row = mp_rows({config["model"]["mixer"]: result}, args.threshold)[0]
    for key, value in row.items():
        print(f"{key:>10}: {value}")
    print(f"wrote {args.run_dir / 'eval.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
