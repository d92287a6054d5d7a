"""Attribution patching vs exact interchange and pyvene, and run_with_cache(incl_bwd=True) vs forward+backward.

Models: a 2-layer Mamba and a 2-layer Transformer (rotary positions), d_model 64, trained on AR
(--pairs pairs, keys and values from 2 x pairs each; default 4 pairs: T = 12) until they solve it
in distribution; the run directories (--runs, default runs/bench-attribution/{mamba,transformer})
are reused by a rerun, so only the first run trains (at 4 pairs about 4 min Mamba, 2 min
Transformer on one idle core; train under nice). Grid: every position x {hook_resid_pre,
mixer.hook_out, mixer.hook_state (Mamba only)} x both layers, N = 256 clean / key-corrupted pairs.
Timed side by side in one process (benchmarks/timing.interleaved: every contender once per round,
the order reversed every other round):

  exact        interp.analysis.interventions.interchange over the grid as shipped (no-op pairs
               skipped, each pair resumed from its site's block and position)
  exact-naive  the same with skip_noops=False, resume=False: a whole corrupted pass per site
               (what attribution patching is usually weighed against)
  pyvene       the peer library on the same model and sites (benchmarks/pyvene_peer.py: one
               IntervenableModel and one call, a source and a base pass, per site); skipped,
               saying so, where pyvene is not installed
  pyvene-cached  the same with the clean activations collected once and handed to pyvene as
               source_representations: one base pass per site (pyvene at its most frugal)
  attribution  interp.analysis.interventions.attribute over the same grid (one clean forward,
               one corrupted forward and one backward with every grid hook's gradient)
  fwd+bwd      a plain forward and backward (parameter gradients) of the summed answer probability
  incl_bwd     run_with_cache(tokens, incl_bwd=True, metric=...) of every grid hook

Reported: the speed-ups of attribution over exact, exact-naive and both pyvene runs (target
>= 50x), the max abs difference of pyvene's patched probabilities from exact interchange's (the
same computation), the Pearson r between attribution and exact restorations over every kept (site,
example) pair, over the pairs where either is nonzero (a pair before the corrupted key is 0 in
both), over the per-site means, and the median over sites of the per-site r across examples, for
the answer probability and (metrics=["logit_diff"], run once outside the timed rounds) the logit
difference; incl_bwd / fwd+bwd (target <= 2x). --scaling gives the speed table on longer
documents (untrained models of the same shapes). Times: minimum wall time over the rounds (median
beside it) and the minimum CPU time of the calling thread (torch runs one thread here, so that is
the work done; it stays meaningful when other processes load the machine), with the load average
before and after the rounds.

    python benchmarks/attribution.py [--runs DIR] [--pairs 4] [--steps 4000] [--rounds 5] [--models mamba,transformer]
                                     [--scaling 8,16] [--scaling-rounds R] [--warmup 1] [--no-table] [--train-only]
"""

from __future__ import annotations

import argparse
import os

import torch

from interp.analysis.interventions import Site, agreement, answer_positions, attribute, corrupt_ar, interchange
from interp.tasks import make_task
from interp.training.evaluate import final_state_accuracy
from interp.training.train import TrainConfig, train
from models.backbone import SequenceModel
from models.registry import preset_config
from pyvene_peer import PyveneGrid, available  # benchmarks/pyvene_peer.py
from timing import interleaved, load_average  # benchmarks/timing.py

N = 256
MODELS = ("mamba", "transformer")
METHODS = ("exact", "exact-naive", "pyvene", "pyvene-cached", "attribution")


def config(name: str, vocab_size: int):
    extra = {"mamba": dict(d_state=8, d_conv=4), "transformer": dict(positional="rope")}[name]
    return preset_config(name, vocab_size=vocab_size, d_model=64, n_layers=2, **extra)


def trained(name: str, task, pairs: int, steps: int, runs: str):
    """The benchmark's model, trained on `pairs` pairs in (or reloaded from) the run directory runs/name."""
    cfg = config(name, task.vocab_size)
    lr = 1e-3 if name == "transformer" else 3e-3
    run = train(cfg, task, TrainConfig(steps=steps, batch_size=64, lr=lr, warmup=100, train_length=pairs,
                                       eval_every=500, eval_size=512, log_every=100, checkpoint_every=500),
                out=os.path.join(runs, name), resume=True, progress=False, label=name)
    return run.model.eval()


def grid(model, length: int) -> list[Site]:
    hooks = ["hook_resid_pre", "mixer.hook_out", "mixer.hook_state"]
    return [Site(f"blocks.{l}.{h}", t) for l in range(2) for h in hooks
            if f"blocks.{l}.{h}" in model.hook_names() for t in range(length)]


