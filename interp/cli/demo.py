"""The main job (`interp demo`): length generalisation of a tanh RNN and Mamba on S3.

Trains a tanh RNN and a Mamba model on the S3 word problem (aligned chain of thought, length
curriculum up to length 60), evaluates the final-state accuracy of both at lengths up to 1000,
and writes one self-contained HTML report (accuracy vs length, training curves, an mp table)
plus a printed summary. Sized to finish in under 5 minutes on 2 CPU cores; `quick=True` is a
tens-of-seconds smoke run with the same steps at toy sizes (its numbers mean nothing).

The seed's headline (seed 000; docs/drift.md): a state-dependent model (tanh RNN) stays above 90% up
to length 1000, while affine models such as Mamba fall off past the training length. The report
states what was measured.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interp.cli.args import check_out, fail, output_path

if TYPE_CHECKING:  # the heavy imports happen inside the functions, so `interp --help` stays fast
    from interp.training.evaluate import LengthEval
    from interp.training.train import TrainConfig, TrainResult

TASK, FORMAT, TRAIN_LENGTH = "S3", "acot", 60
THRESHOLD = 0.9


def add_parser(sub) -> None:
    demo = sub.add_parser(
        "demo", help="the main job: tanh RNN vs Mamba on S3, accuracy by length, HTML report",
        description="Train a tanh RNN and a Mamba model on the S3 word problem (acot, length 60), "
                    "evaluate both at lengths up to 1000, write an offline HTML report and print a "
                    "summary. Under 5 minutes on 2 CPU cores. Re-running with the same --out reuses "
                    "finished runs.")
    demo.add_argument("--out", type=output_path, default=None,
                      help="output directory (default runs/demo, or runs/demo-quick with --quick)")
    demo.add_argument("--quick", action="store_true", help="toy sizes, tens of seconds (a smoke test)")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from models.storage.paths import DirectoryLocked

    out = args.out or Path("runs/demo-quick" if args.quick else "runs/demo")
    refused = check_out("demo", out)
    if refused is not None:
        return refused
    try:
        run_demo(out, quick=args.quick, progress=not args.no_progress)
    except (ValueError, FileExistsError, DirectoryLocked) as error:
        return fail("demo", error)
    except OSError as error:   # a directory the preflight could not foresee failing (a read-only file system)
        return fail("demo", f"argument --out: {error}")
    return 0


@dataclass
class DemoPlan:
    """What the demo trains and evaluates: {model preset: (model overrides, TrainConfig)}."""

    models: dict[str, tuple[dict[str, Any], TrainConfig]]
    lengths: list[int]
    eval_n: int
    label: str = "full"
    notes: list[str] = field(default_factory=list)


def plan(quick: bool = False) -> DemoPlan:
    """The demo's models and schedules: the full job (under 5 minutes) or the --quick smoke run."""
    from interp.training.train import TrainConfig

    if quick:
        common = dict(train_length=TRAIN_LENGTH, curriculum=True, eval_every=10, eval_size=32,
                      log_every=5, warmup=5, checkpoint_every=1000)
        return DemoPlan(
            models={
                "tanh_rnn": ({"d_model": 16}, TrainConfig(steps=40, batch_size=16, lr=3e-3, **common)),
                "mamba": ({"d_model": 8, "d_state": 4}, TrainConfig(steps=20, batch_size=8, lr=3e-3, **common)),
            },
            lengths=[60, 200, 1000], eval_n=16, label="quick")
    common = dict(train_length=TRAIN_LENGTH, curriculum=True, eval_every=25, eval_size=256,
                  log_every=10, warmup=50, checkpoint_every=250)
    return DemoPlan(
        models={
            "tanh_rnn": ({"d_model": 64}, TrainConfig(steps=1200, batch_size=64, lr=3e-3, **common)),
            "mamba": ({"d_model": 32, "d_state": 8, "n_layers": 2},
                      TrainConfig(steps=800, batch_size=32, lr=3e-3, **common)),
        },
        lengths=[60, 100, 200, 500, 1000], eval_n=256)


