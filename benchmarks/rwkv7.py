"""The RWKV-7 scan on the CPU, forward + backward: the native C loops (rwkv7_scan impl="native",
its checkpointed backward) against autograd through the naive torch loop (impl="naive") and
fla's CPU-runnable references (fla.ops.generalized_delta_rule.dplr.naive: dplr_recurrence, the
step loop, and dplr_chunkwise, its chunked form); fla's chunk_rwkv7 is a Triton kernel and is
tried too (on a machine without a GPU it refuses; the table says so).

    PYTHONPATH=$PWD python benchmarks/rwkv7.py [--batch 1 --length 512 --heads 12 --dim 64 --rounds 5]

One thread, float32, RWKV-7-formed inputs (a = -kappa, b = kappa * alpha, w in [-e^{-1/2}, 0)),
the loss sum(o * weights) with fixed weights. Time: every contender's forward + backward in the
interleaved rounds of benchmarks/timing.py (minimum and median wall time, minimum thread CPU
time, the load average before and after). Peak memory: each contender in a fresh interpreter,
after an untimed warm-up at T 32 (a warm-up at full size leaves freed blocks that the measured run
reuses), the peak resident memory of one forward + backward above the resident memory just
before it, the inputs made (VmHWM - VmRSS, /proc/self/status). The fla rows check
their output against the native one (max |difference|).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

CONTENDERS = ("native", "naive", "fla_recurrence", "fla_chunkwise", "fla_chunk_rwkv7")


def setup(batch: int, length: int, heads: int, dim: int, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, length, heads, dim)
    r, k, kk, alpha = (torch.randn(shape, generator=gen) for _ in range(4))
    kk = torch.nn.functional.normalize(kk, dim=-1)
    inputs = {"r": r, "w": -0.6 * torch.rand(shape, generator=gen), "k": k,
              "v": torch.randn(shape, generator=gen), "a": -kk, "b": kk * torch.sigmoid(alpha)}
    return {"leaves": {n: x.requires_grad_() for n, x in inputs.items()},
            "weights": torch.randn(shape, generator=gen)}


def output(name: str, x: dict) -> torch.Tensor:
    """The contender's o [B, T, H, V] from the leaves x."""
    from models.kernels.rwkv7 import rwkv7_scan

    if name in ("native", "naive"):
        return rwkv7_scan(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"], impl=name).output
    q = x["r"] * x["r"].shape[-1] ** 0.5  # fla's references scale q by K^-1/2
    args = [t.transpose(1, 2) for t in (q, x["k"], x["v"], x["a"], x["b"], x["w"])]
    if name == "fla_chunk_rwkv7":
        from fla.ops.rwkv7 import chunk_rwkv7

        return chunk_rwkv7(x["r"], x["w"], x["k"], x["v"], x["a"], x["b"], scale=1.0)[0]
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_chunkwise, dplr_recurrence

    fn = dplr_recurrence if name == "fla_recurrence" else dplr_chunkwise
    return fn(*args, output_final_state=False)[0].transpose(1, 2)


def step(name: str, problem: dict) -> None:
    """One forward + backward of sum(o * weights); the leaves' gradients cleared."""
    for leaf in problem["leaves"].values():
        leaf.grad = None
    (output(name, problem["leaves"]) * problem["weights"]).sum().backward()


def _peak(name: str, batch: int, length: int, heads: int, dim: int) -> dict:
    """One contender's peak resident memory of a forward + backward (run in a fresh interpreter)."""
    from benchmarks.scan_memory import _status

    torch.set_num_threads(1)
    step(name, setup(batch, min(length, 32), heads, dim))  # warm-up at T 32 (fla_chunkwise: a multiple of 32)
    problem = setup(batch, length, heads, dim)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    step(name, problem)
    return {"name": name, "peak_mb": round((_status("VmHWM") - before) / 2**20, 1)}


def peak(name: str, *size: int) -> dict:
    code = f"from benchmarks.rwkv7 import _peak; import json; print(json.dumps(_peak({name!r}, *{size!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"name": name, "error": done.stderr.strip().splitlines()[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from timing import interleaved  # benchmarks/timing.py

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("batch", 1), ("length", 512), ("heads", 12), ("dim", 64), ("rounds", 5)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = (args.batch, args.length, args.heads, args.dim)
    problem = setup(*size)
    with torch.no_grad():
        reference = output("native", problem["leaves"])
    runnable, notes = {}, {}
    for name in CONTENDERS:
        try:
            with torch.no_grad():
                notes[name] = f"max |o - native| {(output(name, problem['leaves']) - reference).abs().max():.1e}"
            runnable[name] = lambda name=name: step(name, problem)
        except Exception as err:  # noqa: BLE001  (a contender that cannot run here is reported, not fatal)
            notes[name] = f"does not run here: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
    rounds = interleaved(runnable, rounds=args.rounds)
    memory = {name: peak(name, *size) for name in runnable}
    base, base_mem = rounds["native"], memory["native"].get("peak_mb")
    print(f"B {args.batch}, T {args.length}, H {args.heads}, K = V = {args.dim}, float32, one thread; "
          f"load {rounds.load}")
    print("| contender | fwd+bwd min ms | median ms | CPU min ms | x native (CPU) | peak MB | x native | note |")
    print("|---|---|---|---|---|---|---|---|")
    for name in CONTENDERS:
        if name not in runnable:
            print(f"| {name} | - | - | - | - | - | - | {notes[name]} |")
            continue
        t, mb = rounds[name], memory[name].get("peak_mb")
        ratio = "-" if mb is None or not base_mem else f"{mb / base_mem:.1f}x"
        print(f"| {name} | {t.min * 1e3:.1f} | {t.median * 1e3:.1f} | {t.cpu_min * 1e3:.1f} | "
              f"{t.cpu_min / base.cpu_min:.1f}x | {mb if mb is not None else memory[name]['error']} | {ratio} | "
              f"{notes[name]} |")


if __name__ == "__main__":
    main()
