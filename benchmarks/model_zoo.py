"""Forward+backward throughput per model: fast path vs fully cached path, and hook overhead.

    python benchmarks/model_zoo.py [--batch 32] [--length 256] [--repeats 5] [--threads 1]

Measures, in one run on this machine:
  * tokens/s of forward+backward for every registered model (d_model=64, 2 layers), on the fast
    path and with every hook cached (run_with_cache of all names, which forces the per-step path);
  * the tanh RNN, LSTM and GRU, fast and with every hook cached, against the same network written
    with bare torch.nn.RNN / LSTM / GRU (what a user would otherwise run);
  * peak memory of caching hook_state for T=1000 (a fresh subprocess per model: peak RSS
    growth during the cached forward, /proc VmHWM after a reset).
Contenders of one comparison run interleaved in rounds (benchmarks/timing.py: min over rounds,
order alternated); the load average is printed with each table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from torch import nn

import models
from models.kernels.native.library import retain_freed_memory
from timing import interleaved  # benchmarks/timing.py

VOCAB, D_MODEL, N_LAYERS = 16, 64, 2


def fwd_bwd(model, tokens, cached: bool):
    def run():
        model.zero_grad(set_to_none=True)
        if cached:
            logits, _ = model.run_with_cache(tokens)
        else:
            logits = model(tokens)
        logits.float().square().mean().backward()

    return run


BARE = {"tanh_rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


class BareRecurrent(nn.Module):
    """The tanh_rnn / lstm / gru preset's network written with torch.nn only (no hooks, no
    framework): embedding, per layer the torch.nn recurrence and its output projection, unembedding."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.rnns = nn.ModuleList(BARE[name](D_MODEL, D_MODEL, batch_first=True) for _ in range(N_LAYERS))
        self.outs = nn.ModuleList(nn.Linear(D_MODEL, D_MODEL) for _ in range(N_LAYERS))
        self.unembed = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for rnn, out in zip(self.rnns, self.outs):
            x = out(rnn(x)[0])
        return self.unembed(x)


def state_cache_memory(name: str, length: int) -> dict:
    """Run in a subprocess: max RSS growth while caching every hook_state at this length."""
    code = f"""
import json, torch, models

def status_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

torch.manual_seed(0)
model = models.build({name!r}, vocab_size={VOCAB}, d_model={D_MODEL}, n_layers={N_LAYERS})
tokens = torch.randint(0, {VOCAB}, (32, {length}))
names = [n for n in model.hook_names() if n.endswith("hook_state")]
with torch.no_grad():
    model(tokens[:, :8])
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
    before = status_kib("VmRSS")
    _, cache = model.run_with_cache(tokens, names=names)
    peak = status_kib("VmHWM")
print(json.dumps({{"cache_mib": sum(v.numel() * v.element_size() for v in cache.values()) / 2**20,
                   "peak_rss_growth_mib": (peak - before) / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-length", type=int, default=1000, help="0: skip the memory column")
    parser.add_argument("--models", nargs="+", default=None, help="only these models in the zoo table")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: stable ratios on a shared machine)")
    parser.add_argument("--retain-freed-memory", action="store_true",
                        help="models.kernels.native.library.retain_freed_memory() first (opt-in: freed blocks "
                             "reused instead of fresh, zeroed mappings)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.retain_freed_memory:
        print(f"retain_freed_memory: {retain_freed_memory()}")
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.batch, args.length))
    n_tokens = tokens.numel()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, B={args.batch}, "
          f"T={args.length}, d_model={D_MODEL}, layers={N_LAYERS}\n")

    for name in [n for n in BARE if args.models is None or n in args.models]:
        model = models.build(name, vocab_size=VOCAB, d_model=D_MODEL, n_layers=N_LAYERS)
        res = interleaved({"bare": fwd_bwd(BareRecurrent(name), tokens, cached=False),
                           "fast": fwd_bwd(model, tokens, cached=False),
                           "cached": fwd_bwd(model, tokens, cached=True)}, rounds=args.repeats)
        bare, bare_cpu = res["bare"].min, res["bare"].cpu_min
        print(f"{name}: bare torch.nn {n_tokens / bare:,.0f} tok/s; fast / bare {res['fast'].min / bare:.2f}x, "
              f"every hook cached / bare {res['cached'].min / bare:.2f}x (min of {args.repeats} interleaved "
              f"rounds; medians {res['fast'].median / res['bare'].median:.2f}x, "
              f"{res['cached'].median / res['bare'].median:.2f}x; thread CPU time min "
              f"{res['fast'].cpu_min / bare_cpu:.2f}x, {res['cached'].cpu_min / bare_cpu:.2f}x; load {res.load})")

    print("\n| model | fast tok/s | cached tok/s | cached/fast time | cached/fast CPU time | "
          "hook_state cache T=%d (MiB) | peak RSS growth (MiB) | load |" % args.memory_length)
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models or models.list_models():
        model = models.build(name, vocab_size=VOCAB, d_model=D_MODEL, n_layers=N_LAYERS)
        res = interleaved({"fast": fwd_bwd(model, tokens, cached=False),
                           "cached": fwd_bwd(model, tokens, cached=True)}, rounds=args.repeats)
        t_fast, t_cached = res["fast"].min, res["cached"].min
        has_state = any(n.endswith("hook_state") for n in model.hook_names())
        memory = state_cache_memory(name, args.memory_length) if has_state and args.memory_length else None
        mem_cols = (f"{memory['cache_mib']:.1f} | {memory['peak_rss_growth_mib']:.1f}"
                    if memory else "- | -")
        print(f"| {name} | {n_tokens / t_fast:,.0f} | {n_tokens / t_cached:,.0f} | "
              f"{t_cached / t_fast:.2f}x | {res['cached'].cpu_min / res['fast'].cpu_min:.2f}x | {mem_cols} | "
              f"{res.load} |", flush=True)


if __name__ == "__main__":
    main()
