"""Causal attention scores and pattern in one pass as a plain-C loop on the CPU (no autograd).

    scores[s, t]  = product[s, t] / sqrt(d_head)  for t <= s (queries the last Tq of Tk positions),
                    -inf after the query
    pattern[s, t] = softmax_t(scores[s, :]): exp over the allowed keys only, 0 after the query

causal_softmax_(product) overwrites the raw products q_s . k_t [..., Tq, Tk] with the scores and
returns the pattern in a fresh tensor: one pass instead of torch's scale, mask and softmax (three
passes over a [B, H, T, T] tensor, exp over the masked half too). float32 exp through exp_f32
(kernels.c), float64 through libm; the attention mixer's readers (models.mixers.attention).
"""

from __future__ import annotations

import math

import torch

from models.kernels.native.library import D, I, P, available, empty, function, ptr

DTYPES = (torch.float32, torch.float64)
_ARGS = [I, I, I, D, P, P]


def supported(x: torch.Tensor) -> bool:
    """Whether causal_softmax_ runs on x: the library built, a contiguous CPU tensor in DTYPES."""
    return x.dtype in DTYPES and x.device.type == "cpu" and x.is_contiguous() and available()


def causal_softmax_(product: torch.Tensor, d_head: int) -> torch.Tensor:
    """product [..., Tq, Tk] (contiguous, Tq <= Tk; becomes the scaled, masked scores) -> the
    causal softmax pattern [..., Tq, Tk]."""
    n_queries, n_keys = product.shape[-2:]
    pattern = empty(product.shape, product)
    suffix = "f32" if product.dtype == torch.float32 else "f64"
    function(f"causal_softmax_{suffix}", _ARGS)(
        product.numel() // (n_queries * n_keys), n_queries, n_keys, math.sqrt(d_head), ptr(product), ptr(pattern))
    return pattern
