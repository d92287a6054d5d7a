"""Scan kernels on the CPU: naive, chunked and native, forward and forward+backward, state export.

    python benchmarks/kernel_speed.py [--lengths 256 1024 4096] [--repeats 3] [--markdown] [--skip-loop-backward]
    python benchmarks/kernel_speed.py --widths 4x64 64x16 512x16 1024x16 --lengths 256   (width sweep)

One table, one row per (kernel, T, implementation, export): the fastest of --repeats wall times
of the forward and of forward+backward (a scalar loss on every output) at B = 8, H = 4 channels /
heads, d_head = 64 state entries per channel, float32, 1 thread; "speed-up" is the naive/none
row's time / this row's time at the same T. The rows of one (kernel, T) are timed in the
interleaved rounds of benchmarks/timing.py (every row once per round, the order reversed every
other round; minimum wall and thread CPU time, the load average before and after the forward
rounds and the forward+backward rounds), so load drift on a shared machine hits them alike. The
naive loop is the correctness baseline and what a torch user writes first; its ratio moves with
the load (a loop of small ops suffers more from contention than one C call), so read the CPU-time
columns and benchmarks/bandwidth.py's fractions of the copy bandwidth for where a kernel stands (the speed-up columns are
CPU-time ratios).
Export modes: "none", "chunks" (the state at every chunk end), "all" (every step's state).
Implementations: naive, chunked and native (the plain-C CPU kernels of models/kernels/native/;
the delta rule's is forward only, so its forward+backward cells read "-"); for the delta rule also
fla-core's torch references where fla-core is installed (fla_recurrence, fla_chunkwise: what a
CPU user of fla would run; export none).

Each kernel contributes one `Bench` entry in KERNELS: setup(B, H, d_head, T, seed) -> inputs and
call(inputs, impl, export_at) -> tensors to sum into the loss. The delta rule adds its own entry.
GPU rows (Triton) are measured only when a device is lent (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import platform
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from models.kernels import delta_rule, diag_scan
from timing import interleaved  # benchmarks/timing.py

CHUNK = 64


@dataclass
class Bench:
    setup: Callable[[int, int, int, int, int], dict]
    call: Callable[[dict, str, object], list]


def diag_setup(batch: int, heads: int, d_head: int, length: int, seed: int) -> dict:
    """Mamba-like: a = exp(dt A) in (0, 1), b = dt B x, read-out c = C shared over channels."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "a": torch.exp(-torch.rand(batch, length, heads, d_head, generator=gen)).requires_grad_(),
        "b": torch.randn(batch, length, heads, d_head, generator=gen).requires_grad_(),
        "c": torch.randn(batch, length, d_head, generator=gen).requires_grad_(),
    }


def diag_call(inputs: dict, impl: str, export_at) -> list:
    res = diag_scan(inputs["a"], inputs["b"], inputs["c"], export_at=export_at, impl=impl, chunk_size=CHUNK)
    return [x for x in (res.output, res.states_at) if x is not None]


