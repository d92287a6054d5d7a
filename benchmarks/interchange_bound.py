"""The arithmetic floor of an exact interchange grid on this machine: every (site, example) pair
must recompute layers l.. at positions p.. (a resumed pass) and unembed its answer position, so
the grid of every position x hook x layer costs at least sum over sites of (L - l)(T - p) N
(layer, position, example) units, each priced at a forward's non-unembedding CPU time / (L T N).

    PYTHONPATH=. python benchmarks/interchange_bound.py mamba 64

Measured 2026-12-03 (one thread, load 5): Mamba-130m T 64: forward 2.12 CPU-s (unembedding 0.50 s),
4608 sites, floor 2012 CPU-s = 2.29 sites per CPU-s; GPT-2 T 64: 1536 sites, 2.95 sites per CPU-s.
`interchange` measured 1.47 (Mamba) and 2.80 (GPT-2) sites/s on the same grids (RESULTS.md).
"""
import sys
import time

import torch

import models
from benchmarks.real_configs import build_source, tokens

N = 8  # clean / corrupt pairs, as in benchmarks/interchange_real_size.py


def cpu_seconds(fn, rounds: int = 3) -> float:
    """The least CPU time of fn() over rounds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main(name: str, length: int) -> None:
    torch.set_num_threads(1)
    model = models.from_pretrained(build_source(name)).eval()
    ids = tokens(name, N, length, seed=1)
    layers, d_model, vocab = model.cfg.n_layers, model.cfg.d_model, model.cfg.vocab_size
    hidden, unembedding = torch.randn(N * length, d_model), torch.randn(vocab, d_model)
    with torch.no_grad():
        model(ids)
        forward = cpu_seconds(lambda: model(ids))
        unembed = cpu_seconds(lambda: hidden @ unembedding.T)  # [N T, vocab]
    unit = (forward - unembed) / (layers * length * N)  # CPU s per (layer, position, example)
    hooks = 2 if name in ("gpt2", "llama") else 3  # resid_pre, mixer out (+ hook_state)
    units = hooks * sum((layers - l) * (length - p) for l in range(layers) for p in range(length))  # per example
    sites = hooks * layers * length
    floor = units * N * unit + sites * unembed / length  # + one answer row per (site, example)
    print(f"{name} T {length}: forward {forward:.2f} CPU-s (unembedding {unembed:.2f} s); {sites} sites; "
          f"floor {floor:.0f} CPU-s = {sites / floor:.2f} sites per CPU-s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
