"""Attribution patching vs exact interchange, and run_with_cache(incl_bwd=True) vs forward+backward.

Models: a 2-layer Mamba and a 2-layer Transformer (rotary positions), trained briefly on AR
(4 pairs, 8 keys: T = 11; the training is short on purpose, the machine is shared). Grid: every
position x {hook_resid_pre, mixer.hook_out, mixer.hook_state (Mamba only)} x both layers, N = 256
clean / key-corrupted pairs. Timed side by side in one process, round-robin rounds:

  exact        interp.analysis.interventions.interchange over the grid (as shipped: no-op pairs
               skipped, resumed passes)
  attribution  interp.analysis.interventions.attribute over the same grid (one clean forward,
               one corrupted forward with every hook's gradient)
  fwd+bwd      a plain forward and backward of the summed answer probability (the fast path)
  incl_bwd     run_with_cache(tokens, incl_bwd=True, metric=...) of every grid hook

Reported: the speed-up of attribution over exact (target >= 50x), the Pearson r between the two
over every kept (site, example) pair and over the per-site means, and incl_bwd / fwd+bwd
(target <= 2x). Times are medians over the rounds.

    python benchmarks/attribution.py [--steps 600] [--rounds 3] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

import models
from interp.analysis.interventions import Site, answer_positions, attribute, corrupt_ar, interchange
from interp.tasks import make_task
from interp.training.evaluate import final_state_accuracy
from interp.training.train import TrainConfig, train
from models.registry import preset_config

PAIRS, KEYS, N = 4, 8, 256


def trained(name: str, task, steps: int):
    extra = {"mamba": dict(d_state=8, d_conv=4), "transformer": dict(positional="rope")}[name]
    cfg = preset_config(name, vocab_size=task.vocab_size, d_model=64, n_layers=2, **extra)
    lr = 1e-3 if name == "transformer" else 3e-3
    run = train(cfg, task, TrainConfig(steps=steps, batch_size=32, lr=lr, warmup=50, train_length=PAIRS,
                                       eval_every=steps, eval_size=256, log_every=steps, checkpoint_every=steps),
                progress=False, label=name)
    return run.model.eval()


def grid(model, length: int) -> list[Site]:
    hooks = ["hook_resid_pre", "mixer.hook_out", "mixer.hook_state"]
    return [Site(f"blocks.{l}.{h}", t) for l in range(2) for h in hooks
            if f"blocks.{l}.{h}" in model.hook_names() for t in range(length)]


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    keep = np.isfinite(a) & np.isfinite(b)
    return float(np.corrcoef(a[keep], b[keep])[0, 1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    task = make_task("AR", n_keys=KEYS, n_values=KEYS)
    clean = task.sample(N, PAIRS, seed=2)
    corrupt = corrupt_ar(clean, task, seed=3)
    rows = torch.arange(N)
    at = answer_positions(clean)  # the query position: the answer is predicted there
    y = clean.targets[rows, at]

    def metric(logits):
        return logits[rows, at].softmax(-1)[rows, y].sum()

    setups = {}
    for name in ("mamba", "transformer"):
        model = trained(name, task, args.steps)
        sites = grid(model, clean.tokens.shape[1])
        setups[name] = (model, sites, final_state_accuracy(model, task, PAIRS, 512, 1))
    times = {name: {k: [] for k in ("exact", "attribution", "fwd+bwd", "incl_bwd")} for name in setups}
    results = {}
    for _ in range(args.rounds):
        for name, (model, sites, _) in setups.items():
            hooks = sorted({s.hook for s in sites})
            start = time.perf_counter()
            results[name, "exact"] = interchange(model, clean, corrupt, sites, min_effect=0.01)
            times[name]["exact"].append(time.perf_counter() - start)
            start = time.perf_counter()
            results[name, "attribution"] = attribute(model, clean, corrupt, sites, min_effect=0.01)
            times[name]["attribution"].append(time.perf_counter() - start)
            start = time.perf_counter()
            metric(model(corrupt.tokens)).backward()
            times[name]["fwd+bwd"].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            model.run_with_cache(corrupt.tokens, names=hooks, incl_bwd=True, metric=metric)
            times[name]["incl_bwd"].append(time.perf_counter() - start)
    load = os.getloadavg()[0]
    lines = ["| model | AR accuracy | sites x pairs (kept) | exact s | attribution s | speed-up | r (pairs) "
             "| r (site means) | fwd+bwd ms | incl_bwd ms | incl_bwd / fwd+bwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (model, sites, acc) in setups.items():
        med = {k: statistics.median(v) for k, v in times[name].items()}
        exact, estimate = results[name, "exact"], results[name, "attribution"]
        kept = exact.kept.numpy()
        r_pairs = pearson(exact.restoration[:, kept].numpy().ravel(), estimate.restoration[:, kept].numpy().ravel())
        r_means = pearson(exact.mean().numpy(), estimate.mean().numpy())
        lines.append(f"| {name} | {acc:.3f} | {len(sites)} x {N} ({exact.n_kept}) | {med['exact']:.2f} | "
                     f"{med['attribution']:.3f} | {med['exact'] / med['attribution']:.0f}x | {r_pairs:.3f} | "
                     f"{r_means:.3f} | {1e3 * med['fwd+bwd']:.1f} | {1e3 * med['incl_bwd']:.1f} | "
                     f"{med['incl_bwd'] / med['fwd+bwd']:.2f}x |")
    lines.append(f"\n{args.rounds} rounds, medians; load average {load:.1f} at the end; "
                 f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
