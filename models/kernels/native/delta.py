"""The delta-rule forward as a plain-C loop on the CPU: delta_rule's impl="native" (no backward).

    S_t = alpha_t S_{t-1}(I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = S_t q_t     (see delta_rule.py;
    alpha_t = exp(g_t), 1 without g; a channel-wise g [B, T, H, K]: S_{t-1} Diag(alpha_t) in place
    of alpha_t S_{t-1})

The C code (delta_body.h) makes one pass over the [V, K] state per step per head, kept transposed
in cache so every product is an axpy; it is compute-bound, so its vector clones matter (library.py).
"""

from __future__ import annotations

import torch

from models.kernels.native.library import SUFFIX, I, P, empty, function, ptr

_ARGS = [I, I, I, I, I, P, P, P, P, P, P, P, P, P, P, I, P]


def delta_forward(q, k, v, beta, state, steps: list[int], g=None):
    """The delta-rule forward (no autograd): q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H],
    state [B, H, V, K], g None, [B, T, H] or [B, T, H, K] (the log decay), one dtype in (float32, float64), CPU
    -> (o [B, T, H, V], final state [B, H, V, K], {step: state [B, H, V, K]} for the given steps)."""
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    batch, length, heads, d_k = k.shape
    d_v = v.shape[-1]
    final = state.contiguous().clone()
    o = empty((batch, length, heads, d_v), v)
    steps = sorted(set(steps))
    slot = torch.full((length,), -1, dtype=torch.int64)
    slot[steps] = torch.arange(len(steps))
    exported = empty((batch, len(steps), heads, d_v, d_k), v)
    work = v.new_empty(heads * (d_k * d_v + 2 * d_v + 2 * d_k))
    channels = g is not None and g.dim() == 4
    function(f"delta_fwd_{SUFFIX[v.dtype]}", _ARGS)(
        batch, length, heads, d_k, d_v, ptr(q), ptr(k), ptr(v), ptr(beta), ptr(None if channels else g),
        ptr(g if channels else None), ptr(final), ptr(o),
        ptr(slot), ptr(exported), len(steps), ptr(work),
    )
    return o, final, {t: exported[:, i] for i, t in enumerate(steps)}
