"""Effective attention of recurrent mixers: the matrix M with y_t = sum_{s <= t} M[t, s] x_s that a
mixer's recurrence implements for the current input (from the zero initial state).

    Diagonal SSMs (mamba, negative_mamba, mamba2): per channel e, x the scanned input (Mamba's
      post-conv x [B, T, E]; Mamba-2's x [B, T, H, P]) and y the read-out C h before D x and the gate:
        M[e, t, s] = sum_n C_t[n] (prod_{r = s+1..t} a_r[e, n]) b_s[e, n] / x_s[e]
      (b_s / x_s = dt_s B_s: Mamba's M = C_t (prod a_r) B_s dt_s). Mamba-2's a, dt, B, C are shared
      by a head's P channels, so its M is one [T, T] per head (the SSD "attention").
    Delta rule (deltanet, deltanet_neg, gated_deltanet): per head, x the values v_s and y the
      kernel output o_t = S_t q_t (before the output norm and gate):
        M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t,  A_r = alpha_r (I - beta_r k_r k_r^T)
      (alpha = 1 without a decay). This is exact, the key removal (- beta k k^T) included: the
      recurrence is linear in the values, so no approximation is needed (TransformerLens'
      linearised views of attention are heuristics; this is the operator itself).
    Linear attention (based): per head, x the values v_s and y the normalised linear attention:
        M[t, s] = phi(q_t) . phi(k_s) / sum_{s' <= t} phi(q_t) . phi(k_{s'})
      (the sliding-window branch, when there is one, is a separate softmax attention, not in M).

`effective_attention(model, tokens, layer)` -> EffectiveAttention(matrix [B, C, T, T] float64,
axis "channel" or "head", value_name: what x is, output_name: what y is). M is computed in
float64 by one loop over t with every s at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.mixers.based import taylor_features

DIAGONAL = ("mamba", "negative_mamba", "mamba2")
DELTA = ("deltanet", "gated_deltanet")
LINEAR = ("based",)


@dataclass
class EffectiveAttention:
    """matrix [B, C, T, T]: y_t[c] = sum_s matrix[b, c, t, s] x_s[c] (C channels or heads)."""

    matrix: torch.Tensor
    axis: str
    value_name: str
    output_name: str


def supported(model, layer: int) -> bool:
    return model.blocks[layer].mixer.mixer_name in DIAGONAL + DELTA + LINEAR


def effective_attention(model, tokens: torch.Tensor, layer: int) -> EffectiveAttention:
    """The effective attention of block `layer`'s mixer on `tokens` [B, T] (module docstring)."""
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer must be an int in [0, {len(model.blocks)}); got {layer!r}")
    mixer = model.blocks[layer].mixer
    if not supported(model, layer):
        raise ValueError(f"effective attention covers the mixers {DIAGONAL + DELTA + LINEAR}; block {layer} "
                         f"has {mixer.mixer_name!r}")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=[f"blocks.{layer}.mixer.hook_in"])
        inputs = mixer.prepare(cache[f"blocks.{layer}.mixer.hook_in"])
        if mixer.mixer_name in DIAGONAL:
            return _diagonal(mixer, inputs)
        if mixer.mixer_name in DELTA:
            return _delta(mixer, inputs)
        return _linear(inputs)


def mixer_output(model, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of block `layer`'s mixer as the module docstring names them, from its own scan:
    x [B, T, C] or [B, T, C, d] (heads), y likewise; for checking M (y = M x)."""
    mixer = model.blocks[layer].mixer
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names=[f"blocks.{layer}.mixer.hook_in"])
        inputs = mixer.prepare(cache[f"blocks.{layer}.mixer.hook_in"])
        if mixer.mixer_name in DELTA:
            return inputs["v"], mixer.scan(inputs)[0]  # [B, T, H, d] each
        states = mixer.scan(inputs)[1]
        if mixer.mixer_name in LINEAR:
            return inputs["v"], mixer.read_states(states, inputs["q"])
        if mixer.mixer_name == "mamba2":  # states [B, T, H, P, N], C per head [B, T, H, N]
            return inputs["x"], (states * mixer.per_head(inputs["C"])[..., None, :]).sum(-1)
        return inputs["x"], (states * inputs["C"][..., None, :]).sum(-1)  # [B, T, E, N] x [B, T, 1, N]


def _diagonal(mixer, inputs) -> EffectiveAttention:
    a, b_coef = mixer.transition_terms({**inputs, "x": torch.ones_like(inputs["x"])})  # b = x * b_coef
    a, b_coef = a.double(), b_coef.double()
    if mixer.mixer_name == "mamba2":  # [B, T, H, P, N]: shared across P
        a, b_coef = a[:, :, :, 0], b_coef[:, :, :, 0]
        C = mixer.per_head(inputs["C"]).double()  # [B, T, H, N]
    else:
        C = inputs["C"].double()[:, :, None, :]  # [B, T, 1, N]
    batch, length, channels, _ = a.shape
    matrix = a.new_zeros(batch, channels, length, length)
    decay = a.new_zeros(batch, length, channels, a.shape[-1])  # [B, s, C, N]: prod_{r=s+1..t} a_r b_s
    for t in range(length):
        decay = decay * a[:, t, None]
        decay[:, t] = b_coef[:, t]
        matrix[:, :, t] = torch.einsum("bcn,bscn->bcs", C[:, t].expand(batch, channels, -1), decay)
    axis = "head" if mixer.mixer_name == "mamba2" else "channel"
    return EffectiveAttention(matrix, axis, "x (the scanned input)", "C h (before D x and the gate)")


def _delta(mixer, inputs) -> EffectiveAttention:
    q, k = inputs["q"].double(), inputs["k"].double()  # [B, T, H, d]
    beta = (mixer._beta(inputs["beta"]) if hasattr(mixer, "_beta") else inputs["beta"]).double()  # [B, T, H]
    alpha = torch.exp(inputs["g"].double()) if "g" in inputs else torch.ones_like(beta)
    batch, length, heads, d = k.shape
    matrix = q.new_zeros(batch, heads, length, length)
    rows = q.new_zeros(batch, length, heads, d)  # r_s(t) = beta_s k_s^T A_{s+1} ... A_t
    for t in range(length):
        kt = k[:, t, None]  # [B, 1, H, d]
        rows = alpha[:, t, None, :, None] * (rows - beta[:, t, None, :, None] * (rows * kt).sum(-1, keepdim=True) * kt)
        rows[:, t] = beta[:, t, :, None] * k[:, t]
        matrix[:, :, t] = torch.einsum("bshd,bhd->bhs", rows, q[:, t])
    return EffectiveAttention(matrix, "head", "v (the values)", "o = S q (before the output norm and gate)")


def _linear(inputs) -> EffectiveAttention:
    fq, fk = (taylor_features(inputs[n].double()).transpose(1, 2) for n in ("q", "k"))  # [B, H, T, F]
    kernel = (fq @ fk.transpose(-1, -2)).tril()  # [B, H, T, T]
    return EffectiveAttention(kernel / kernel.sum(-1, keepdim=True), "head", "v (the values)",
                              "the normalised linear attention (before out_proj and the window branch)")