def delta_setup(batch: int, heads: int, d_head: int, length: int, seed: int) -> dict:
    """DeltaNet-like: unit queries and keys, beta in [0, 2] (scale 2), K = V = d_head."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, heads, d_head)
    return {
        "q": F.normalize(torch.randn(shape, generator=gen), dim=-1).requires_grad_(),
        "k": F.normalize(torch.randn(shape, generator=gen), dim=-1).requires_grad_(),
        "v": torch.randn(shape, generator=gen).requires_grad_(),
        "beta": (2 * torch.rand(shape[:3], generator=gen)).requires_grad_(),
    }


def delta_call(inputs: dict, impl: str, export_at) -> list:
    if impl in FLA:  # fla-core's torch references: [B, H, T, d] layout, q scaled by d^-1/2 inside
        q, k, v = (inputs[n].transpose(1, 2) for n in "qkv")
        return [FLA[impl](q, k, v, inputs["beta"].transpose(1, 2))[0]]
    res = delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], export_at=export_at,
                     impl=impl, chunk_size=CHUNK)
    return [x for x in (res.output, res.states_at) if x is not None]


def fla_references() -> dict[str, Callable]:
    """fla-core's CPU (torch) delta-rule references, what a user without our kernels would run,
    where fla-core is installed: the step loop and the chunked WY form (chunk 32, T a multiple)."""
    try:
        from fla.ops.delta_rule.naive import delta_rule_chunkwise, delta_rule_recurrence
    except ImportError:
        return {}
    return {"fla_recurrence": delta_rule_recurrence,
            "fla_chunkwise": lambda q, k, v, beta: delta_rule_chunkwise(q, k, v, beta, chunk_size=32)}


FLA = fla_references()

KERNELS: dict[str, Bench] = {
    "diag_scan": Bench(diag_setup, diag_call),
    "delta_rule": Bench(delta_setup, delta_call),
}


def runners(bench: Bench, length: int, impl: str, export: str | None, args) -> tuple[Callable, Callable]:
    """(forward, forward+backward) closures for one row."""
    inputs = bench.setup(args.batch, args.heads, args.d_head, length, 0)
    leaves = [v for v in inputs.values() if v.requires_grad]

    def forward():
        with torch.no_grad():
            bench.call(inputs, impl, export)

    def forward_backward():
        loss = sum(x.sum() for x in bench.call(inputs, impl, export))
        torch.autograd.grad(loss, leaves)

    return forward, forward_backward


def no_backward() -> None:
    """Stands in for forward+backward where an implementation has no backward (timed as nan)."""


def measure(fns: list[Callable], repeats: int) -> tuple[list[float], list[float], str]:
    """(min wall times, min thread CPU times, load average) of each fn over `repeats` rounds of
    benchmarks/timing.py's interleaved (every fn once per round, the order reversed every other
    round), so every row sees the same drift in machine load."""
    res = interleaved({i: fn for i, fn in enumerate(fns)}, rounds=repeats)
    return [res[i].min for i in range(len(fns))], [res[i].cpu_min for i in range(len(fns))], res.load


ROWS = [("naive", None), ("chunked", None), ("chunked", "chunks"), ("chunked", "all"), ("naive", "all"),
        ("native", None), ("native", "chunks"), ("native", "all")] + [(impl, None) for impl in FLA]
LOOPS = ("naive", "fla_recurrence")  # step loops in torch ops (--skip-loop-backward)
# kernels with a native CPU implementation (models/kernels/native/): has it a backward?
NATIVE = {"diag_scan": True, "delta_rule": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exports", nargs="+", default=["none", "chunks", "all"],
                        choices=["none", "chunks", "all"], help="export modes to run (naive/none always)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--skip-loop-backward", action="store_true",
                        help="no forward+backward for the step loops (naive, fla_recurrence), whose autograd "
                             "graph holds every step's state (minutes and GiB at T 4096); the fwd+bwd speed-ups "
                             "then read '-'")
    parser.add_argument("--widths", nargs="+", default=[], metavar="HxN",
                        help="instead of the main table: a diag_scan width sweep, H channels x N state "
                             "entries (e.g. 512x16: Mamba's d_inner x d_state), export none")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.widths:
        width_sweep(args)
        return
    print(f"Machine: {platform.machine()}, torch {torch.__version__}, 1 thread; "
          f"B={args.batch}, H={args.heads}, d_head={args.d_head}, chunk={CHUNK}, float32, "
          f"min of {args.repeats} interleaved rounds (wall; thread CPU time beside it).\n")
    print("| kernel | T | impl | export | fwd ms | fwd+bwd ms | fwd CPU ms | fwd+bwd CPU ms | fwd speed-up | "
          "fwd+bwd speed-up | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.kernels:
        for length in args.lengths:
            rows = [(impl, export) for impl, export in ROWS
                    if ((impl, export) == ROWS[0] or (export or "none") in args.exports)
                    and (impl != "native" or name in NATIVE) and (impl not in FLA or name == "delta_rule")]
            fns = [runners(KERNELS[name], length, impl, export, args) for impl, export in rows]
            has_bwd = [(impl != "native" or NATIVE[name]) and not (args.skip_loop_backward and impl in LOOPS)
                       for impl, _ in rows]
            repeats = max(1, args.repeats // 2) if length >= 4096 else args.repeats
            fwd, fwd_cpu, load_f = measure([f for f, _ in fns], repeats)
            fb_wall, fb_cpu, load_b = measure([fb for (_, fb), ok in zip(fns, has_bwd) if ok], repeats)
            backward = iter(zip(fb_wall, fb_cpu))
            for (impl, export), f, fc, ok in zip(rows, fwd, fwd_cpu, has_bwd):
                fb, fbc = next(backward) if ok else (None, None)
                both = f"{fb * 1e3:.1f} | {fc * 1e3:.1f} | {fbc * 1e3:.1f}" if ok else f"- | {fc * 1e3:.1f} | -"
                ratio = (f"{fb_cpu[0] / fbc:.1f}x" if has_bwd[0] else "-") if ok else (
                    "- (not timed)" if impl in LOOPS else "- (forward only)")
                print(f"| {name} | {length} | {impl} | {export or 'none'} | {f * 1e3:.1f} | {both} | "
                      f"{fwd_cpu[0] / fc:.1f}x | {ratio} | {load_f}, {load_b} |", flush=True)


def width_sweep(args) -> None:
    """diag_scan naive / chunked / native at several state widths (B x H x N entries per step)."""
    print(f"Machine: {platform.machine()}, torch {torch.__version__}, 1 thread; diag_scan with read-out, "
          f"B={args.batch}, chunk={CHUNK}, float32, export none, min of {args.repeats} interleaved rounds.\n")
    print("| T | H x N | entries per step | impl | fwd ms | fwd+bwd ms | fwd CPU ms | fwd+bwd CPU ms | "
          "fwd speed-up | fwd+bwd speed-up | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    impls = ["naive", "chunked", "native"]
    for length in args.lengths:
        for width in args.widths:
            heads, d_state = (int(x) for x in width.split("x"))
            shape = argparse.Namespace(batch=args.batch, heads=heads, d_head=d_state)
            fns = [runners(KERNELS["diag_scan"], length, impl, None, shape) for impl in impls]
            fwd, fwd_cpu, load_f = measure([f for f, _ in fns], args.repeats)
            fwd_bwd, fb_cpu, load_b = measure([fb for _, fb in fns], args.repeats)
            for impl, f, fb, fc, fbc in zip(impls, fwd, fwd_bwd, fwd_cpu, fb_cpu):
                print(f"| {length} | {width} | {args.batch * heads * d_state} | {impl} | {f * 1e3:.1f} | "
                      f"{fb * 1e3:.1f} | {fc * 1e3:.1f} | {fbc * 1e3:.1f} | {fwd_cpu[0] / fc:.1f}x | "
                      f"{fb_cpu[0] / fbc:.1f}x | {load_f}, {load_b} |", flush=True)


if __name__ == "__main__":
    main()
