"""Sweep executors side by side: a 16-trial tiny sweep on local 1 worker, local 2 workers, Ray 2 CPUs.

    python benchmarks/sweep.py [--trials 16] [--rounds 2] [--steps 40]

Each trial is a real finite-data training run (`train_trial`: LSTM d_model 8 on Z3 acot, length 4,
N = 32, `--steps` steps), each sweep a fresh directory and a fresh executor, so its wall time
includes starting the worker processes (the pool's spawns, or ray.init and Ray's workers) and
shutting them down. Reported per contender (median over rounds; the contenders run interleaved,
in rotated order, within each round):

    trials/s           trials / wall
    trial s            mean time inside the trial function (measured in the worker)
    overhead s/trial   (wall * slots - sum of trial times) / trials: every slot-second not spent in a
                       trial (process start and imports, scheduling, result transport, idle tails)

The machine's load average is printed with every round: other jobs share the cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import models  # noqa: F401  (imported before a worker's timer starts: import time is overhead)
from interp.analysis import sample_efficiency as se
from interp.sweep.executors import make_executor
from interp.sweep.run import Sweep
from interp.training import train as _train  # noqa: F401


def timed_trial(params, run_dir):
    started = time.perf_counter()
    row = se.train_trial(params, run_dir)
    row["wall_seconds"] = time.perf_counter() - started
    return row


def trials(count: int, steps: int) -> list[dict]:
    [condition] = [c for c in se.conditions(["lstm"], ["Z3"], ["acot"], 4, model_options={"lstm": {"d_model": 8}},
                                            train={"steps": steps, "batch_size": 8, "val_size": 16,
                                                   "eval_every": steps, "warmup": 2})
                   if c["length"] == 4]
    return [{**condition, "n": 32, "lr": 1e-2, "seed": seed} for seed in range(count)]


def run_once(name: str, workers: int, jobs: list[dict]) -> dict:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        executor = make_executor(name, workers)
        try:
            sweep = Sweep(out, executor, timed_trial, progress=False)
            rows = sweep(jobs)
        finally:
            executor.close()
        wall = time.perf_counter() - started
    if len(rows) != len(jobs):
        raise RuntimeError(f"{name}: {len(jobs) - len(rows)} trials failed: {sweep.failures[:1]}")
    busy = sum(r["wall_seconds"] for r in rows)
    return {"wall": wall, "rate": len(rows) / wall, "trial": busy / len(rows),
            "overhead": (wall * workers - busy) / len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    contenders = [("local", 1), ("local", 2), ("ray", 2)]
    jobs = trials(args.trials, args.steps)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; {args.trials} trials of "
          f"{args.steps} steps; {args.rounds} rounds")
    results: dict[tuple[str, int], list[dict]] = {c: [] for c in contenders}
    for round_index in range(args.rounds):
        order = contenders[round_index % 3:] + contenders[:round_index % 3]
        for name, workers in order:
            result = run_once(name, workers, jobs)
            results[(name, workers)].append(result)
            print(f"round {round_index}: {name} x{workers}: wall {result['wall']:.1f} s, {result['rate']:.2f} trials/s, "
                  f"trial {result['trial']:.2f} s, overhead {result['overhead']:.2f} s/trial; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    base = statistics.median(r["rate"] for r in results[("local", 1)])
    print("\n| executor | trials/s | vs local x1 | trial s | overhead s/trial | wall s |")
    print("|---|---|---|---|---|---|")
    for (name, workers), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {name} x{workers} | {med['rate']:.2f} | {med['rate'] / base:.2f}x | {med['trial']:.2f} | "
              f"{med['overhead']:.2f} | {med['wall']:.1f} |")


if __name__ == "__main__":
    main()
