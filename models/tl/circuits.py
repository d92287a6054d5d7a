"""TransformerLens' weight circuits on our models, as TL 4.3's TransformerBridge builds them:
TL's own FactoredMatrix (transformer_lens.FactoredMatrix) over our weights (models.tl.surface).

    model.QK                      FactoredMatrix(W_Q, W_K^T)   [L, H, D, D] as A [L, H, D, d] B [L, H, d, D]
    model.OV                      FactoredMatrix(W_V, W_O)     [L, H, D, D]
    model.QK_for_attn_layers()    (layers, QK over the attention layers only): hybrids
    model.OV_for_attn_layers()    (layers, OV ...)
    model.all_composition_scores(mode)   TL's CompositionScores: |left right|_F / (|left|_F |right|_F)
                                  of every earlier head's OV (left) with every later head's Q / K /
                                  V circuit (mode "Q", "K", "V") [n, H, n, H] over the n attention
                                  layers, zero where the later layer is not later; .scores,
                                  .layer_indices, .head_labels ("L{l}H{h}")

Grouped-query attention's G key / value heads are repeated to the H query heads (query head h
reads key / value head h // (H / G)), as the bridge's _expand_kv_heads. The factors are new
tensors (TL's torch.stack); their gradients reach the parameters. They need TransformerLens
(the [tl] extra): without it each raises an ImportError saying so and what to compute instead.
QK and OV refuse a model where some layer has no attention mixer (NoWeight naming the layers);
the *_for_attn_layers forms take the layers that have one, as TL's.
"""

from __future__ import annotations

import torch

INSTALL = ("pip install 'interp-seq[tl]' (TransformerLens >= 4.3); without it the products themselves are "
           "model.W_V[l] @ model.W_O[l] (OV, [H, D, D]) and model.W_Q[l] @ model.W_K[l].transpose(-2, -1) (QK)")


def factored_matrix():
    """TransformerLens' FactoredMatrix class; ImportError naming the [tl] extra without TL."""
    try:
        from transformer_lens.FactoredMatrix import FactoredMatrix
    except ImportError as error:
        raise ImportError(f"model.QK / model.OV are TransformerLens FactoredMatrix objects and TransformerLens "
                          f"is not installed ({error}): {INSTALL}") from error
    return FactoredMatrix


def expand_kv_heads(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[..., G, D, d] key / value weights repeated on the head axis to n_heads (query head h reads
    key / value head h // (n_heads / G)); unchanged where G == n_heads."""
    groups = weight.shape[-3]
    if groups == n_heads:
        return weight
    if n_heads % groups:
        raise ValueError(f"cannot expand {groups} key/value heads to {n_heads} query heads: n_heads must be a "
                         "multiple of the key/value heads")
    return weight.repeat_interleave(n_heads // groups, dim=-3)


def attention_layers(model) -> list[int]:
    """The layers whose block has an attention mixer (TL's blocks[l].attn)."""
    return [layer for layer, block in enumerate(model.blocks) if block.attn is not None]


def _stack(model, name: str, layers: list[int]) -> torch.Tensor:
    return torch.stack([getattr(model.blocks[layer].attn, name) for layer in layers])


def qk(model, layers: list[int] | None = None):
    """FactoredMatrix(W_Q, W_K^T) over `layers` (None: every layer, each must have attention)."""
    FactoredMatrix = factored_matrix()
    W_Q, W_K = (model.W_Q, model.W_K) if layers is None else (_stack(model, "W_Q", layers), _stack(model, "W_K", layers))
    return FactoredMatrix(W_Q, expand_kv_heads(W_K, W_Q.shape[-3]).transpose(-2, -1))


def ov(model, layers: list[int] | None = None):
    """FactoredMatrix(W_V, W_O) over `layers` (None: every layer, each must have attention)."""
    FactoredMatrix = factored_matrix()
    W_V, W_O = (model.W_V, model.W_O) if layers is None else (_stack(model, "W_V", layers), _stack(model, "W_O", layers))
    return FactoredMatrix(expand_kv_heads(W_V, W_O.shape[-3]), W_O)


def composition_scores(model, mode: str):
    """TL 4.3's all_composition_scores(mode) on our weights (module docstring)."""
    if mode not in ("Q", "K", "V"):
        raise ValueError(f"mode must be one of ['Q', 'K', 'V'] not {mode}")
    layers = attention_layers(model)
    if not layers:
        raise ValueError("No attention layers found — cannot compute composition scores.")
    factored_matrix()   # the ImportError naming the extra, before TL's utilities are imported
    from transformer_lens.model_bridge.composition_scores import CompositionScores
    from transformer_lens.utilities import composition_scores as scores_of

    left = ov(model, layers)
    right = {"Q": lambda: qk(model, layers), "K": lambda: qk(model, layers).T, "V": lambda: left}[mode]()
    scores = scores_of(left, right, broadcast_dims=True)
    index = torch.arange(len(layers), device=scores.device)
    later = index[:, None, None, None] < index[None, None, :, None]
    scores = torch.where(later, scores, torch.zeros_like(scores))
    labels = [f"L{layer}H{head}" for layer in layers for head in range(model.cfg.n_heads)]
    return CompositionScores(scores=scores, layer_indices=layers, head_labels=labels)
