"""EAP and EAP-IG on every edge of real-size models against one forward + backward, and the
throughput of exact edge patching.

Models: GPT-2 small and Mamba-130m at their real configurations with random weights
(benchmarks/real_configs.py, converted by models.from_pretrained), float32, one thread. Pair: N
random token sequences of length T (default 8 x 64), the corrupted copy with positions T/4 and
T/2 redrawn; metric the logit difference at the last position (the clean target a random token).

  fwd+bwd   one forward of the clean tokens (logits at the last position) and a backward of the
            summed metric to every parameter
  eap       interp.analysis.circuits.eap over the whole graph (clean and corrupted forwards, one
            forward and one backward with the receivers' leaves, the scores)
  eap-ig    eap_ig with --steps steps (default 8), as many steps per pass as the default budget fits
  patching  (model "small": a 2-layer d 64 attention model with 4 heads, random weights, vocabulary
            64) edge_effects of every edge at once (the rows of all edges in one pass): edges per
            second, and rescore of the top half of the edges

Each (model, method, round) runs in its own process, the methods interleaved round by round (peak
memory: that process's ru_maxrss growth over the loaded model; time: the minimum over the rounds,
each printed with the load average at its start). Targets: eap <= 3x fwd+bwd, eap-ig <= 3 k x.
--lock PATH takes that lock (flock) around each measurement only, so that other measurements may
run between them; without it wrap the whole run in `flock /tmp/interp-bench.lock`.

    python benchmarks/circuits.py [--models gpt2,mamba,small] [--methods fwd+bwd,eap,eap-ig,patching]
                                  [--n 8] [--length 64] [--steps 8] [--rounds 2] [--lock /tmp/interp-bench.lock]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import subprocess
import sys
import time

import torch

METHODS = ("fwd+bwd", "eap", "eap-ig", "patching")
SMALL = dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4)  # the "small" model: AR-run sized attention


def pair(name: str, n: int, length: int):
    from interp.tasks.base import Batch

    clean_tokens = tokens(name, n, length, seed=0)
    corrupt_tokens = clean_tokens.clone()
    for t in (length // 4, length // 2):
        corrupt_tokens[:, t] = tokens(name, n, 1, seed=t)[:, 0]
    targets = tokens(name, n, length, seed=1)
    mask = torch.zeros(n, length, dtype=torch.bool)
    mask[:, -1] = True
    states = torch.zeros(n, length, dtype=torch.long)
    return Batch(clean_tokens, targets, mask, states, {}), Batch(corrupt_tokens, targets, mask, states, {})


def tokens(name: str, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    if name == "small":
        return torch.randint(0, SMALL["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))
    from real_configs import tokens as real_tokens  # benchmarks/real_configs.py

    return real_tokens(name, batch, length, seed)


def load(name: str):
    import models

    if name == "small":
        torch.manual_seed(0)
        return models.build("attention", **SMALL).eval()
    from real_configs import build_source

    return models.from_pretrained(build_source(name)).eval()


@contextlib.contextmanager
def locked(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measure(name: str, method: str, n: int, length: int, steps: int, lock: str | None) -> dict:
    """One (model, method) round in this process: {"seconds", "peak_bytes", "edges", "load"} (and
    for patching "edges_per_second", "rescore_seconds")."""
    from interp.analysis.circuits import build_graph, eap, eap_ig, edge_effects, rescore, setup

    torch.set_num_threads(1)
    model = load(name)
    clean, corrupt = pair(name, n, length)
    graph = build_graph(model)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    extra = {}

    def fwd_bwd():
        at = torch.full((n,), length - 1)
        logits = model(clean.tokens, at=at)
        y, rival = clean.targets[:, -1], corrupt.tokens[:, 0]
        (logits.gather(1, y[:, None]) - logits.gather(1, rival[:, None])).sum().backward()
        model.zero_grad(set_to_none=True)

    def patching():
        scored = setup(model, clean, corrupt, graph=graph)
        start = time.perf_counter()
        edge_effects(model, scored, torch.arange(graph.n_edges))
        extra["edges_per_second"] = graph.n_edges / (time.perf_counter() - start)
        scores = eap(model, clean, corrupt, graph=graph)
        start = time.perf_counter()
        rescore(model, scores, k=graph.n_edges // 2)
        extra["rescore_seconds"] = time.perf_counter() - start

    run = {"fwd+bwd": fwd_bwd, "patching": patching,
           "eap": lambda: eap(model, clean, corrupt, graph=graph),
           "eap-ig": lambda: eap_ig(model, clean, corrupt, steps=steps, graph=graph, progress=False)}[method]
    with locked(lock):
        load_average = os.getloadavg()[0]
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"seconds": seconds, "peak_bytes": peak, "edges": graph.n_edges, "load": load_average, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,mamba,small")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lock", default=None)
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, args.n, args.length, args.steps, args.lock)))
        return
    methods = [m for m in args.methods.split(",")]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; allowed {list(METHODS)}")
    for name in args.models.split(","):
        wanted = [m for m in methods if (m == "patching") == (name == "small")]
        rows: dict[str, list[dict]] = {m: [] for m in wanted}
        for round_ in range(args.rounds):
            for method in wanted:
                out = subprocess.run([sys.executable, __file__, "--one", name, method, "--n", str(args.n), "--length",
                                      str(args.length), "--steps", str(args.steps)]
                                     + (["--lock", args.lock] if args.lock else []), capture_output=True, text=True)
                if out.returncode:
                    print(f"  {name} {method}: failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
                    continue
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows[method].append(row)
                print(f"  round {round_} {name} {method}: {row['seconds']:.2f} s (load {row['load']:.1f})", flush=True)
        report(name, rows, args)


def report(name: str, rows: dict[str, list[dict]], args) -> None:
    from models.memory import format_bytes

    done = {m: r for m, r in rows.items() if r}
    if not done:
        return
    edges = next(iter(done.values()))[0]["edges"]
    print(f"{name} ({edges} edges, N={args.n}, T={args.length}):")
    base = min(r["seconds"] for r in done["fwd+bwd"]) if "fwd+bwd" in done else None
    for method, runs in done.items():
        best = min(r["seconds"] for r in runs)
        peak = max(r["peak_bytes"] for r in runs)
        loads = f"load {min(r['load'] for r in runs):.1f}-{max(r['load'] for r in runs):.1f}"
        ratio = f"{best / base:6.1f}x fwd+bwd" if base else ""
        line = f"  {method:8s} {best:8.2f} s  {ratio}  peak +{format_bytes(peak)}  ({loads})"
        if method == "patching":
            line += (f"  edge_effects {max(r['edges_per_second'] for r in runs):.0f} edges/s, rescore of "
                     f"{edges // 2} edges {min(r['rescore_seconds'] for r in runs):.2f} s")
        print(line)


if __name__ == "__main__":
    main()
