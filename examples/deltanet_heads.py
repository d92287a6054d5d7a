"""Which DeltaNet head carries the permutation in REPL traces, and does it need beta > 1?

    python examples/deltanet_heads.py [--out runs/deltanet_heads] [--quick]

Trains DeltaNet with beta scale 1 (eigenvalues in [0, 1]) and scale 2 ([-1, 1]), a Transformer and
a tanh RNN on S3 REPL traces (swap statements, a print of all variables every 2 statements, loss
on the printed values), then writes RUN/report.html with: reveal accuracy vs trace length per
model; per-head beta histograms; reveal accuracy with each head's beta clamped to [0, 1] (and
pinned to its mean); state effective rank per head; and, on PFSA-SR, the mass of the linear
(unnormalised) belief recursion and the state norms of a trained DeltaNet and tanh RNN over time,
with ridge probes from their states to the exact belief. Finished runs in --out are reused.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import numpy as np
import torch

import models
from interp.analysis import heads
from interp.report import evaluation, heads as head_figures
from interp.report.html import Table, Text, write_report
from interp.tasks import make_task
from interp.training.train import TrainConfig, train

SIZE = dict(d_model=32, n_layers=2)
MODELS = {"deltanet[0,1]": ("deltanet", dict(n_heads=4)), "deltanet[-1,1]": ("deltanet_neg", dict(n_heads=4)),
          "transformer": ("transformer", dict(n_heads=4)), "tanh_rnn": ("tanh_rnn", dict(d_hidden=64))}


def trained(out: Path, label: str, preset: str, overrides: dict, task, cfg: TrainConfig):
    """Train (or reload) one model into out/<label>."""
    run = out / label.replace("[", "_").replace("]", "").replace(",", "_")
    if models.registry.weights_file(run).exists():
        return models.load(run).eval()
    config = models.preset_config(preset, vocab_size=task.vocab_size, **SIZE, **overrides)
    return train(config, task, cfg, run, progress=True, label=label).model.eval()


def clamped_accuracy(model, batch, layer_heads) -> float:
    """Reveal accuracy with beta clamped to [0, 1] in every (layer, head) listed at once."""
    with contextlib.ExitStack() as stack:
        for layer, head in layer_heads:
            stack.enter_context(heads.beta_clamped(model, layer, head, 0.0, 1.0))
        return heads.reveal_accuracy(model, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/deltanet_heads"))
    parser.add_argument("--quick", action="store_true", help="toy sizes (a smoke test)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps, length, n_eval = (30, 4, 32) if args.quick else (300, 6, 256)
    repl = make_task("REPL", n_vars=3, reveal_every=2, reveal_fraction=1.0, loss="reveals")
    cfg = TrainConfig(steps=steps, batch_size=32, lr=3e-3, warmup=steps // 10, train_length=length,
                      eval_every=steps, eval_size=64, checkpoint_every=steps)

    # 1. REPL: train, reveal accuracy by trace length
    trained_models = {label: trained(args.out / "repl", label, preset, extra, repl, cfg)
                      for label, (preset, extra) in MODELS.items()}
    lengths = [length // 2, length, 2 * length, 4 * length]
    by_length = {label: heads.reveal_accuracy_by_length(m, repl, lengths, n=n_eval)
                 for label, m in trained_models.items()}

    # 2. heads of both DeltaNets: beta statistics, state ranks, ablations
    batch = repl.sample(n_eval, length, seed=12345)
    analyses = {label: heads.analyze_model(trained_models[label], batch, name=label)
                for label in ("deltanet[0,1]", "deltanet[-1,1]")}
    head_rows = [{"model": label, **row} for label, a in analyses.items() for row in a.rows()]
    ablation_rows = [{"model": label, **row} for label, a in analyses.items() for row in a.ablation.rows]
    group_rows = [{"model": label, "clamped to [0, 1]": name, "reveal accuracy": clamped_accuracy(trained_models[label], batch, sel)}
                  for label in analyses for name, sel in (("none", []), ("all heads of layer 0", [(0, h) for h in range(4)]),
                                                          ("all heads of layer 1", [(1, h) for h in range(4)]),
                                                          ("all 8 heads", [(l, h) for l in range(2) for h in range(4)]))]
    histograms = {f"{label} layer {layer}": h for label, a in analyses.items() for layer, h in a.histograms.items()}

    # 3. PFSA-SR: linear belief mass (theory) and trained state norms / belief probes
    curves, probe_r2, norm_rows = {}, {}, []
    for reveal in ("random", "adversarial"):
        pfsa = make_task("PFSA", n_items=3, p=0.5, reveal_every=2, reveal=reveal)
        tokens = pfsa.sample(n_eval, 4 * length, seed=7).tokens
        mass = heads.belief_mass(heads.linear_belief(pfsa, tokens))
        curves[f"linear belief mass, {reveal} reveals"] = mass.mean(0)
        norm_rows.append({"curve": f"linear belief mass ({reveal})", "log-decay per token": heads.decay_rate(mass)})
    pfsa = make_task("PFSA", n_items=3, p=0.5, reveal_every=2, reveal="random")
    pfsa_cfg = TrainConfig(steps=steps, batch_size=32, lr=3e-3, warmup=steps // 10, train_length=2 * length,
                           eval_every=steps, eval_size=64, checkpoint_every=steps)
    pfsa_batch = pfsa.sample(n_eval, 4 * length, seed=8)
    for label in ("deltanet[-1,1]", "tanh_rnn"):
        preset, extra = MODELS[label]
        model = trained(args.out / "pfsa", label, preset, extra, pfsa, pfsa_cfg)
        norms = heads.state_norms(model, pfsa_batch)
        curves[f"{label} state norm (last layer)"] = norms.mean(0)
        norm_rows.append({"curve": f"{label} state norm", "log-decay per token": heads.decay_rate(norms)})
        probe = heads.belief_probe(model, pfsa_batch, alpha=1.0)
        probe_r2[label] = probe.per_position
        norm_rows[-1]["belief probe test R^2"] = probe.test_score

    sections = [
        Text(__doc__.split("\n\n")[2], heading="Question"),
        evaluation.accuracy_vs_length(by_length, train_length=length, title="Reveal accuracy vs trace length")
        .update_yaxes(title="accuracy on reveal tokens").update_xaxes(title="statements per trace"),
        Table([{"model": k, **{f"acc@{t}": round(v, 4) for t, v in acc.items()}} for k, acc in by_length.items()],
              heading="Reveal accuracy by number of statements"),
        head_figures.beta_histograms(histograms),
        head_figures.head_ablation(ablation_rows, {k: a.ablation.baseline for k, a in analyses.items()}),
        Table(group_rows, heading="Several heads clamped at once"),
        head_figures.head_metric_bars(head_rows, ["state_rank", "traj_rank"]),
        Table([{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in head_rows],
              heading="Per-head summary"),
        evaluation.curves(curves, "position", "norm (mean over traces)", "PFSA-SR: norm over time", log_y=True),
        evaluation.curves(probe_r2, "position", "R^2", "Ridge probe from the last layer's state to the exact belief"),
        Table(norm_rows, heading="Decay rates and belief probes"),
    ]
    path = write_report(args.out / "report.html", "DeltaNet heads on REPL traces", sections)
    for row in head_rows:
        print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
    for label, acc in by_length.items():
        print(label, {t: round(v, 3) for t, v in acc.items()})
    for row in group_rows + norm_rows:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
