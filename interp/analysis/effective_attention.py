"""Effective attention of recurrent mixers: the matrix M with y_t = sum_{s <= t} M[t, s] x_s that a
mixer's recurrence implements for the current input (from the zero initial state).

    Diagonal SSMs (mamba, negative_mamba, mamba2, aussm, mamba3): per channel e, x the scanned
      input (Mamba's post-conv x [B, T, E]; Mamba-2's x [B, T, H, P]) and y the read-out C h
      before D x and the gate:
        M[e, t, s] = sum_n C_t[n] (prod_{r = s+1..t} a_r[e, n]) b_s[e, n] / x_s[e]
      (b_s / x_s = dt_s B_s: Mamba's M = C_t (prod a_r) B_s dt_s). Mamba-2's a, dt, B, C are shared
      by a head's P channels, so its M is one [T, T] per head (the SSD "attention"). Mamba-3's
      trapezoid feeds x_s into two steps: M[e, t, s] = sum_n C_t[n] (prod_{r = s+1..t} a_r)
      B_s[n] (lam_s dt_s + [t > s] (1 - lam_{s+1}) dt_{s+1}).
    Time-invariant SSMs: s4d per channel d, x the mixer input, y the SSM part before D x and the
      GELU: M[d, t, s] = K_d[t - s], K_d[l] = 2 Re(sum_m C_m dB_m dA_m^l) (its convolution kernel);
      h3 per channel c, x the values v and y = q * (C h) (before the skip Dskip u and out_proj):
        M[c, t, s] = q_t[c] K_c[t - s] kbar_s[c],  K_c[l] = sum_n C Bbar Abar^l
      (q the query, kbar the shift-SSM key: H3's q (K * (kbar v)) written as attention).
    Complex states (s4d, aussm, mamba3): the output is the real part of C h and x is real, so
      Re(sum_s c_s x_s) = sum_s Re(c_s) x_s and M is the real part of the complex coefficients
      (real, like the output; s4d's factor 2 is its conjugate pair).
    Delta rule (deltanet, deltanet_neg, gated_deltanet): per head, x the values v_s and y the
      kernel output o_t = S_t q_t (before the output norm and gate):
        M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t,  A_r = alpha_r (I - beta_r k_r k_r^T)
      (alpha = 1 without a decay). This is exact, the key removal (- beta k k^T) included: the
      recurrence is linear in the values, so no approximation is needed (TransformerLens'
      linearised views of attention are heuristics; this is the operator itself).
    Linear attention (based): per head, x the values v_s and y the normalised linear attention:
        M[t, s] = phi(q_t) . phi(k_s) / sum_{s' <= t} phi(q_t) . phi(k_{s'})
      (the sliding-window branch, when there is one, is a separate softmax attention, not in M).
    Dense linear RNNs (linear_rnn, token_gated_rnn, dense_ssm): h_t = A_t h_{t-1} + u_t, x the
      scanned input u (B x_t + b) and y the state h (what out_proj reads); every (t, s) is an
      n x n block, M[t, s] = A_t A_{t-1} ... A_{s+1} (the identity at s = t), in `blocks`
      [B, T, T, n, n] (B T^2 n^2 float64 numbers: slice long inputs); `matrix` holds the blocks'
      Frobenius norms [B, 1, T, T] for the heatmap.

Not covered: attention (its pattern is hook_pattern), the convolution mixers without a state
(BaseConv, Hyena), and the recurrences that are not linear in their input given the run's
coefficients (tanh RNN, state-gated RNN, LSTM, GRU, LayerNorm and sphere RNNs: their gates or
normalisation depend on the state itself).

`effective_attention(model, tokens, layer)` -> EffectiveAttention(matrix [B, C, T, T] float64,
axis "channel", "head" or "block norm", value_name: what x is, output_name: what y is, blocks).
M is computed in float64 by one loop over t with every s at once (a Toeplitz gather for the
time-invariant SSMs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.mixers.based import taylor_features

DIAGONAL = ("mamba", "negative_mamba", "mamba2", "aussm", "mamba3")
INVARIANT = ("s4d", "h3")
DELTA = ("deltanet", "gated_deltanet")
LINEAR = ("based",)
DENSE = ("linear_rnn", "token_gated_rnn", "dense_ssm")
COVERED = DIAGONAL + INVARIANT + DELTA + LINEAR + DENSE


@dataclass
class EffectiveAttention:
    """matrix [B, C, T, T]: y_t[c] = sum_s matrix[b, c, t, s] x_s[c] (C channels or heads); for a
    dense transition blocks [B, T, T, n, n] with y_t = sum_s blocks[b, t, s] @ x_s, and matrix
    their Frobenius norms [B, 1, T, T]."""

    matrix: torch.Tensor
    axis: str
    value_name: str
    output_name: str
    blocks: torch.Tensor | None = None


def supported(model, layer: int) -> bool:
    return model.blocks[layer].mixer.mixer_name in COVERED


def effective_attention(model, tokens: torch.Tensor, layer: int) -> EffectiveAttention:
    """The effective attention of block `layer`'s mixer on `tokens` [B, T] (module docstring)."""
    if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < len(model.blocks):
        raise ValueError(f"layer must be an int in [0, {len(model.blocks)}); got {layer!r}")
    mixer = model.blocks[layer].mixer
    if not supported(model, layer):
        raise ValueError(f"effective attention covers the mixers {COVERED}; block {layer} has {mixer.mixer_name!r}")
    with torch.no_grad():
        inputs = _prepared(model, tokens, layer)
        if mixer.mixer_name in DIAGONAL:
            return _diagonal(mixer, inputs)
        if mixer.mixer_name in INVARIANT:
            return _invariant(mixer, inputs)
        if mixer.mixer_name in DELTA:
            return _delta(mixer, inputs)
        if mixer.mixer_name in DENSE:
            return _dense(mixer, inputs)
        return _linear(inputs)


