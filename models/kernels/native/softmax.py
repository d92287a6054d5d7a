"""Causal attention scores and pattern in one pass as a plain-C loop on the CPU (no autograd).

    scores[s, t]  = q_s . k_t / sqrt(d_head)  for t <= s (queries the last Tq of Tk positions),
                    -inf after the query
    pattern[s, t] = softmax_t(scores[s, :]): 0 after the query

causal_scores_and_pattern(q, k) -> (scores, pattern), each a fresh [B, H, Tq, Tk] tensor: the
products only over the allowed keys (half of q k^T), the scale, mask and softmax in the same pass
over each row, where torch runs a matmul and three passes over a [B, H, T, T] tensor (exp over the
masked half too). float32 exp through exp_f32 (kernels.c), float64 through libm; the attention
mixer's readers (models.mixers.attention).
"""

from __future__ import annotations

import math

import torch

from models.kernels.native.library import D, I, P, available, empty, function, ptr

DTYPES = (torch.float32, torch.float64)
_ARGS = [I, I, I, I, D, P, P, P, P]


def supported(*tensors: torch.Tensor) -> bool:
    """Whether causal_scores_and_pattern runs here: the library built, CPU tensors in one of DTYPES."""
    first = tensors[0]
    return (first.dtype in DTYPES and all(t.device.type == "cpu" and t.dtype == first.dtype for t in tensors)
            and available())


def causal_scores_and_pattern(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, Tq, d] (the last Tq positions), k [B, H, Tk, d] (Tq <= Tk) -> (scores, pattern)
    [B, H, Tq, Tk]."""
    batch, heads, n_queries, d_head = q.shape
    n_keys = k.shape[2]
    q = q.contiguous()
    kt = k.transpose(-1, -2).contiguous()  # [B, H, d, Tk]
    scores = empty((batch, heads, n_queries, n_keys), q)
    pattern = empty((batch, heads, n_queries, n_keys), q)
    suffix = "f32" if q.dtype == torch.float32 else "f64"
    function(f"causal_softmax_{suffix}", _ARGS)(
        batch * heads, n_queries, n_keys, d_head, math.sqrt(d_head), ptr(q), ptr(kt), ptr(scores), ptr(pattern))
    return scores, pattern
