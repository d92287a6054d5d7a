"""The GPU checks of the scan kernels, prepared to run in one go on a lent device (issue 4).

    python3 benchmarks/gpu.py --out DIR        on the GPU machine (a few minutes; fla optional)
    python benchmarks/gpu.py --smoke           here: tiny shapes on the CPU under TRITON_INTERPRET=1
                                               (checks that the script runs; its numbers mean nothing)

1. Correctness, float32 on the GPU: the Triton kernels against the naive loop (the definition),
   forward and backward, for the diagonal scan (read-out, initial state, exports, a pin) and the
   delta rule (beta up to 2, initial state, exports, a pin); with fla installed, our delta rule
   against fla's fused_recurrent_delta_rule and chunk_delta_rule. Error = max |x - ref| / max |ref|
   (the interpreter tests' bound is 1e-4).
2. Throughput of the delta rule at B = 8, T = 4096, H = 8, d_head = 64 in fp16 and bf16, export
   off: ours (Triton), fla chunk_delta_rule and fla fused_recurrent_delta_rule, forward and
   forward+backward (triton.testing.do_bench, median ms); target: ours >= 0.8x fla chunk.
3. Throughput of the diagonal scan with read-out at B = 8, T = 4096, H = 512 channels x N = 16
   (Mamba's d_inner x d_state at d_model 256), fp16 / bf16 inputs: Triton vs chunked.
The naive loop is timed once per kernel in float32 as the slow reference.

The device machine has torch and triton but not fla: carry fla-core as a wheel (device README:
`pip download --no-deps fla-core==0.6.0 ...` into .whl, then `pip install --target /tmp/site`).
Results: a markdown report on stdout and in DIR/gpu.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu.md")
    return parser.parse_args(argv)


def shapes(smoke: bool) -> dict:
    if smoke:
        return dict(check=(2, 10, 2, 4), delta=(1, 8, 2, 4), diag=(1, 8, 2, 4), dtypes=["float16"])
    return dict(check=(4, 300, 4, 32), delta=(8, 4096, 8, 64), diag=(8, 4096, 512, 16),
                dtypes=["float16", "bfloat16"])


def rel(x, ref) -> float:
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def timer(device: str):
    """fn -> milliseconds: triton's do_bench (median) on CUDA; one wall-clock call in the smoke run."""
    if device == "cuda":
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100)

    def once(fn):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    return once


def diag_inputs(torch, shape, device, dtype, gen):
    batch, length, heads, d_state = shape
    size = (batch, length, heads, d_state)
    a = torch.exp(-torch.rand(size, generator=gen)).to(device, dtype)
    b = torch.randn(size, generator=gen).to(device, dtype)
    c = torch.randn(batch, length, d_state, generator=gen).to(device, dtype)
    h0 = torch.randn(batch, heads, d_state, generator=gen).to(device, dtype)
    return [x.requires_grad_() for x in (a, b, c, h0)]


def delta_inputs(torch, shape, device, dtype, gen):
    batch, length, heads, d_head = shape
    size = (batch, length, heads, d_head)
    q = torch.nn.functional.normalize(torch.randn(size, generator=gen), dim=-1).to(device, dtype)
    k = torch.nn.functional.normalize(torch.randn(size, generator=gen), dim=-1).to(device, dtype)
    v = torch.randn(size, generator=gen).to(device, dtype)
    beta = (2 * torch.rand(batch, length, heads, generator=gen)).to(device, dtype)  # [0, 2]
    return [x.requires_grad_() for x in (q, k, v, beta)]


def worst_error(torch, results: dict, leaves) -> float:
    """results {impl: [tensors]} for "naive" and "triton": the largest relative error of Triton's
    tensors and of the gradients of one scalar loss on them with respect to leaves."""
    grads = {}
    for impl, tensors in results.items():
        loss = sum((x.float() * torch.cos(x.float())).sum() for x in tensors)
        grads[impl] = list(torch.autograd.grad(loss, leaves))
    pairs = zip(results["triton"] + grads["triton"], results["naive"] + grads["naive"])
    return max(rel(x, ref) for x, ref in pairs)


