"""Does a state patch in a pretrained SSM change the future, or only the present?

Loads a local transformers checkpoint directory (a Mamba, FalconMamba, Jamba, ... saved with
save_pretrained; nothing is downloaded) as an instrumented model (`models.from_pretrained`),
runs a clean prompt and a donor prompt, and replaces the recurrent state of one layer at one
position t of the clean run by the donor's state there, two ways:

  causal (this toolkit's hook_state): the recurrence continues from the patched state, so the
      patch reaches every later position through the layer's own state;
  read-out only (what a TransformerLens hook_ssm_state patch does): the patched state is read
      out at t, the recurrence continues from the clean state; later positions change only
      through later layers reading position t.

The figure shows, per position, how far each patch moves the next-token distribution (KL from
the clean run's) and the logits (L2 norm of the change). One offline HTML page.

    python examples/pretrained_state_patching.py CHECKPOINT_DIR [--layer 0] [--position 8]
        [--length 32] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import models
from interp.report.html import Table, Text, write_report


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, help="local transformers checkpoint directory")
    p.add_argument("--layer", type=int, default=0, help="layer whose hook_state is patched")
    p.add_argument("--position", type=int, default=8, help="position t of the patch")
    p.add_argument("--length", type=int, default=32, help="prompt length (random token ids)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/pretrained_state_patching"))
    return p.parse_args(argv)


def readout_only(model, tokens, layer: int, t: int, state: torch.Tensor) -> torch.Tensor:
    """Logits with blocks.{layer}'s state replaced by `state` [B, *S] only where it is read out
    at t: the mixer output at t becomes the read-out of the patched state, the scan is left alone."""
    mixer, prefix = model.blocks[layer].mixer, f"blocks.{layer}.mixer"
    _, cache = model.run_with_cache(tokens, names=[f"{prefix}.hook_in", f"{prefix}.hook_state"])
    u = cache[f"{prefix}.hook_in"]
    states = cache[f"{prefix}.hook_state"].clone()
    states[:, t] = state
    out_t = mixer.readout(u, states, mixer.prepare(u))[:, t]  # [B, D]

    def patch(out, hook):
        out[:, t] = out_t
        return out

    return model.run_with_hooks(tokens, fwd_hooks=[(f"{prefix}.hook_out", patch)])


def effects(clean: torch.Tensor, patched: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per position [T] (mean over the batch): KL(clean || patched) of the next-token
    distributions and the L2 norm of the logit change."""
    log_p, log_q = clean.log_softmax(-1), patched.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean(0)
    return {"kl": kl, "l2": (patched - clean).norm(dim=-1).mean(0)}


def figure(result: dict, t: int, layer: int, source: str) -> go.Figure:
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("KL(clean || patched) of the next-token distribution",
                                        "||logits patched - logits clean||"))
    colors = {"causal": "#1f77b4", "read-out only": "#d62728"}
    for row, metric in enumerate(("kl", "l2"), start=1):
        for kind, color in colors.items():
            fig.add_trace(go.Scatter(x=list(range(len(result[kind][metric]))), y=result[kind][metric].tolist(),
                                     mode="lines+markers", name=kind, line={"color": color},
                                     legendgroup=kind, showlegend=row == 1), row=row, col=1)
        fig.add_vline(x=t, line_dash="dot", line_color="grey", row=row, col=1)
    fig.update_xaxes(title_text="position", row=2, col=1)
    fig.update_yaxes(title_text="KL, nats (mean over prompts)", row=1, col=1)
    fig.update_yaxes(title_text="L2 norm of the logit change", row=2, col=1)
    fig.update_layout(title=f"{source}: hook_state of layer {layer} patched at position {t} from a donor prompt",
                      height=700, width=1100, template="plotly_white")
    return fig


def main(argv=None) -> dict:
    args = parse_args(argv)
    model = models.from_pretrained(args.checkpoint).float()
    hook = f"blocks.{args.layer}.mixer.hook_state"
    if hook not in model.hook_names():
        states = [n for n in model.hook_names() if n.endswith("hook_state")]
        raise SystemExit(f"--layer {args.layer}: {hook} does not exist; recurrent states: {states}")
    if not 0 <= args.position < args.length:
        raise SystemExit(f"--position must lie in [0, --length={args.length}); got {args.position}")
    gen = torch.Generator().manual_seed(args.seed)
    clean, donor = torch.randint(0, model.cfg.vocab_size, (2, 4, args.length), generator=gen)
    t = args.position
    with torch.no_grad():
        base = model(clean)
        _, donor_cache = model.run_with_cache(donor, names=[hook])
        donor_state = donor_cache[hook][:, t]
        # declared (step t, the donor's state): the mixer runs it on its fast kernels
        causal = model.run_with_hooks(clean, fwd_hooks=[(hook, models.StatePatch.at(t, values=donor_state))])
        readout = readout_only(model, clean, args.layer, t, donor_state)
    result = {"causal": effects(base, causal), "read-out only": effects(base, readout)}
    source = args.checkpoint.name
    after = {kind: float(r["kl"][t + 1:].sum()) for kind, r in result.items()}
    rows = [{"patch": kind, "KL at t": float(r["kl"][t]), "KL summed over positions > t": after[kind],
             "KL before t (0 by causality)": float(r["kl"][:t].sum())} for kind, r in result.items()]
    path = write_report(args.out / "report.html", "Causal vs read-out-only state patches", [
        Text(f"Checkpoint {str(args.checkpoint)!r} imported with models.from_pretrained "
             f"({len(model.blocks)} layers, mixers {sorted(set(model.cfg.mixers))}). Four random clean prompts "
             f"of length {args.length}; {hook} at position {t} replaced by a donor prompt's state there. "
             "Causal: the recurrence continues from the patched state. Read-out only: only the read-out at "
             "t sees it (TransformerLens' hook_ssm_state patch)."),
        figure(result, t, args.layer, source), Table(rows)])
    print(f"wrote {path}; KL after t: causal {after['causal']:.4g}, read-out only {after['read-out only']:.4g}")
    return {"path": path, **result}


if __name__ == "__main__":
    main()
