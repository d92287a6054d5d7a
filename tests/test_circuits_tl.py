"""EAP on GPT-2 against TransformerLens 4.3 as an oracle (same float64 weights, tests/tl_oracle.py):
TL's split inputs (hook_q_input / hook_k_input / hook_v_input [B, T, H, D], hook_mlp_in: each a
copy of the pre-norm residual stream for one head or MLP) give d metric / d input per receiver;
with hook_result per head, hook_mlp_out and the embeddings as senders, (clean - corrupt) . grad
summed over positions is EAP's score of every edge TL defines. Skipped where TL is not
importable (the `[tl]` extra installs it)."""

import pytest
import torch

from interp.analysis.circuits import eap
from interp.tasks.base import Batch
from tests import tl_oracle

L, H = tl_oracle.LAYERS, tl_oracle.HEADS


def batches():
    clean_tokens = tl_oracle.tokens(batch=3, length=7, seed=1)
    corrupt_tokens = clean_tokens.clone()
    corrupt_tokens[:, 2] = (clean_tokens[:, 2] + 7) % tl_oracle.VOCAB
    targets = torch.randint(0, tl_oracle.VOCAB, clean_tokens.shape, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(clean_tokens.shape, dtype=torch.bool)
    mask[:, -1] = True
    states = torch.zeros(clean_tokens.shape, dtype=torch.long)
    return Batch(clean_tokens, targets, mask, states, {}), Batch(corrupt_tokens, targets, mask, states, {})


def tl_eap(bridge, clean: Batch, corrupt: Batch, y, rival) -> dict[str, torch.Tensor]:
    """{edge name in our naming: per-example score [N]} from TL's split-input gradients."""
    bridge.set_use_split_qkv_input(True)
    bridge.set_use_attn_result(True)
    bridge.set_use_hook_mlp_in(True)
    senders = ["hook_embed", "hook_pos_embed"] + [f"blocks.{l}.{h}" for l in range(L)
                                                  for h in ("attn.hook_result", "hook_mlp_out")]
    receivers = [f"blocks.{l}.{h}" for l in range(L) for h in ("hook_q_input", "hook_k_input", "hook_v_input",
                                                               "hook_mlp_in")] + [f"blocks.{L - 1}.hook_resid_post"]
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(clean.tokens, names_filter=lambda n: n in senders)
    live = {}

    def keep(name):
        def hook_fn(x, hook):  # a copy for this reader only (the bridge's hook_mlp_in reads ln2's input
            x = x.clone()      # in place, which the residual skip also reads), as HookedTransformer's
            x.retain_grad()
            live[name] = x
            return x

        return hook_fn

    logits = bridge.run_with_hooks(corrupt.tokens, fwd_hooks=[(n, keep(n)) for n in senders + receivers])
    last = logits[:, -1]
    rows = torch.arange(len(y))
    (last[rows, y] - last[rows, rival]).sum().backward()

    def diff(name):  # [N, T, (H,) D]
        return clean_cache[name] - live[name].detach()

    embed = diff("hook_embed") + diff("hook_pos_embed")
    out_nodes = [("embed", -1, embed)]
    for l in range(L):
        result = diff(f"blocks.{l}.attn.hook_result")
        out_nodes += [(f"a{l}.h{h}", l, result[:, :, h]) for h in range(H)]
        out_nodes.append((f"mlp{l}", l + 0.5, diff(f"blocks.{l}.hook_mlp_out")))
    scores = {}
    for l in range(L):
        for kind in "qkv":
            grad = live[f"blocks.{l}.hook_{kind}_input"].grad  # [N, T, H, D]
            for name, layer, value in out_nodes:
                if layer < l:
                    for h in range(H):
                        scores[f"{name}->a{l}.h{h}.{kind}"] = (value * grad[:, :, h]).sum((1, 2))
        grad = live[f"blocks.{l}.hook_mlp_in"].grad
        for name, layer, value in out_nodes:
            if layer <= l:
                scores[f"{name}->mlp{l}.in"] = (value * grad).sum((1, 2))
    grad = live[f"blocks.{L - 1}.hook_resid_post"].grad[:, -1]
    for name, _, value in out_nodes:
        scores[f"{name}->logits"] = (value[:, -1] * grad).sum(-1)
    return scores


def test_eap_equals_transformer_lens_split_input_gradients():
    source = tl_oracle.gpt2_source()
    bridge = tl_oracle.lens(source)  # skips without TL
    model = tl_oracle.ours(source)
    clean, corrupt = batches()
    ours = eap(model, clean, corrupt, metric="logit_diff")
    reference = tl_eap(bridge, clean, corrupt, ours.setup.answers, ours.setup.rivals)
    names = ours.graph.edge_names()
    assert set(reference) == set(names)  # GPT-2: every edge of ours is one TL defines
    for name, value in reference.items():
        torch.testing.assert_close(ours.per_example[names.index(name)], value.double(), atol=1e-10, rtol=1e-8)
    assert max(v.abs().max().item() for v in reference.values()) > 1e-3
