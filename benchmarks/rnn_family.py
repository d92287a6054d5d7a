"""The linear RNN's chunked scan against its step loop (forward + backward).

    python benchmarks/rnn_family.py [--batch 32] [--width 64] [--lengths 64 256 1024] [--repeats 15] [--markdown]

For h_t = A h_{t-1} + u_t with a dense A [n, n] and u [B, T, n] requiring gradients, times
forward + backward of `chunked_linear_scan` (chunk ceil(sqrt(T)), the linear_rnn fast path) and of
the reference step loop (`RecurrentMixer.scan`, the instrumented path), interleaved, median of
--repeats (the minimum: the least disturbed by other jobs on a shared machine), one thread, and checks that both give the same states.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import torch

import models
from models.mixers.linear_rnn import chunked_linear_scan


def fwd_bwd_seconds(fn, u: torch.Tensor) -> float:
    start = time.perf_counter()
    fn(u).square().sum().backward()
    return time.perf_counter() - start


def measure(batch: int, width: int, length: int, repeats: int) -> dict:
    torch.manual_seed(0)
    mixer = models.build("linear_rnn", d_model=width).blocks[0].mixer
    u = torch.randn(batch, length, width, requires_grad=True)
    chunk = math.ceil(math.sqrt(length))
    paths = {
        "chunked": lambda v: chunked_linear_scan(mixer.A, v, chunk),
        "loop": lambda v: mixer.scan({"u": v})[1],
    }
    with torch.no_grad():
        error = float((paths["chunked"](u) - paths["loop"](u)).abs().max())
    times = {name: [] for name in paths}
    for name, fn in paths.items():
        fwd_bwd_seconds(fn, u)  # warm-up
    for _ in range(repeats):
        for name, fn in paths.items():
            times[name].append(fwd_bwd_seconds(fn, u))
    best = {name: min(values) for name, values in times.items()}
    return {"length": length, "chunk": chunk, "max_abs_diff": error, **best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [measure(args.batch, args.width, length, args.repeats) for length in args.lengths]
    print(f"Machine: {platform.machine()}, torch {torch.__version__}, 1 thread; "
          f"B = {args.batch}, n = {args.width}, min of {args.repeats}.")
    if args.markdown:
        print("\n| T | chunk | chunked ms | loop ms | loop / chunked | max abs diff |\n|---|---|---|---|---|---|")
    for row in rows:
        ratio = row["loop"] / row["chunked"]
        if args.markdown:
            print(f"| {row['length']} | {row['chunk']} | {1e3 * row['chunked']:.1f} | {1e3 * row['loop']:.1f} "
                  f"| {ratio:.2f} | {row['max_abs_diff']:.1e} |")
        else:
            print(f"T={row['length']:5d} chunk={row['chunk']:3d} chunked {1e3 * row['chunked']:8.1f} ms  "
                  f"loop {1e3 * row['loop']:8.1f} ms  loop/chunked {ratio:5.2f}  max|diff| {row['max_abs_diff']:.1e}")


if __name__ == "__main__":
    main()
