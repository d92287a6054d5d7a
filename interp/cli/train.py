"""`interp train`: train a model on a task into a run directory (resumable bit for bit)."""

from __future__ import annotations

import argparse
import dataclasses
import re

from interp.cli.args import (BATCH, LEARNING_RATE, MAX_LENGTH, MAX_STEPS, WHY_LENGTH, WHY_STEPS, ModelSize, count,
                            device_name, fail, model_name, output_path, real, seed_value, step_count, task_spec)

TRAIN_LENGTH = count(MAX_LENGTH, WHY_LENGTH, name="train_length")
WARMUP = count(MAX_STEPS, WHY_STEPS, low=0)
WEIGHT_DECAY = real(0, 10, "AdamW scales each matrix by 1 - lr * weight_decay a step; recipes use 0 to 0.1")
GRAD_CLIP = real(0, 1e6, "recipes clip at 0.5 to 5; 1e6 turns clipping off in practice", low_open=True)

MODEL_OVERRIDES = {  # flag -> (ModelConfig field, type, help)
    "--d-model": ("d_model", ModelSize("d_model"), "residual width"),
    "--n-layers": ("n_layers", ModelSize("n_layers"), "number of blocks"),
    "--d-hidden": ("d_hidden", ModelSize("d_hidden"), "recurrent width of RNN mixers"),
    "--d-state": ("d_state", ModelSize("d_state"), "SSM state size per channel"),
    "--n-heads": ("n_heads", ModelSize("n_heads"), "number of heads"),
    "--expand": ("expand", ModelSize("expand"), "inner width factor of gated mixers"),
    "--d-conv": ("d_conv", ModelSize("d_conv"), "short convolution width"),
}


def add_parser(sub) -> None:
    train = sub.add_parser("train", help="train a model on a task into a run directory",
                           description="Train a model on a task; writes config.json, metrics.jsonl and "
                                       "crash-safe checkpoints (weights, optimizer state) to --out.")
    train.add_argument("--model", type=model_name, required=True, help="model preset: {models}")
    train.add_argument("--task", type=task_spec, required=True, help="task spec: {tasks}")
    train.add_argument("--format", default=None, choices=("outcome", "acot", "cot"),
                       help="supervision of group word problems: the final state only, the state at "
                            "every step, or chain of thought (default acot)")
    train.add_argument("--train-length", type=TRAIN_LENGTH, default=60, help="training sequence length")
    train.add_argument("--steps", type=step_count, required=True,
                       help="optimizer steps; with --resume, a larger number extends a finished run "
                            "(the remaining steps follow the cosine of the new total)")
    train.add_argument("--out", type=output_path, required=True, help="run directory to create (or resume)")
    train.add_argument("--batch-size", type=BATCH, default=64, help="sequences per step")
    train.add_argument("--lr", type=LEARNING_RATE, default=3e-3, help="peak learning rate")
    train.add_argument("--weight-decay", type=WEIGHT_DECAY, default=0.01, help="AdamW weight decay of matrices")
    train.add_argument("--warmup", type=WARMUP, default=None,
                       help="warmup steps (default min(50, steps // 10); with --resume the run's own)")
    train.add_argument("--grad-clip", type=GRAD_CLIP, default=1.0, help="gradient norm clip")
    train.add_argument("--seed", type=seed_value, default=0, help="seed of weights and data")
    train.add_argument("--curriculum", action="store_true",
                       help="length curriculum: start at 2, double after k evaluations at >= 95%%")
    train.add_argument("--eval-every", type=step_count, default=25, help="steps between evaluations")
    train.add_argument("--checkpoint-every", type=step_count, default=500,
                       help="steps between checkpoints (and one at the end)")
    train.add_argument("--device", type=device_name, default="cpu", help="torch device")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out (the configs must match, but for a larger --steps)")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    for flag, (_, kind, text) in MODEL_OVERRIDES.items():
        train.add_argument(flag, type=kind, default=None, help=f"model override: {text} (default: the preset's)")
    train.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import models
    from interp.tasks import make_task
    from interp.training.preflight import Refused, check_override_bounds
    from interp.training.train import TrainConfig, train

    options = {"format": args.format} if args.format else {}
    try:
        task = make_task(args.task, **options)
    except (ValueError, TypeError) as error:
        return fail("train", f"argument --task{'/--format' if args.format else ''}: {error}")
    overrides = {field: getattr(args, flag[2:].replace("-", "_"))
                 for flag, (field, _, _) in MODEL_OVERRIDES.items()}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    warmup = args.warmup if args.warmup is not None else _resumed_warmup(args)
    warmup = min(50, args.steps // 10) if warmup is None else warmup
    try:
        check_override_bounds(overrides)
        model_config = models.preset_config(args.model, vocab_size=task.vocab_size, **overrides)
    except Refused as error:
        return fail("train", f"argument {_flag_of(error.field)}: {error}")
    except (ValueError, TypeError) as error:
        given = {field: flag for flag, (field, _, _) in MODEL_OVERRIDES.items() if field in overrides}
        return fail("train", _naming_flags(error, given, "--model"))
    try:
        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                          weight_decay=args.weight_decay, warmup=warmup, grad_clip=args.grad_clip,
                          train_length=args.train_length, curriculum=args.curriculum,
                          eval_every=args.eval_every, checkpoint_every=args.checkpoint_every,
                          seed=args.seed, device=args.device)
    except (ValueError, TypeError) as error:
        fields = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)}
        return fail("train", _naming_flags(error, fields, "--steps"))
    try:
        result = train(model_config, task, cfg, args.out, resume=args.resume, progress=not args.no_progress,
                       label=args.model)
    except Refused as error:
        return fail("train", f"argument {_flag_of(error.field)}: {error}")
    except (ValueError, TypeError, FileExistsError, RuntimeError) as error:
        return fail("train", error)
    except OSError as error:
        return fail("train", f"argument --out: {error}")
    last = [r for r in result.metrics if r["kind"] == "eval"]
    tail = f"; eval accuracy {last[-1]['accuracy']:.3f} at length {last[-1]['length']}" if last else ""
    print(f"{_what_was_trained(args.model, task.name, result)}{tail}; run directory {args.out}")
    return 0