def speed_contenders(name: str, model, clean, corrupt, results: dict, peer: str | None) -> dict:
    """The timed methods over the grid (module docstring): {label: fn}, each fn storing its result
    in results[name, method]; pyvene only where `peer` (why it is missing) is None."""
    sites = grid(model, clean.tokens.shape[1])

    def run(key, fn):
        def go():
            results[name, key] = fn()
        return go

    out = {
        f"{name} exact": run("exact", lambda: interchange(model, clean, corrupt, sites, min_effect=0.01)),
        f"{name} exact-naive": run("exact-naive", lambda: interchange(
            model, clean, corrupt, sites, min_effect=0.01, skip_noops=False, resume=False)),
        f"{name} attribution": run("attribution", lambda: attribute(model, clean, corrupt, sites, min_effect=0.01)),
    }
    if peer is None:
        per_site, cached = PyveneGrid(model), PyveneGrid(model, cached_sources=True)  # built outside the timing
        out[f"{name} pyvene"] = run("pyvene", lambda: per_site(clean, corrupt, sites))
        out[f"{name} pyvene-cached"] = run("pyvene-cached", lambda: cached(clean, corrupt, sites))
    return out


def speed_table(models: dict, clean, rounds, results: dict, accuracy: dict, peer: str | None) -> None:
    """One markdown row per model: times (min wall (median) / min CPU), speed-ups of attribution
    (wall (CPU)) and how far pyvene's patched probabilities are from exact interchange's."""
    length = clean.tokens.shape[1]
    print("| model | T | AR acc | sites x pairs (kept) | exact pairs run / skipped (passes) | exact | exact-naive | "
          "pyvene | pyvene-cached | attribution | vs exact | vs exact-naive | vs pyvene | vs pyvene-cached "
          "| max abs diff p pyvene (-cached) vs exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in models:
        t = {k: rounds[f"{name} {k}"] for k in METHODS if f"{name} {k}" in rounds.timings}
        exact = results[name, "exact"]
        cell = " | ".join(f"{t[k].min:.3f} ({t[k].median:.3f}) / {t[k].cpu_min:.3f}" if k in t else "-" for k in METHODS)
        ratio = " | ".join(f"{t[k].min / t['attribution'].min:.1f}x ({t[k].cpu_min / t['attribution'].cpu_min:.1f}x)"
                           if k in t else "-" for k in METHODS[:4])
        agree = (" ".join(f"{(results[name, k] - exact.p_patched).abs().max().item():.1e}"
                          for k in ("pyvene", "pyvene-cached")) if "pyvene" in t else f"not run: {peer}")
        acc = f"{accuracy[name]:.3f}" if name in accuracy else "untrained"
        print(f"| {name} | {length} | {acc} | {len(exact.sites)} x {len(clean)} ({exact.n_kept}) | {exact.n_run} / "
              f"{exact.n_skipped} ({exact.n_passes}) | {cell} | {ratio} | {agree} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/bench-attribution")
    p.add_argument("--pairs", type=int, default=4, help="pairs per document of the trained models "
                   "(keys and values from 2 x pairs each; T = 2 pairs + 4)")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    p.add_argument("--scaling", default="", help="also time the grid at these numbers of pairs on untrained "
                   "models (comma-separated; longer documents, every position: timing and agreement only)")
    p.add_argument("--scaling-rounds", type=int, default=None, help="rounds of the --scaling rows (default --rounds)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed ones")
    p.add_argument("--no-table", action="store_true", help="skip the trained models (only the --scaling rows)")
    p.add_argument("--train-only", action="store_true", help="train (or reload) the models and stop")
    args = p.parse_args()
    names = [n for n in args.models.split(",") if n]
    if not names or any(n not in MODELS for n in names):
        raise ValueError(f"--models must name some of {MODELS}; got {args.models!r}")
    torch.set_num_threads(args.threads)
    peer = available()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); pyvene: "
          f"{'installed' if peer is None else 'missing (' + peer + '): its column is skipped'}")
    if not args.no_table:
        table(names, args, peer)
    for pairs in [int(n) for n in args.scaling.split(",") if n]:
        scaling(names, pairs, args.scaling_rounds or args.rounds, args.warmup, peer)
    print(f"\nload average at the end: {load_average():.1f}")


