"""EAP and EAP-IG on every edge of real-size models, against one forward + backward.

Models: GPT-2 small and Mamba-130m at their real configurations with random weights
(benchmarks/real_configs.py, converted by models.from_pretrained), float32, one thread. Pair: N
random token sequences of length T (default 8 x 64), the corrupted copy with positions T/4 and
T/2 redrawn; metric the logit difference at the last position (the clean target a random token).

  fwd+bwd  one forward of the clean tokens (logits at the last position) and a backward of the
           summed metric to every parameter
  eap      interp.analysis.circuits.eap over the whole graph (clean and corrupted forwards, one
           forward with every receiver's leaf and one backward)
  eap-ig   eap_ig with --steps steps (default 8), all steps in one batch

Each measurement runs in its own process (peak memory is that process's ru_maxrss growth over
the model's load); time is the minimum over --rounds rounds. Targets: eap <= 3x fwd+bwd, eap-ig <=
3 k x. Wrap runs in `flock /tmp/interp-bench.lock`.

    python benchmarks/circuits.py [--models gpt2,mamba] [--n 8] [--length 64] [--steps 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

METHODS = ("fwd+bwd", "eap", "eap-ig")


def pair(name: str, n: int, length: int):
    from interp.tasks.base import Batch
    from real_configs import tokens  # benchmarks/real_configs.py

    clean_tokens = tokens(name, n, length, seed=0)
    corrupt_tokens = clean_tokens.clone()
    for t in (length // 4, length // 2):
        corrupt_tokens[:, t] = tokens(name, n, 1, seed=t)[:, 0]
    targets = tokens(name, n, length, seed=1)
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, -1] = True
    states = torch.zeros(n, length, dtype=torch.long)
    return Batch(clean_tokens, targets, mask, states, {}), Batch(corrupt_tokens, targets, mask, states, {})


def measure(name: str, method: str, n: int, length: int, steps: int, rounds: int) -> dict:
    """One (model, method) in this process: {"seconds", "peak_bytes", "edges"}."""
    import models
    from interp.analysis.circuits import build_graph, eap, eap_ig
    from real_configs import build_source

    torch.set_num_threads(1)
    model = models.from_pretrained(build_source(name)).eval()
    clean, corrupt = pair(name, n, length)
    graph = build_graph(model)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def fwd_bwd():
        at = torch.full((n,), length - 1)
        logits = model(clean.tokens, at=at)
        y, rival = clean.targets[:, -1], corrupt.tokens[:, 0]
        (logits.gather(1, y[:, None]) - logits.gather(1, rival[:, None])).sum().backward()
        model.zero_grad(set_to_none=True)

    run = {"fwd+bwd": fwd_bwd,
           "eap": lambda: eap(model, clean, corrupt, graph=graph),
           "eap-ig": lambda: eap_ig(model, clean, corrupt, steps=steps, graph=graph, progress=False)}[method]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"seconds": min(times), "peak_bytes": peak, "edges": graph.n_edges}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,mamba")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.n, args.length, args.steps, args.rounds)))
        return
    from models.memory import format_bytes

    print(f"load before: {os.getloadavg()[0]:.2f}")
    for name in args.models.split(","):
        rows = {}
        for method in METHODS:
            out = subprocess.run([sys.executable, __file__, "--one", name, method, "--n", str(args.n), "--length",
                                  str(args.length), "--steps", str(args.steps), "--rounds", str(args.rounds)],
                                 capture_output=True, text=True)
            if out.returncode:
                print(f"  {name} {method}: failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
                continue
            rows[method] = json.loads(out.stdout.strip().splitlines()[-1])
        base = rows["fwd+bwd"]["seconds"]
        print(f"{name} ({rows['fwd+bwd']['edges']} edges, N={args.n}, T={args.length}):")
        for method, row in rows.items():
            print(f"  {method:8s} {row['seconds']:8.2f} s  {row['seconds'] / base:6.1f}x fwd+bwd  "
                  f"peak +{format_bytes(row['peak_bytes'])}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