def _prepared(model, tokens: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """Block `layer`'s mixer's prepared inputs on tokens (H3's also its values v and shifted keys
    kbar [B, T, C], read from hook_v and hook_conv)."""
    mixer, prefix = model.blocks[layer].mixer, f"blocks.{layer}.mixer."
    extra = ["hook_v", "hook_conv"] if mixer.mixer_name == "h3" else []
    _, cache = model.run_with_cache(tokens, names=[prefix + n for n in ["hook_in", *extra]])
    inputs = mixer.prepare(cache[prefix + "hook_in"])
    if extra:
        inputs |= {"v": cache[prefix + "hook_v"].flatten(2), "kbar": cache[prefix + "hook_conv"]}
    return inputs


def mixer_output(model, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of block `layer`'s mixer as the module docstring names them, from its own scan:
    x [B, T, C] or [B, T, C, d] (heads), y likewise; for checking M (y = M x)."""
    mixer = model.blocks[layer].mixer
    with torch.no_grad():
        inputs = _prepared(model, tokens, layer)
        if mixer.mixer_name in DELTA:
            return inputs["v"], mixer.scan(inputs)[0]  # [B, T, H, d] each
        states = mixer.scan(inputs)[1]
        if mixer.mixer_name in LINEAR:
            return inputs["v"], mixer.read_states(states, inputs["q"])
        if mixer.mixer_name in DENSE:
            return inputs["u"], states  # [B, T, n] each
        if mixer.mixer_name == "s4d":  # states [B, T, D, M] complex, C [D, M]
            return inputs["x"], 2 * (states * torch.view_as_complex(mixer.C)).sum(-1).real
        if mixer.mixer_name == "h3":  # states [B, T, C, N]
            return inputs["v"], inputs["q"] * (states * mixer.c).sum(-1)
        if mixer.mixer_name == "mamba2":  # states [B, T, H, P, N], C per head [B, T, H, N]
            return inputs["x"], (states * mixer.per_head(inputs["C"])[..., None, :]).sum(-1)
        y = (states * inputs["C"][..., None, :]).sum(-1)  # [B, T, E, N] x [B, T, 1, N]
        return inputs["x"], y.real if y.is_complex() else y


def _diagonal(mixer, inputs) -> EffectiveAttention:
    ones, zeros = torch.ones_like(inputs["x"]), torch.zeros_like(inputs["x"])
    unit = {**inputs, "x": ones} if "x_prev" not in inputs else {**inputs, "x": ones, "x_prev": zeros}
    a, b_coef = (v.to(_wide(v)) for v in mixer.transition_terms(unit))  # b = x * b_coef (+ the previous x's)
    b_prev = None  # Mamba-3: the coefficient of x_{t-1} in step t's input
    if "x_prev" in inputs:
        b_prev = mixer.transition_terms({**inputs, "x": zeros, "x_prev": ones})[1].to(_wide(a))
    if mixer.mixer_name == "mamba2":  # [B, T, H, P, N]: shared across P
        a, b_coef = a[:, :, :, 0], b_coef[:, :, :, 0]
        C = mixer.per_head(inputs["C"]).double()  # [B, T, H, N]
    else:
        C = inputs["C"].double()[:, :, None, :]  # [B, T, 1, N]
    batch, length, channels, _ = a.shape
    matrix = torch.zeros(batch, channels, length, length, dtype=torch.float64, device=a.device)
    decay = torch.zeros_like(a)  # [B, s, C, N]: the coefficient of x_s in h_t
    for t in range(length):
        decay = decay * a[:, t, None]
        decay[:, t] = b_coef[:, t]
        if b_prev is not None and t > 0:
            decay[:, t - 1] += b_prev[:, t]
        weights = torch.einsum("bcn,bscn->bcs", C[:, t].expand(batch, channels, -1).to(decay.dtype), decay)
        matrix[:, :, t] = weights.real if weights.is_complex() else weights  # the output is Re(C h)
    axis = "head" if mixer.mixer_name == "mamba2" else "channel"
    return EffectiveAttention(matrix, axis, "x (the scanned input)", "C h (before D x and the gate)")


def _wide(v: torch.Tensor) -> torch.dtype:
    return torch.complex128 if v.is_complex() else torch.float64


def _invariant(mixer, inputs) -> EffectiveAttention:
    """s4d / h3: the convolution kernel K [C, T] as a Toeplitz matrix (times h3's q and kbar)."""
    x = inputs["x"] if mixer.mixer_name == "s4d" else inputs["v"]
    batch, length, channels = x.shape
    if mixer.mixer_name == "s4d":
        kernel = mixer.convolution_kernel(length)  # [D, T] float64
    else:
        dt_a, _, bbar = (v.double() for v in mixer.discretised())  # [C, N]
        powers = (dt_a[:, :, None] * torch.arange(length, dtype=torch.float64, device=dt_a.device)).exp()
        kernel = torch.einsum("cn,cnl->cl", mixer.c.double() * bbar, powers)  # [C, T]
    lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # t - s
    toeplitz = torch.where(lag >= 0, kernel[:, lag.clamp(min=0)], torch.zeros((), dtype=kernel.dtype))  # [C, T, T]
    matrix = toeplitz.expand(batch, channels, length, length).clone()
    if mixer.mixer_name == "s4d":
        return EffectiveAttention(matrix, "channel", "x (the mixer input)", "2 Re(C h) (before D x and the GELU)")
    q, kbar = inputs["q"].double().transpose(1, 2), inputs["kbar"].double().transpose(1, 2)  # [B, C, T]
    return EffectiveAttention(matrix * q[..., :, None] * kbar[..., None, :], "channel", "v (the values)",
                              "q * (C h) (before the skip Dskip u and out_proj)")


def _dense(mixer, inputs) -> EffectiveAttention:
    """Products of the dense transitions: blocks[:, t, s] = A_t ... A_{s+1} [n, n]."""
    steps = [{name: value[:, t] for name, value in inputs.items()} for t in range(inputs["u"].shape[1])]
    transitions = [mixer.transition(step).double() for step in steps]  # T x [B, n, n]
    batch, n = transitions[0].shape[:2]
    length = len(steps)
    blocks = torch.zeros(batch, length, length, n, n, dtype=torch.float64, device=transitions[0].device)
    eye = torch.eye(n, dtype=torch.float64, device=blocks.device)
    for t in range(length):
        if t:
            blocks[:, t, :t] = transitions[t][:, None] @ blocks[:, t - 1, :t]
        blocks[:, t, t] = eye
    norms = blocks.flatten(3).norm(dim=-1)[:, None]  # [B, 1, T, T]
    return EffectiveAttention(norms, "block norm", "u (the scanned input B x + b)", "h (the state out_proj reads)",
                              blocks)


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