def table(names: list[str], args, peer: str | None) -> None:
    """The trained models: speed table, correlations, incl_bwd vs fwd+bwd."""
    task = make_task("AR", n_keys=2 * args.pairs, n_values=2 * args.pairs)
    models = {name: trained(name, task, args.pairs, args.steps, args.runs) for name in names}
    accuracy = {name: final_state_accuracy(m, task, args.pairs, 1024, 1) for name, m in models.items()}
    print("AR accuracy (1024 fresh examples):", {k: round(v, 4) for k, v in accuracy.items()})
    if args.train_only:
        return
    clean = task.sample(N, args.pairs, seed=2)
    corrupt = corrupt_ar(clean, task, seed=3)
    rows = torch.arange(N)
    at = answer_positions(clean)  # the query position: the answer is predicted there
    y = clean.targets[rows, at]

    def metric(logits):
        return logits[rows, at].softmax(-1)[rows, y].sum()

    results, contenders = {}, {}
    for name, model in models.items():
        hooks = sorted({s.hook for s in grid(model, clean.tokens.shape[1])})
        contenders |= speed_contenders(name, model, clean, corrupt, results, peer)
        contenders |= {
            f"{name} fwd+bwd": lambda m=model: (metric(m(corrupt.tokens)).backward(), m.zero_grad()),
            f"{name} incl_bwd": lambda m=model, h=hooks: m.run_with_cache(
                corrupt.tokens, names=h, incl_bwd=True, metric=metric),
        }
    rounds = interleaved(contenders, rounds=args.rounds, warmup=args.warmup)
    for name, model in models.items():  # the logit difference too (untimed: one more fwd+bwd each)
        sites = grid(model, clean.tokens.shape[1])
        results[name, "exact-ld"] = interchange(model, clean, corrupt, sites, min_effect=0.01, metrics=["logit_diff"])
        results[name, "attribution-ld"] = attribute(model, clean, corrupt, sites, min_effect=0.01, metrics=["logit_diff"])
    print(f"\ntrained models, {args.pairs} pairs: {args.rounds} rounds after {args.warmup} untimed; load average {rounds.load} (2 cores); "
          "times: min wall s (median) / min CPU s; speed-ups of attribution: wall (CPU)\n")
    speed_table(models, clean, rounds, results, accuracy, peer)
    print("\n| model | restoration of | r pairs | r nonzero pairs (n) | r site means | median per-site r |")
    print("|---|---|---|---|---|---|")
    for name in models:
        for of, key in (("restoration", ""), ("logit_diff_restoration", "-ld")):
            r = agreement(results[name, "exact" + key], results[name, "attribution" + key], of)
            quantity = "logit(y) - logit(y')" if key else "p(y)"
            print(f"| {name} | {quantity} | {r['r_pairs']:.3f} | "
                  f"{r['r_nonzero']:.3f} ({r['n_nonzero']}) | {r['r_site_means']:.3f} | {r['r_site_median']:.3f} |")
    print("\n| model | fwd+bwd ms | incl_bwd ms | incl_bwd / fwd+bwd (CPU) |")
    print("|---|---|---|---|")
    for name in models:
        fb, ib = rounds[f"{name} fwd+bwd"], rounds[f"{name} incl_bwd"]
        print(f"| {name} | {1e3 * fb.min:.1f} ({1e3 * fb.cpu_min:.1f} CPU) | {1e3 * ib.min:.1f} "
              f"({1e3 * ib.cpu_min:.1f} CPU) | {ib.min / fb.min:.2f}x ({ib.cpu_min / fb.cpu_min:.2f}x) |")


def scaling(names: list[str], pairs: int, rounds: int, warmup: int, peer: str | None) -> None:
    """The speed table on documents of `pairs` pairs (keys and values from 2 x pairs each), on
    untrained models of the same shapes: the work of every method does not depend on the weights
    (exact runs every pair that is not a no-op, whatever min_effect later drops), so these are
    timings (and pyvene's agreement) only."""
    task = make_task("AR", n_keys=2 * pairs, n_values=2 * pairs)
    clean = task.sample(N, pairs, seed=4)
    corrupt = corrupt_ar(clean, task, seed=5)
    torch.manual_seed(0)
    models = {name: SequenceModel(config(name, task.vocab_size)).eval() for name in names}
    results, contenders = {}, {}
    for name, model in models.items():
        contenders |= speed_contenders(name, model, clean, corrupt, results, peer)
    result = interleaved(contenders, rounds=rounds, warmup=warmup)
    print(f"\nuntrained models, {pairs} pairs: {rounds} rounds after {warmup} untimed; load average {result.load} (2 cores)\n")
    speed_table(models, clean, result, results, {}, peer)


if __name__ == "__main__":
    main()
