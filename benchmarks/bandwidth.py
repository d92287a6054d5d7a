"""The native scans against the memory bound: achieved GB/s and the fraction of the machine's copy
bandwidth, both measured in the same interleaved rounds (so against the same machine state).

    python benchmarks/bandwidth.py [--rounds 5] [--sizes small large] [--markdown]

Copy bandwidth: numpy's copy of a 256 MiB float32 array into a preallocated, already touched one
(memcpy; its large-size path streams the stores), counted as bytes read + bytes written. A
scan's GB/s counts the least traffic it must move, each tensor once per pass:
  diag fwd          read a, b, c; write y                              (no grad: no checkpoints)
  diag fwd+bwd      the forward (+ its checkpoints), then read a, b, c, gy, checkpoints;
                    write grad a, b, c
  selective fwd     read dt, x, Bm, C; write y
  selective fwd+bwd the forward (+ checkpoints), then read dt, x, Bm, C, gy, checkpoints; write
                    grad dt, x, Bm, C (A, h0 and their gradients are small)
Shapes: diag B 8, H 4 channels x N 64 states, the read-out c shared over channels (the Mamba
layout of benchmarks/kernels.py), T 256 ("small": 4.5 MiB, inside the 32 MiB L3) or 16384
("large": 290 MiB); selective B 8, E 256 channels, N 16 states, T 256 or 16384 (large: 392 MiB of
inputs and y). float32, one torch thread; every contender (the copy included) once per round, the
order reversed every other round (a small shape runs 20 times in a row per round, so that it is
timed in cache, not cold after the copy); min and median wall time over rounds, the min of the thread's
CPU time (see timing.py: under a load above the 2 cores the wall times mostly measure the
waiting), GB/s and the fraction of the copy's for both, and the load average.
"""

from __future__ import annotations

import argparse
import platform

import numpy as np
import torch

from models.kernels import diag_scan
from models.kernels.native import selective
from models.kernels.native.library import retain_freed_memory
from timing import interleaved  # benchmarks/timing.py

MIB = 1 << 20
SIZES = {"small": 256, "large": 16384}
REPEATS = {"small": 20, "large": 1}  # runs per contender per round (see repeated)


def copy_contender(nbytes: int = 256 * MIB):
    """(fn, bytes moved): numpy copy of nbytes into a preallocated, touched destination."""
    src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst[...] = 0  # touch every page: no page faults in the timed copies
    return (lambda: np.copyto(dst, src)), 2 * nbytes


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def repeated(contenders: dict, times: int) -> dict:
    """Each (fn, bytes) run `times` times in a row per round: the in-cache shapes, whose inputs the
    copy between contenders evicts, are then timed mostly warm (the first run of each round cold)."""
    return {name: ((lambda fn=fn: [fn() for _ in range(times)]), moved * times)
            for name, (fn, moved) in contenders.items()}


def diag_contenders(length: int, batch: int = 8, heads: int = 4, n: int = 64) -> dict:
    """{name: (fn, bytes moved)} of the native diagonal scan, forward and forward+backward."""
    gen = torch.Generator().manual_seed(0)
    a = torch.exp(-torch.rand(batch, length, heads, n, generator=gen))
    b = torch.randn(batch, length, heads, n, generator=gen)
    c = torch.randn(batch, length, n, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (a, b, c)]
    gy = torch.randn(batch, length, heads, generator=gen)
    y_bytes = nbytes(gy)
    ckpt_bytes = nbytes(a) // min(length, 32)  # the spacing checkpoint_spacing picks at 4 x 64 float32

    def fwd():
        return diag_scan(a, b, c, impl="native").output

    def fwd_bwd():
        y = diag_scan(*leaves, impl="native").output
        return torch.autograd.grad(y, leaves, gy)

    fwd_traffic = nbytes(a, b, c) + y_bytes
    return {"diag fwd": (fwd, fwd_traffic),
            "diag fwd+bwd": (fwd_bwd, fwd_traffic + ckpt_bytes + nbytes(a, b, c) + y_bytes + ckpt_bytes
                             + nbytes(a, b, c))}


