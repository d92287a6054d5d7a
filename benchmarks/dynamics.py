"""Benchmarks of interp.analysis.dynamics and probes.subspace (issue 6).

1. Jacobian spectra along one sequence of T steps with a state of n = 256: the structured path
   (transition(), closed form) against dense autograd (vmapped jacrev), for
     linear_rnn       dense, time-invariant A                  (H1's mixer)
     token_gated_rnn  dense, input-dependent diag(a_t) A        (H1's mixer)
     mamba            diagonal, input-dependent exp(dt_t A)     (H2's mixer, d_inner 128 x N 2)
   Each path: Jacobians, then full spectra (eigenvalues, singular values); and the restriction to
   a k = 5 subspace (S3 has 6 states, so U has rank 5): Q^T J Q by the structured path against
   k forward-mode products per step (restricted_jacobians, autograd), then its spectra.
2. Drift analysis of 1024 sequences x 1000 steps x n = 256 (float32 states): peak resident memory
   (resource.getrusage ru_maxrss, measured in a fresh child process per variant), streamed (data
   generated and consumed in chunks of 32 sequences) and from one in-memory [N, T, n] array.

Usage: python benchmarks/dynamics.py [--quick]   (prints a markdown section for RESULTS.md)
Single-threaded torch (the machine is a shared 2-core CPU: threads oversubscribe it).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from interp.analysis.dynamics import restricted_jacobians, spectra, step_jacobians, trace  # noqa: E402
from probes.subspace import CentroidAccumulator, DriftAccumulator, centroids, drift, state_subspace, tcross  # noqa: E402

MODELS = {
    "linear_rnn": dict(d_model=256, d_hidden=256),
    "token_gated_rnn": dict(d_model=256, d_hidden=256),
    "mamba": dict(d_model=64, expand=2, d_state=2, n_heads=1),
}


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def jacobian_rows(name: str, length: int) -> list[dict]:
    torch.manual_seed(0)
    model = models.build(name, vocab_size=8, **MODELS[name])
    tokens = torch.randint(0, 8, (1, length), generator=torch.Generator().manual_seed(1))
    t = trace(model, tokens)
    n = math.prod(t.mixer.state_shape)
    basis = torch.linalg.qr(torch.randn(n, 5, generator=torch.Generator().manual_seed(2)))[0]
    warm = {k: v[:, :2] for k, v in t.inputs.items()}                     # first-call overheads of torch.func
    for method in ("structured", "autograd"):
        step_jacobians(t.mixer, warm, t.previous[:, :2], method)
        restricted_jacobians(t.mixer, warm, t.previous[:, :2], basis, method)
    s_jac, structured = timed(lambda: step_jacobians(t.mixer, t.inputs, t.previous, "structured"))
    s_spec, s_spectra = timed(lambda: spectra(structured))
    a_jac, autograd = timed(lambda: step_jacobians(t.mixer, t.inputs, t.previous, "autograd"))
    a_spec, a_spectra = timed(lambda: spectra(autograd))
    err = float((structured.dense() - autograd.values).abs().max())
    radius_err = float((s_spectra.spectral_radius - a_spectra.spectral_radius).abs().max())
    s_res, s_restricted = timed(lambda: spectra(structured.restrict(basis)))
    a_res, a_restricted = timed(
        lambda: spectra(restricted_jacobians(t.mixer, t.inputs, t.previous, basis, "autograd")))
    res_err = float((s_restricted.max_singular_value - a_restricted.max_singular_value).abs().max())
    kind = "diagonal" if structured.diagonal else "dense"
    return [
        dict(model=name, kind=kind, n=n, what="Jacobians only", structured=s_jac, autograd=a_jac, err=err),
        dict(model=name, kind=kind, n=n, what="Jacobians + spectra", structured=s_jac + s_spec,
             autograd=a_jac + a_spec, err=radius_err),
        dict(model=name, kind=kind, n=n, what="restricted to U (k=5) + spectra", structured=s_res,
             autograd=a_res, err=res_err),
    ]


DRIFT_RATE = 1e-3  # drift per step along U of the synthetic states


def synthetic_chunks(n_seq: int, length: int, width: int, chunk: int, seed: int, n_classes: int = 6):
    """(states [c, T, n] float32, labels [c, T]) chunks: centroids + noise + linear drift along U."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(n_classes, width, generator=torch.Generator().manual_seed(0))
    direction = means[1] - means[0]
    direction /= direction.norm()
    steps = torch.arange(1, length + 1, dtype=torch.float32)[None, :, None]
    for start in range(0, n_seq, chunk):
        c = min(chunk, n_seq - start)
        labels = torch.randint(0, n_classes, (c, length), generator=gen)
        states = means[labels] + 0.05 * torch.randn(c, length, width, generator=gen) + DRIFT_RATE * steps * direction
        yield states, labels


