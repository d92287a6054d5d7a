"""Head-ablation sweep: every head of a 2-layer, 4-head DeltaNet on 1024 REPL traces.

    python benchmarks/heads.py [--traces 1024] [--statements 8] [--impl auto] [--markdown]

`interp.analysis.heads.ablate_heads` runs one forward pass over all traces per ablated head and mode
(clamp beta to [0, 1]; pin beta to its mean): 1 unablated + 2 L H = 17 passes for L = 2, H = 4,
plus one beta-only cached pass for the means. Measured in one run on this machine:
  - the whole sweep (wall time),
  - one unablated forward pass and one pass with a head clamped (median of --repeats), side by
    side, so the ratio shows what the kernel clamp costs,
  - the head-statistics pass (hook_beta + hook_state cached, instrumented path) on 64 traces.
Trace generation throughput is measured by benchmarks/tasks.py (REPL and PFSA rows); here only
the generation time of this sweep's traces is printed. The model is untrained (timing only).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

import models
from interp.analysis import heads
from interp.tasks import make_task
from timing import timed  # benchmarks/timing.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1024)
    parser.add_argument("--statements", type=int, default=8, help="REPL statements per trace")
    parser.add_argument("--impl", default="auto", choices=heads.IMPLS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    task = make_task("REPL", n_vars=3, loss="reveals")
    start = time.perf_counter()
    batch = task.sample(args.traces, args.statements, seed=0).to(device)
    generation = time.perf_counter() - start
    torch.manual_seed(0)
    model = models.build("deltanet_neg", vocab_size=task.vocab_size).to(device).eval()   # 2 layers, 4 heads
    impl = None if args.impl == "auto" else args.impl

    start = time.perf_counter()
    result = heads.ablate_heads(model, batch, impl=impl)
    sweep = time.perf_counter() - start
    n_passes = 1 + len(result.rows)

    with heads.kernel_settings(model, "auto", impl):
        plain = timed(lambda: heads.reveal_accuracy(model, batch), args.repeats)
        with heads.beta_clamped(model, 0, 0, 0.0, 1.0):
            clamped = timed(lambda: heads.reveal_accuracy(model, batch), args.repeats)
    stats = timed(lambda: heads.head_stats(model, batch.select(slice(0, 64))), 1)

    B, T = batch.tokens.shape
    cpu = f"{platform.machine()}, {device}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    rows = [
        ("full sweep (1 + 2 L H passes)", f"{n_passes} passes", sweep, B * T * n_passes / sweep),
        ("one unablated pass", "1 pass", plain, B * T / plain),
        ("one pass, head 0 of layer 0 clamped to [0, 1]", "1 pass", clamped, B * T / clamped),
        ("head statistics (hook_beta + hook_state, instrumented), 64 traces", "1 pass + SVDs", stats, 64 * T / stats),
    ]
    if args.markdown:
        print(f"Machine: {cpu}. Traces: {B} REPL S3 traces of {args.statements} statements ({T} tokens), "
              f"generated in {generation:.3f} s. Kernel impl: {args.impl}.\n")
        print("| measurement | passes | seconds | tokens/s |")
        print("|---|---|---|---|")
        for name, passes, seconds, rate in rows:
            print(f"| {name} | {passes} | {seconds:.3f} | {rate:.3g} |")
        print(f"\nclamped / unablated pass time: {clamped / plain:.3f}; sweep / (passes x unablated pass): "
              f"{sweep / (n_passes * plain):.3f}")
    else:
        print(cpu, f"B={B} T={T} generation {generation:.3f} s")
        for name, passes, seconds, rate in rows:
            print(f"{name:70s} {passes:>14s} {seconds:8.3f} s {rate:10.3g} tok/s")


if __name__ == "__main__":
    main()