def _what_was_trained(model: str, task: str, result) -> str:
    """What this call trained: a fresh run's steps, or a resumed run's start, steps run and total."""
    ran, seconds = result.step - result.start_step, f"{result.seconds:.1f} s"
    if result.start_step == 0:
        return f"trained {model} on {task} for {result.step} steps in {seconds}"
    if ran == 0:
        return f"{model} on {task} was already trained for {result.step} steps; nothing to resume"
    return (f"resumed {model} on {task} at step {result.start_step} and trained {ran} more steps in {seconds} "
            f"({result.step} in all)")


def _flag_of(field: str) -> str:
    """The flag that sets a preflight field ("train.batch_size" -> --batch-size, "model.n_layers" ->
    --n-layers; a model field without a flag: --model)."""
    section, _, name = field.rpartition(".")
    if section == "model":
        return next((flag for flag, (f, _, _) in MODEL_OVERRIDES.items() if f == name), "--model")
    return "--" + name.replace("_", "-")


def _naming_flags(error: Exception, flags: dict[str, str], otherwise: str) -> str:
    """`argument --flag[/--other]: error` for the flags whose config field the message names."""
    named = [flag for field, flag in flags.items() if re.search(rf"\b{field}\b", str(error))]
    return f"argument {'/'.join(named or [otherwise])}: {error}"


def _resumed_warmup(args: argparse.Namespace) -> int | None:
    """The warmup of the run being resumed (so that --resume --steps N keeps it), else None."""
    from interp.training import checkpoint as ckpt

    if not args.resume:
        return None
    try:   # anything wrong with the run is named when train() opens it
        return ckpt.read_config(args.out)["train"].get("warmup")
    except (ValueError, OSError, AttributeError, TypeError):
        return None
