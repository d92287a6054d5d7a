"""Interchange grids and attribution at the real sizes (benchmarks/real_configs.py, random weights).

Grid: every position x {hook_resid_pre, mixer.hook_out, mixer.hook_state (where the mixer has
one)} x the chosen layers, N clean / corrupt pairs of random tokens (corrupt: fresh random tokens,
so no pair is a no-op), the answer at the last position. Reports sites / s (sites x N pairs per
site, over the wall time of the call) and the peak RSS of the process above its RSS before the
call (ru_maxrss, so run one measurement per process).

    PYTHONPATH=. python benchmarks/interchange_real_size.py mamba --T 64 --layers 3,9,15,21
    PYTHONPATH=. python benchmarks/interchange_real_size.py mamba --T 512 --attribution

Measured (one thread, N = 8, load 1.0-2.4; before = main at 8672106, after = this change;
sites/s of the whole call, fixed costs included):
    Mamba-130m T 64,  layer 12, 192 sites   0.66 -> 1.80 sites/s, peak +6.08 -> +0.92 GB
    GPT-2 small T 64, layer 6, 128 sites    0.82 -> 2.37 sites/s, peak +5.63 -> +1.30 GB
    Mamba-130m T 512, layer 12, 16 positions (every 32nd) x 3 hooks, 48 sites
                                            0.13 -> 0.16 sites/s, peak +12.9 -> +2.17 GB
                                            (about 70 s of each call is the two instrumented
                                            runs and the per-block state recomputes)
    GPT-2 small T 512, layer 6, the same 16 positions x 2 hooks: 0.22 sites/s, +1.30 GB (after)
    attribute, Mamba-130m T 512, every position x 3 hooks x 24 layers (36,864 sites): 254 s,
    peak +10.6 GB (before: out of memory at 14 GB)
"""

from __future__ import annotations

import argparse
import inspect
import resource
import time

import torch

import models
from benchmarks.real_configs import build_source, tokens
from interp.analysis.interventions import Site, attribute, interchange
from interp.tasks.base import Batch

HOOKS = ("hook_resid_pre", "mixer.hook_out", "mixer.hook_state")


def batch(name: str, n: int, length: int, seed: int) -> Batch:
    toks = tokens(name, n, length + 1, seed=seed)
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, -1] = True
    return Batch(toks[:, :-1].contiguous(), toks[:, 1:].contiguous(), mask, torch.zeros(n, length))


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("--T", type=int, default=64)
    parser.add_argument("--N", type=int, default=8)
    parser.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    parser.add_argument("--positions", default=None, help="comma-separated positions (default all)")
    parser.add_argument("--attribution", action="store_true")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--max-memory", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = models.from_pretrained(build_source(args.name)).eval()
    clean, corrupt = batch(args.name, args.N, args.T, 1), batch(args.name, args.N, args.T, 2)
    names = set(model.hook_names())
    layers = range(model.cfg.n_layers) if args.layers is None else [int(x) for x in args.layers.split(",")]
    positions = range(args.T) if args.positions is None else [int(x) for x in args.positions.split(",")]
    sites = [Site(f"blocks.{l}.{h}", p) for l in layers for h in HOOKS if f"blocks.{l}.{h}" in names
             for p in positions]
    options = {}
    fn = attribute if args.attribution else interchange
    if args.batch_size:
        options["batch_size"] = args.batch_size
    if "max_memory" in inspect.signature(fn).parameters:
        options["max_memory"] = args.max_memory
    before = rss()
    start = time.perf_counter()
    result = fn(model, clean, corrupt, sites, min_effect=0.0, **options)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    with open("/proc/loadavg") as load:
        loadavg = load.read().split()[0]
    print(f"{args.name} {'attribute' if args.attribution else 'interchange'} T={args.T} N={args.N} "
          f"{len(sites)} sites: {seconds:.1f} s, {len(sites) / seconds:.2f} sites/s, peak +{peak / 1e9:.2f} GB "
          f"(load {loadavg}); mean p_patched {float(result.p_patched.mean()):.6g}; {result!r}")
    torch.save({"p_patched": result.p_patched, "labels": result.labels}, f"/tmp/interchange_{args.name}_{args.T}_"
               f"{'attr' if args.attribution else 'exact'}_{models.__file__.split('/')[2]}.pt")


if __name__ == "__main__":
    main()