def run_demo(out: str | Path, quick: bool = False, progress: bool = True, echo=print,
             threads: int | None = 1) -> dict[str, Any]:
    """Train, evaluate and report; returns the summary (also written to out/summary.json).

    threads: torch intra-op threads for the run (None keeps the current setting). One thread is
    the default: the demo's models are small and sequential, so a second thread buys little, and
    busy-waiting worker threads slow everything down on a shared machine.
    """
    import torch

    import models
    from interp.tasks import make_task
    from interp.training import checkpoint as ckpt
    from interp.training.evaluate import evaluate_lengths
    from interp.training.train import train

    if threads is not None:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    demo = plan(quick)
    task = make_task(TASK, format=FORMAT)
    runs: dict[str, TrainResult] = {}
    evals: dict[str, LengthEval] = {}
    timings: dict[str, dict[str, float]] = {}
    for name, (overrides, cfg) in demo.models.items():
        model_config = models.preset_config(name, vocab_size=task.vocab_size, **overrides)
        echo(f"[{name}] training {cfg.steps} steps on {TASK} {FORMAT} (curriculum to length {TRAIN_LENGTH}) ...")
        t0 = time.perf_counter()
        runs[name] = train(model_config, task, cfg, out / name, resume=True, progress=progress, label=name)
        t1 = time.perf_counter()
        evals[name] = evaluate_lengths(runs[name].model, task, demo.lengths, n=demo.eval_n, seed=cfg.seed + 1,
                                       threshold=THRESHOLD)
        t2 = time.perf_counter()
        ckpt.write_json(out / name / "eval.json", evals[name].to_dict())
        timings[name] = {"train_s": round(t1 - t0, 2), "eval_s": round(t2 - t1, 2)}
        echo(f"[{name}] trained in {t1 - t0:.1f} s, evaluated in {t2 - t1:.1f} s; mp = {evals[name].mp}")

    report = write_demo_report(out / "report.html", demo, runs, evals, timings)
    summary = {
        "task": {"name": TASK, "format": FORMAT, "train_length": TRAIN_LENGTH}, "mode": demo.label,
        "threshold": THRESHOLD, "lengths": demo.lengths, "eval_n": demo.eval_n,
        "models": {name: {"mp": evals[name].mp,
                          "accuracy": {str(t): evals[name].final_accuracy[t] for t in demo.lengths},
                          "parameters": sum(p.numel() for p in runs[name].model.parameters()),
                          "steps": runs[name].step, "reached_length": runs[name].final_length,
                          **timings[name]} for name in demo.models},
        "report": str(report), "wall_s": round(time.perf_counter() - started, 2),
    }
    ckpt.write_json(out / "summary.json", summary)
    echo(format_summary(summary))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    lengths = summary["lengths"]
    header = (f"{'model':<10} {'mp':>6} " + " ".join(f"{'acc@' + str(t):>9}" for t in lengths)
              + f" {'reached':>8} {'train s':>8}")
    lines = [f"S3 {summary['task']['format']}, trained at length {summary['task']['train_length']} "
             f"({summary['mode']} demo); final-state accuracy on {summary['eval_n']} sequences per length",
             header]
    for name, row in summary["models"].items():
        mp = row["mp"] if row["mp"] is not None else "none"
        accs = " ".join(f"{row['accuracy'][str(t)]:>9.3f}" for t in lengths)
        lines.append(f"{name:<10} {mp!s:>6} {accs} {row['reached_length']:>8} {row['train_s']:>8.1f}")
    lines.append("reached: the training length the curriculum had reached at the end (the target is "
                 f"{summary['task']['train_length']})")
    lines.append(f"report: {summary['report']}   wall time: {summary['wall_s']:.1f} s")
    return "\n".join(lines)


def write_demo_report(path: Path, demo: DemoPlan, runs: dict[str, TrainResult],
                      evals: dict[str, LengthEval], timings: dict[str, dict[str, float]]) -> Path:
    from interp.report.demo import write_demo_report as write

    return write(path, demo, runs, evals, timings, task=TASK, fmt=FORMAT, train_length=TRAIN_LENGTH,
                 threshold=THRESHOLD)