def peak_rss_mib() -> float:
    """This process image's resident-memory high-water mark (VmHWM; ru_maxrss would include the
    parent's peak, which Linux carries across fork + exec)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def drift_child(variant: str, n_seq: int, length: int, width: int) -> dict:
    torch.set_num_threads(1)
    baseline = peak_rss_mib()
    start = time.perf_counter()
    if variant == "streamed":
        acc = CentroidAccumulator()
        for states, labels in synthetic_chunks(256, 60, width, 32, seed=1):       # in-distribution: T = 60
            acc.update(states, labels)
        sub = state_subspace(acc.result())
        drifts = DriftAccumulator(sub, statistic=90.0)
        for states, labels in synthetic_chunks(n_seq, length, width, 32, seed=2):
            drifts.update(states, labels)
        result = drifts.result()
    else:
        states = torch.empty(n_seq, length, width)
        labels = torch.empty(n_seq, length, dtype=torch.int64)
        for i, (s, y) in enumerate(synthetic_chunks(n_seq, length, width, 32, seed=2)):
            states[32 * i : 32 * i + len(s)], labels[32 * i : 32 * i + len(s)] = s, y
        sub = state_subspace(centroids(states[:256, :60], labels[:256, :60]))
        result = drift(states, labels, sub, statistic=90.0)
    seconds = time.perf_counter() - start
    peak = peak_rss_mib()
    found = tcross(result)
    return dict(variant=variant, baseline_mb=baseline, peak_mb=peak, seconds=seconds, rank=sub.rank,
                tcross=found.value, estimated=found.estimated, expected=0.5 * sub.M / DRIFT_RATE)


def run_drift(variant: str, n_seq: int, length: int, width: int) -> dict:
    command = [sys.executable, __file__, "--drift-child", variant, "--shape", f"{n_seq},{length},{width}"]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--drift-child", choices=["streamed", "array"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="1024,1000,256", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drift_child:
        print(json.dumps(drift_child(args.drift_child, *map(int, args.shape.split(",")))))
        return
    torch.set_num_threads(1)
    length = 50 if args.quick else 1000
    shape = (64, 100, 256) if args.quick else (1024, 1000, 256)
    print(f"## interp.analysis.dynamics and probes.subspace (benchmarks/dynamics.py{' --quick' if args.quick else ''})\n")
    print(f"Machine: {platform.processor() or platform.machine()}, shared 2-core CPU, torch "
          f"{torch.__version__}, 1 thread.\n")
    print(f"Drift analysis, {shape[0]} sequences x {shape[1]} steps x n = {shape[2]} float32 "
          f"({shape[0] * shape[1] * shape[2] * 4 / 2**30:.2f} GiB of states), 90th-percentile spread:\n")
    print("| variant | peak RSS MiB | RSS after imports MiB | seconds | rank U | Tcross | tau M / rate |")
    print("|---|---|---|---|---|---|---|")
    for variant in ("streamed", "array"):
        r = run_drift(variant, *shape)
        flag = " (estimated)" if r["estimated"] else ""
        print(f"| {variant} | {r['peak_mb']:.0f} | {r['baseline_mb']:.0f} | {r['seconds']:.1f} | {r['rank']} | "
              f"{r['tcross']:.0f}{flag} | {r['expected']:.0f} |", flush=True)

    print(f"\nJacobian spectra, one sequence, T = {length}:\n")
    print("| model | J | n | measured | structured s | autograd s | autograd / structured | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for name in MODELS:
        for row in jacobian_rows(name, length):
            print(f"| {row['model']} | {row['kind']} | {row['n']} | {row['what']} | {row['structured']:.3f} | "
                  f"{row['autograd']:.3f} | {row['autograd'] / max(row['structured'], 1e-9):.1f}x | {row['err']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