def check_rows(torch, kernels, device, shape) -> list[str]:
    """Triton (and fla) vs naive in float32: outputs, final state, exports and every gradient."""
    diag_scan, delta_rule = kernels
    gen = torch.Generator().manual_seed(0)
    batch, length, heads, d = shape
    exports = [length // 4, length - 1]
    rows = []
    a, b, c, h0 = diag_inputs(torch, shape, device, torch.float32, gen)
    pin = torch.randn(batch, heads, d, generator=gen).to(device)
    cases = {"diag, read-out + h0": {}, "diag, exports + pin": {"export_at": exports, "patches": {length // 3: pin}}}
    for name, extra in cases.items():
        results = {}
        for impl in ("naive", "triton"):
            res = diag_scan(a, b, c, initial_state=h0, output_final_state=True, impl=impl, **extra)
            results[impl] = [x for x in (res.output, res.final_state, res.states_at) if x is not None]
        rows.append(f"| {name} | triton vs naive | {worst_error(torch, results, (a, b, c, h0)):.1e} |")
    q, k, v, beta = delta_inputs(torch, shape, device, torch.float32, gen)
    s0 = torch.randn(batch, heads, d, d, generator=gen).to(device).requires_grad_()
    patches = {length // 2: torch.zeros(heads, d, d, device=device)}
    results = {}
    for impl in ("naive", "triton"):
        res = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True, export_at=exports,
                         patches=patches, impl=impl)
        results[impl] = [res.output, res.final_state, res.states_at]
    error = worst_error(torch, results, (q, k, v, beta, s0))
    rows.append(f"| delta, beta in [0, 2], h0, exports + pin | triton vs naive | {error:.1e} |")
    ours = delta_rule(q, k, v, beta, initial_state=s0, output_final_state=True, impl="triton")
    for fla_name, fla_fn in fla_functions(device).items():  # fla keeps the state as keys x values
        o, s = fla_fn(q, k, v, beta, scale=1.0, initial_state=s0.transpose(-1, -2).contiguous(),
                      output_final_state=True)
        error = max(rel(o, ours.output), rel(s.transpose(-1, -2), ours.final_state))
        rows.append(f"| delta, h0 | ours (triton) vs fla {fla_name} | {error:.1e} |")
    return rows


def fla_functions(device: str) -> dict:
    """fla's delta-rule kernels that run here ({} without fla; on the CPU only fused_recurrent)."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
    except ImportError:
        return {}
    found = {"fused_recurrent": fused_recurrent_delta_rule}
    if device == "cuda":
        found["chunk"] = chunk_delta_rule
    return found


def delta_speed_rows(torch, delta_rule, device, shape, dtypes, bench) -> list[str]:
    gen = torch.Generator().manual_seed(1)
    batch, length, heads, _ = shape
    tokens = batch * length
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        q, k, v, beta = delta_inputs(torch, shape, device, dtype, gen)
        runs = {"ours (triton)": lambda: delta_rule(q, k, v, beta, impl="triton").output}
        for fla_name, fla_fn in fla_functions(device).items():
            runs[f"fla {fla_name}"] = lambda fn=fla_fn: fn(q, k, v, beta, scale=1.0)[0]
        times = {}
        for name, run in runs.items():
            forward = bench(lambda: run())
            both = bench(lambda: torch.autograd.grad(run().float().sum(), (q, k, v, beta)))
            times[name] = (forward, both)
        reference = times.get("fla chunk")
        for name, (forward, both) in times.items():
            ratio = f"{reference[0] / forward:.2f}x / {reference[1] / both:.2f}x" if reference else "-"
            rows.append(f"| delta rule | {dtype_name} | {name} | {forward:.2f} | {both:.2f} | "
                        f"{tokens / forward / 1e3:.2f} | {ratio} |")
    return rows


def diag_speed_rows(torch, diag_scan, device, shape, dtypes, bench) -> list[str]:
    gen = torch.Generator().manual_seed(2)
    batch, length, _, _ = shape
    rows = []
    for dtype_name in dtypes:
        a, b, c, _ = diag_inputs(torch, shape, device, getattr(torch, dtype_name), gen)
        for impl in ("triton", "chunked"):
            run = lambda impl=impl: diag_scan(a, b, c, impl=impl).output  # noqa: E731
            forward = bench(run)
            both = bench(lambda: torch.autograd.grad(run().float().sum(), (a, b, c)))
            rows.append(f"| diag scan + read-out | {dtype_name} | {impl} | {forward:.2f} | {both:.2f} | "
                        f"{batch * length / forward / 1e3:.2f} | - |")
    return rows


def naive_rows(torch, kernels, device, sizes) -> list[str]:
    """The naive loops once each (float32, forward only): the slow reference."""
    diag_scan, delta_rule = kernels
    gen = torch.Generator().manual_seed(3)
    rows = []
    with torch.no_grad():
        for name, make, call, shape in (
            ("diag scan + read-out", diag_inputs, lambda x: diag_scan(*x[:3], impl="naive"), sizes["diag"]),
            ("delta rule", delta_inputs, lambda x: delta_rule(*x, impl="naive"), sizes["delta"]),
        ):
            inputs = make(torch, shape, device, torch.float32, gen)
            start = time.perf_counter()
            call(inputs)
            if device == "cuda":
                torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1e3
            speed = shape[0] * shape[1] / ms / 1e3
            rows.append(f"| {name} | float32 | naive (one run) | {ms:.1f} | - | {speed:.2f} | - |")
    return rows


def main(argv=None) -> str:
    args = parse(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    sys.path.insert(0, str(ROOT))
    import torch

    from models.kernels import delta_rule, diag_scan

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("no CUDA device here: run with --smoke for the CPU check of this script")
    sizes = shapes(args.smoke)
    bench = timer(device)
    kernels = (diag_scan, delta_rule)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (TRITON_INTERPRET=1, smoke shapes)"
    import triton

    lines = [f"Device: {name}; torch {torch.__version__}, triton {triton.__version__}, "
             f"fla {'yes' if fla_functions(device) else 'not installed'}.", "",
             f"Correctness, float32, B, T, H, d = {sizes['check']}:", "",
             "| case | compared | max rel. error (outputs, states, gradients) |", "|---|---|---|"]
    lines += check_rows(torch, kernels, device, sizes["check"])
    lines += ["", f"Throughput (delta: B, T, H, d = {sizes['delta']}; diag: B, T, H, N = {sizes['diag']}; "
              "export off; median ms):", "",
              "| kernel | dtype | implementation | fwd ms | fwd+bwd ms | M tokens/s fwd | "
              "vs fla chunk (fwd / fwd+bwd) |",
              "|---|---|---|---|---|---|---|"]
    lines += delta_speed_rows(torch, delta_rule, device, sizes["delta"], sizes["dtypes"], bench)
    lines += diag_speed_rows(torch, diag_scan, device, sizes["diag"], sizes["dtypes"], bench)
    lines += naive_rows(torch, kernels, device, sizes)
    report = "\n".join(lines)
    print(report, flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu.md").write_text(report + "\n")
    return report


if __name__ == "__main__":
    main()