def selective_contenders(length: int, batch: int = 8, inner: int = 256, n: int = 16) -> dict:
    """{name: (fn, bytes moved)} of the native selective scan, forward and forward+backward."""
    gen = torch.Generator().manual_seed(1)
    dt = torch.nn.functional.softplus(torch.randn(batch, length, inner, generator=gen) - 2)
    A = -torch.arange(1, n + 1, dtype=torch.float32).repeat(inner, 1)
    x = torch.randn(batch, length, inner, generator=gen)
    Bm, C = torch.randn(batch, length, n, generator=gen), torch.randn(batch, length, n, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (dt, A, x, Bm, C)]
    gy = torch.randn(batch, length, inner, generator=gen)
    spacing = selective.selective_spacing(64, A)
    ckpt_bytes = batch * -(-length // spacing) * nbytes(A)

    def fwd():
        return selective.selective_scan(dt, A, x, Bm, C)

    def fwd_bwd():
        y = selective.selective_scan(*leaves)
        return torch.autograd.grad(y, leaves, gy)

    inputs = nbytes(dt, x, Bm, C)
    fwd_traffic = inputs + nbytes(gy)
    return {"selective fwd": (fwd, fwd_traffic),
            "selective fwd+bwd": (fwd_bwd, fwd_traffic + ckpt_bytes + inputs + nbytes(gy) + ckpt_bytes + inputs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--kernels", nargs="+", default=["diag", "selective"], choices=["diag", "selective"])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--retain-freed-memory", action="store_true",
                        help="models.kernels.native.library.retain_freed_memory() first (opt-in: freed blocks "
                             "reused instead of fresh, zeroed mappings)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.retain_freed_memory:
        print(f"retain_freed_memory: {retain_freed_memory()}")
    print(f"# {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, 1 thread")
    rows = []
    for size in args.sizes:
        copy_fn, copy_bytes = copy_contender()
        contenders = {"copy 256 MiB": (copy_fn, copy_bytes)}
        times = REPEATS[size]
        if "diag" in args.kernels:
            contenders.update({f"{k} T={SIZES[size]}": v
                               for k, v in repeated(diag_contenders(SIZES[size]), times).items()})
        if "selective" in args.kernels:
            contenders.update({f"{k} T={SIZES[size]}": v
                               for k, v in repeated(selective_contenders(SIZES[size]), times).items()})
        res = interleaved({name: fn for name, (fn, _) in contenders.items()}, rounds=args.rounds)
        copy = res["copy 256 MiB"]
        for name, (_, moved) in contenders.items():
            t = res[name]
            gbs, cpu_gbs = moved / t.min / 1e9, moved / t.cpu_min / 1e9
            rows.append((name, moved / MIB, t.min * 1e3, t.median * 1e3, gbs, gbs / (copy_bytes / copy.min / 1e9),
                         t.cpu_min * 1e3, cpu_gbs, cpu_gbs / (copy_bytes / copy.cpu_min / 1e9), res.load))
    if args.markdown:
        print("| contender | MiB moved | wall min ms | wall median ms | GB/s | of copy | CPU min ms | GB/s (CPU) "
              "| of copy (CPU) | load |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, mib, t_min, t_med, gbs, frac, c_min, c_gbs, c_frac, load in rows:
            print(f"| {name} | {mib:.0f} | {t_min:.2f} | {t_med:.2f} | {gbs:.1f} | {frac:.2f} | {c_min:.2f} | "
                  f"{c_gbs:.1f} | {c_frac:.2f} | {load} |")
    else:
        for name, mib, t_min, t_med, gbs, frac, c_min, c_gbs, c_frac, load in rows:
            print(f"{name:24s} {mib:6.0f} MiB  wall min {t_min:8.2f} med {t_med:8.2f} ms {gbs:5.1f} GB/s {frac:4.2f}"
                  f"  | CPU min {c_min:8.2f} ms {c_gbs:5.1f} GB/s {c_frac:4.2f}  load {load}")


if __name__ == "__main__":
    main()
