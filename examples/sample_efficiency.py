"""Does a model share one mechanism across sequence lengths? N* and kappa (arXiv 2602.18333).

For every model x format, N*_n is the fewest training sequences of length n from which some
configuration (lr x seed) reaches validation loss below a threshold on held-out sequences, and
N*_joint the same for one model trained on all lengths min..L in equal shares. kappa =
sum_n N*_n / N*_joint: > 1 means data of one length paid for the others (a shared, inductive
mechanism), ~1 isolated per-length solutions, < 1 interference. The seed reports kappa >> 1 for
RNNs under outcome and aligned CoT, kappa <= 1 for Transformers, and high kappa going with
accuracy beyond L (reported here at 2L and 4L).

    PYTHONPATH=. python examples/sample_efficiency.py --scale tiny --workers 2      # CPU, minutes
    PYTHONPATH=. python examples/sample_efficiency.py --scale paper --executor ray --address auto

The run is a sweep directory (--out): kill it and run the same command again to resume.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from interp.report.sample_efficiency import write_sample_efficiency_report
from interp.reproduce.sample_efficiency import spec as n_star_spec
from interp.sweep.executors import make_executor
from interp.sweep.run import run_spec
from interp.sweep.spec import load_spec

SCALES = {
    # CPU-feasible: Z5, lengths 3..5 (m^n = 125+ sequences per length: room for held-out data),
    # two models, the two formats the seed contrasts most; minutes on 2 cores.
    "tiny": dict(models=["lstm", "transformer"], tasks=["Z5"], formats=["outcome", "acot"], min_length=3,
                 max_length=5, lrs=[0.01], seeds=[0, 1], search={"n0": 32, "resolution": 0.25, "n_max": 512},
                 width=16, layers=2,
                 train={"steps": 400, "batch_size": 32, "val_size": 96, "eval_every": 50, "val_threshold": 0.05}),
    # a laptop hour or a few cluster minutes: every model and format, L = 6
    "small": dict(models=["transformer", "lstm", "dense_ssm", "mamba"], tasks=["Z5"],
                  formats=["outcome", "cot", "acot"], min_length=2, max_length=6, lrs=[3e-3, 1e-2],
                  seeds=[0, 1], search={"n0": 16, "resolution": 0.15}, width=32, layers=2,
                  train={"steps": 1500, "batch_size": 32, "val_size": 256, "eval_every": 50,
                         "val_threshold": 0.02}),
    # the seed's setting (a cluster): 6-layer GPT-2-style Transformer, Z_m and S5, L = 10
    "paper": dict(models=["transformer", "lstm", "dense_ssm", "mamba"], tasks=["Z5", "S5"],
                  formats=["outcome", "cot", "acot"], min_length=2, max_length=10, lrs=[1e-4, 3e-4, 1e-3],
                  seeds=[0, 1, 2], search={"n0": 64, "resolution": 0.1, "n_max": 1 << 20}, width=128, layers=6,
                  train={"steps": 20000, "batch_size": 64, "val_size": 1024, "eval_every": 250,
                         "val_threshold": 0.01}),
}


def study_spec(scale: str) -> dict:
    """The N* spec of one scale (the same builder as `interp reproduce sample-efficiency`)."""
    return n_star_spec(SCALES[scale], scale)


def show(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="tiny")
    parser.add_argument("--executor", choices=("local", "ray"), default="local")
    parser.add_argument("--workers", type=int, default=2, help="processes (local) or CPUs of a local Ray cluster")
    parser.add_argument("--address", default=None, help="ray: an existing cluster ('auto', 'ray://host:10001')")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=None, help="sweep directory (default sweeps/sample-efficiency-SCALE)")
    args = parser.parse_args()
    out = args.out or Path("sweeps") / f"sample-efficiency-{args.scale}"
    spec = load_spec(study_spec(args.scale))
    executor = make_executor(args.executor, args.workers, address=args.address, num_gpus=args.gpus_per_trial)
    started = time.perf_counter()
    try:
        outcome = run_spec(spec, executor, out)
    finally:
        executor.close()
    print(f"\n{len(outcome.rows)} trials ({sum(r['converged'] for r in outcome.rows)} converged) "
          f"in {time.perf_counter() - started:.0f} s; table {out / 'results.jsonl'}")
    lengths = list(range(spec.data["min_length"], spec.data["max_length"] + 1)) + ["joint"]
    print("\nN* (training sequences; '-': none converged up to the search's bound)")
    print(f"{'model':>12} {'task':>4} {'format':>8} " + " ".join(f"{str(n):>6}" for n in lengths))
    table = {}
    for result in outcome.n_star:
        c = result.condition
        table.setdefault((c["model"], c["task"], c["format"]), {})[c["length"]] = result.n_star
    for (model, task, fmt), by_length in table.items():
        print(f"{model:>12} {task:>4} {fmt:>8} " + " ".join(f"{show(by_length.get(n)):>6}" for n in lengths))
    print("\nkappa = sum_n N*_n / N*_joint, and the joint model's final-state accuracy beyond L")
    for row in outcome.kappa:
        ood = "  ".join(f"acc@{k[8:]} {show(v)}" for k, v in row.items() if k.startswith("ood_acc_"))
        bounds = f"[{show(row['kappa_low'])}, {show(row['kappa_high'])}]"
        print(f"{row['model']:>12} {row['task']:>4} {row['format']:>8}  kappa {show(row['kappa']):>6} "
              f"bounds {bounds:>14}  {ood}")
    report = write_sample_efficiency_report(out / "report.html", [r.row() for r in outcome.n_star], outcome.kappa,
                                            outcome.rows, notes=f"Scale {args.scale!r}: {spec.data}")
    print(f"\nreport: {report}")


if __name__ == "__main__":
    main()
