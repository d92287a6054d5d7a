"""What `models.load` of a real-sized saved model costs, per source tree: the size gate (issue 38)
counts the parameters and checks the memory before anything is allocated; this times a whole load
so that trees before and after a change to the gate are compared side by side.

    python benchmarks/load_gate.py --make /tmp/load_gate            # once: the two saved models
    python benchmarks/load_gate.py --runs /tmp/load_gate --trees /tmp/pregate,/tmp/old,. [--rounds 5]

Models (random weights, float32, saved by this tree): "mamba130m" (the mamba preset at d_model 768,
24 layers, vocab 50280, untied: 167,750,400 parameters) and "gpt2small" (the transformer preset at
GPT-2 small's shape: d_model 768, 12 layers, 12 heads, vocab 50257, 1024 learned positions,
gelu_tanh, tied: 124,439,808 parameters). Each load is a fresh process (one torch thread) that
prints the load call's wall and CPU seconds, the whole process's wall seconds (with its imports) and
its peak RSS; the trees are interleaved within each round, their order rotated round by round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

MODELS = {
    "mamba130m": ("mamba", dict(vocab_size=50280, d_model=768, n_layers=24)),
    "gpt2small": ("transformer", dict(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, max_len=1024,
                                      mlp_activation="gelu_tanh", tie_embeddings=True)),
}

CASE = """
import resource, sys, time
started = time.perf_counter()
import torch
torch.set_num_threads(1)
import models
wall, cpu = time.perf_counter(), time.process_time()
model = models.load(sys.argv[1])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(wall, cpu, time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def make(root: Path) -> None:
    import models

    for name, (preset, fields) in MODELS.items():
        model = models.build(preset, **fields)
        print(name, sum(p.numel() for p in model.parameters()), "parameters")
        model.save(root / name)


def measure(tree: Path, run: Path) -> list[float]:
    """[load wall s, load CPU s, process wall s, peak RSS MB] of one load in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CASE, str(run)], env=env, capture_output=True, text=True,
                          timeout=600, check=True, cwd=tree)   # (-c puts the working directory first on sys.path)
    return [float(v) for v in done.stdout.split()[-4:]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make", type=Path, help="save the two models under this directory, then stop")
    parser.add_argument("--runs", type=Path, help="the directory --make wrote")
    parser.add_argument("--trees", default=".", help="comma-separated source trees, interleaved")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.make:
        return make(args.make)
    trees = [Path(t) for t in args.trees.split(",")]
    results: dict[tuple[str, int], list[list[float]]] = {}
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    for round_ in range(args.rounds):
        order = list(range(len(trees)))
        order = order[round_ % len(order):] + order[:round_ % len(order)]
        for name in MODELS:
            for index in order:
                values = measure(trees[index], args.runs / name)
                results.setdefault((name, index), []).append(values)
                print(f"round {round_} {name} {trees[index]}: load {values[0]:.2f} s wall {values[1]:.2f} s CPU, "
                      f"process {values[2]:.2f} s, peak RSS {values[3]:.0f} MB", flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    print("\n| model | tree | load wall s (median, min-max) | load CPU s | process wall s | peak RSS MB |")
    print("|---|---|---|---|---|---|")
    for name in MODELS:
        for index, tree in enumerate(trees):
            columns = list(zip(*results[(name, index)]))
            cells = [f"{statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f})" for c in columns[:3]]
            print(f"| {name} | {tree} | " + " | ".join(cells) + f" | {statistics.median(columns[3]):.0f} |")


if __name__ == "__main__":
    main()
