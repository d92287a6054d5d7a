"""Task generation throughput (tokens/s), vectorised generators vs a per-token Python reference.

    python benchmarks/tasks.py [--batch 1024] [--length 1000] [--repeats 5] [--markdown]

Measures, in one run on this machine, the median wall time of `task.sample(B, length, seed)`
(including the conversion to torch tensors) for group word problems (S3 acot, S5 acot, A5 cot),
AR, MQAR, REPL traces and PFSA-SR with length chosen so each sequence has about `--length`
tokens, and ATR at its own document size; tokens/s = B * T_tokens / time. The reference row folds
the S3 running product with a plain Python loop per token (on a 64-row slice) to show what
vectorising buys over the same work.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

from interp.tasks import make_task
from timing import timed  # benchmarks/timing.py


def python_fold_tokens_per_s(batch: int, length: int) -> float:
    """Per-token Python loop over the S3 table (the slow reference), tokens/s."""
    task = make_task("S3")
    table = task.group.table.tolist()
    x = np.random.default_rng(0).integers(0, 6, size=(batch, length)).tolist()

    def fold():
        out = []
        for row in x:
            s, states = 0, []
            for e in row:
                s = table[s][e]
                states.append(s)
            out.append(states)
        return out

    return batch * length / timed(fold, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    B, T = args.batch, args.length
    pairs = (T - 4) // 2                      # AR: 2 * pairs + 4 tokens
    cases = [
        ("S3 acot", make_task("S3", format="acot"), T),
        ("S5 acot", make_task("S5", format="acot"), T),
        ("A5 cot", make_task("A5", format="cot"), T // 2),
        ("AR", make_task("AR", n_keys=pairs, n_values=pairs), pairs),
        ("MQAR (8 queries)", make_task("MQAR", n_keys=pairs, n_values=pairs, n_queries=8), pairs - 8),
        ("ATR (length 32)", make_task("ATR"), 32),
        ("REPL S3 swaps, full reveal every 4", make_task("REPL", n_vars=3), (T - 12) * 4 // 45),
        ("PFSA n=3 (beliefs over 6)", make_task("PFSA", n_items=3), T // 2),
        ("PFSA n=5 (beliefs over 120)", make_task("PFSA", n_items=5), T // 2),
    ]
    rows = []
    for label, task, length in cases:
        shape = task.sample(2, length, 0).tokens.shape
        seconds = timed(lambda: task.sample(B, length, 1), args.repeats)
        rows.append((label, f"{B} x {shape[1]}", B * shape[1] / seconds, seconds))
    reference = python_fold_tokens_per_s(64, T)

    machine = f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, 1 thread"
    if args.markdown:
        print(f"Machine: {machine} (2-core CPU shared with other jobs). Median of {args.repeats}.\n")
        print("| task | B x T_tokens | tokens/s | s per batch |")
        print("|---|---|---|---|")
        for label, shape, rate, seconds in rows:
            print(f"| {label} | {shape} | {rate:.3g} | {seconds:.4f} |")
        print(f"| S3 running product, per-token Python loop (reference) | 64 x {T} | {reference:.3g} | - |")
    else:
        print(machine)
        for label, shape, rate, seconds in rows:
            print(f"{label:>36} {shape:>12}  {rate:10.3g} tokens/s  ({seconds:.4f} s)")
        print(f"{'S3 per-token Python loop':>36} {'64 x ' + str(T):>12}  {reference:10.3g} tokens/s")


if __name__ == "__main__":
    main()
