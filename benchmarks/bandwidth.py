"""The native scans against the memory bound: achieved GB/s and the fraction of the machine's copy
bandwidth, both measured in the same interleaved rounds (so against the same machine state).

    python benchmarks/bandwidth.py [--rounds 5] [--sizes small large] [--threads 1 2] [--markdown]

Copy bandwidth: the faster of numpy's copy of a 256 MiB float32 array into a preallocated, already
touched one (memcpy; its large-size path streams the stores) and torch's copy_ of the same,
counted as bytes read + bytes written. With k threads (--threads: torch.set_num_threads(k), under
which the diagonal scan shares its batch rows among k threads) both copies use k threads (numpy:
k equal slices copied at once from a thread pool; torch: its own OpenMP threads), so each scan is
held against the copy at its own thread count, measured in the same rounds (one set of rounds
per thread count: a one-thread contender right after a two-thread one ran slower in cache). A
scan's GB/s counts the least traffic it must move, each tensor once per pass:
  diag fwd          read a, b, c; write y                              (no grad: no checkpoints)
  diag fwd+bwd      the forward (+ its checkpoints), then read a, b, c, gy, checkpoints;
                    write grad a, b, c
  selective fwd     read dt, x, Bm, C; write y
  selective fwd+bwd the forward (+ checkpoints), then read dt, x, Bm, C, gy, checkpoints; write
                    grad dt, x, Bm, C (A, h0 and their gradients are small)
Shapes: diag B 8, H 4 channels x N 64 states, the read-out c shared over channels (the Mamba
layout of benchmarks/kernel_speed.py), T 256 ("small": 4.5 MiB, inside the 32 MiB L3) or 16384
("large": 290 MiB); selective B 8, E 256 channels, N 16 states, T 256 or 16384 (large: 392 MiB of
inputs and y). float32, one torch thread unless --threads says otherwise (the selective scan runs on one thread:
it is timed at one only); every contender (the copy included) once per round, the
order reversed every other round (a small shape runs 20 times in a row per round, so that it is
timed in cache, not cold after the copy); min and median wall time over rounds, the min of the thread's
CPU time (see timing.py: under a load above the 2 cores the wall times mostly measure the
waiting; one-thread rows only, as the calling thread's CPU time misses the others), GB/s and the
fraction of the copy's for both, and the load average.
"""

from __future__ import annotations

import argparse
import platform
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from models.kernels import diag_scan
from models.kernels.native import selective
from models.kernels.native.library import retain_freed_memory
from timing import interleaved  # benchmarks/timing.py

MIB = 1 << 20
SIZES = {"small": 256, "large": 16384}
REPEATS = {"small": 20, "large": 1}  # runs per contender per round (see repeated)


def copy_contenders(threads: int = 1, nbytes: int = 256 * MIB) -> dict:
    """{name: (fn, bytes moved)}: copies of nbytes into a preallocated, touched destination with
    `threads` threads, two ways: numpy (memcpy; with k threads k equal slices copied at once from
    a thread pool, numpy releasing the GIL) and torch's copy_ (its own k OpenMP threads). The
    faster of the two is the copy bandwidth at that thread count."""
    src = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst[...] = 0  # touch every page: no page faults in the timed copies
    if threads == 1:
        numpy_copy = lambda: np.copyto(dst, src)  # noqa: E731
    else:
        pool = ThreadPoolExecutor(threads)
        cuts = [len(src) * k // threads for k in range(threads + 1)]
        slices = [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:])]
        numpy_copy = lambda: list(pool.map(lambda s: np.copyto(dst[s], src[s]), slices))  # noqa: E731
    src_t, dst_t = torch.from_numpy(src), torch.from_numpy(dst)
    return {f"copy 256 MiB numpy ({threads} thr)": (numpy_copy, 2 * nbytes),
            f"copy 256 MiB torch ({threads} thr)": (lambda: dst_t.copy_(src_t), 2 * nbytes)}


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
    spacing = selective.selective_spacing(64, A, batch, length)
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
    parser.add_argument("--threads", nargs="+", type=int, default=[1],
                        help="torch thread counts to time the diagonal scan (and the copy) at")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--retain-freed-memory", action="store_true",
                        help="models.kernels.native.library.retain_freed_memory() first (opt-in: freed blocks "
                             "reused instead of fresh, zeroed mappings)")
    args = parser.parse_args()
    if any(k < 1 for k in args.threads):
        parser.error(f"--threads must be positive; got {args.threads}")
    if args.retain_freed_memory:
        print(f"retain_freed_memory: {retain_freed_memory()}")
    print(f"# {platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, threads {args.threads}")
    rows = []
    for size in args.sizes:
        diag = repeated(diag_contenders(SIZES[size]), REPEATS[size]) if "diag" in args.kernels else {}
        for threads in args.threads:  # one set of rounds per thread count, its copies in them
            copies = copy_contenders(threads)
            contenders = dict(copies)
            contenders.update({f"{k} T={SIZES[size]} ({threads} thr)": v for k, v in diag.items()})
            if "selective" in args.kernels and threads == 1:
                contenders.update({f"{k} T={SIZES[size]} (1 thr)": v for k, v in
                                   repeated(selective_contenders(SIZES[size]), REPEATS[size]).items()})
            torch.set_num_threads(threads)
            res = interleaved({name: fn for name, (fn, _) in contenders.items()}, rounds=args.rounds)
            # the copy bandwidth at this thread count: the faster copy (wall), and in CPU time
            copy_gbs = max(moved / res[c].min for c, (_, moved) in copies.items()) / 1e9
            copy_cpu_gbs = max(moved / res[c].cpu_min for c, (_, moved) in copies.items()) / 1e9
            for name, (_, moved) in contenders.items():
                t = res[name]
                gbs, cpu_gbs = moved / t.min / 1e9, moved / t.cpu_min / 1e9
                cpu = (t.cpu_min * 1e3, cpu_gbs, cpu_gbs / copy_cpu_gbs) if threads == 1 else None
                rows.append((name, moved / MIB, t.min * 1e3, t.median * 1e3, gbs, gbs / copy_gbs, cpu, res.load))
    torch.set_num_threads(1)
    if args.markdown:
        print("| contender | MiB moved | wall min ms | wall median ms | GB/s | of copy | CPU min ms | GB/s (CPU) "
              "| of copy (CPU) | load |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, mib, t_min, t_med, gbs, frac, cpu, load in rows:
            c = "{:.2f} | {:.1f} | {:.2f}".format(*cpu) if cpu else "- | - | -"
            print(f"| {name} | {mib:.0f} | {t_min:.2f} | {t_med:.2f} | {gbs:.1f} | {frac:.2f} | {c} | {load} |")
    else:
        for name, mib, t_min, t_med, gbs, frac, cpu, load in rows:
            c = "CPU min {:8.2f} ms {:5.1f} GB/s {:4.2f}".format(*cpu) if cpu else "CPU -"
            print(f"{name:30s} {mib:6.0f} MiB  wall min {t_min:8.2f} med {t_med:8.2f} ms {gbs:5.1f} GB/s {frac:4.2f}"
                  f"  | {c}  load {load}")

if __name__ == "__main__":
    main()
