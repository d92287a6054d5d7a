"""Negative Mamba: Mamba with the transition stretched to (-1, 1).

    a_t = 2 exp(dt_t A) - 1            in (-1, 1) per (channel, state); negative for dt_t |A| > ln 2
    h_t = a_t * h_{t-1} + (dt_t x_t) B_t^T,     y_t = h_t C_t + D x_t,  gated by SiLU(z)

Everything else (projections, short conv, dt, hooks, kernels, patches) is models.mixers.mamba;
the native selective kernels form this transition in C with scale s = 2 (native_transition_scale),
transition_terms below is its torch form (the unfused path, and transition() for Jacobians).
Negative eigenvalues let a diagonal affine recurrence flip signs, which parity-like state tracking
needs (Grazzi et al. 2024, "Unlocking state-tracking in linear RNNs through negative eigenvalues").
Affine and diagonal: transition(inputs_t) = 2 exp(dt A) - 1, [B, E, N].
mixer_options: as mamba.
"""

from __future__ import annotations

import torch

from models.mixers.base import register_mixer
from models.mixers.mamba import Mamba


@register_mixer("negative_mamba", n_layers=2, norm="rmsnorm")
class NegativeMamba(Mamba):
    native_transition_scale = 2.0  # transition_terms is the C kernels' s exp(dt A) - (s - 1) with s = 2

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = super().transition_terms(inputs)
        return 2 * a - 1, b  # [B, (T,) E, N] each

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        return super().element_counts(cfg, layer_idx)  # Mamba's weights
