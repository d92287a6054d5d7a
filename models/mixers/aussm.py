"""AUSSM-style adaptive unitary SSM: Mamba with a unit-modulus, input-dependent complex transition.

    a_t = exp(i dt_t omega)          |a_t| = 1, omega [E, N] learned frequencies, dt_t = softplus(...)
    h_t = a_t * h_{t-1} + (dt_t x_t) B_t^T          h_t complex [B, E, N] (hook_state complex64)
    y_t = Re(h_t C_t) + D x_t,  gated by SiLU(z), out_proj

After Karuvally et al. 2025 ("Bridging expressivity and scalability with adaptive unitary SSMs"):
the transition only rotates, so nothing decays and the input chooses the rotation angle.
Everything else (projections, short conv, dt, hooks, kernels, patches) is models.mixers.mamba.
Affine and diagonal: transition(inputs_t) = exp(i dt omega), complex [B, E, N], every |.| = 1.
Init: omega[e, n] = pi * (n + 1) (the S4D-Lin frequencies). mixer_options: as mamba.

Fast path on the CPU (float32/64, a C compiler): native.complex.rotation_scan forms a and b inside
its C loop with the read-out fused (nothing [B, T, E, N]); no-grad instrumented scans:
native.complex.rotation_states (complex64 states in torch's layout, pins honoured). Elsewhere
Mamba's unfused path: transition_terms into diag_scan.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mixers.base import register_mixer
from models.mixers.mamba import ComplexNativeMamba


@register_mixer("aussm", n_layers=2, norm="rmsnorm")
class AUSSM(ComplexNativeMamba):
    native_kernel = "rotation"  # native.complex.rotation_scan / rotation_states

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        del self.A_log  # no decay: the transition is a pure rotation
        freqs = math.pi * torch.arange(1, self.d_state + 1, dtype=torch.float32)
        self.omega = nn.Parameter(freqs.repeat(self.d_inner, 1))  # [E, N]

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        return super().element_counts(cfg, layer_idx)  # omega [E, N] in place of A_log [E, N]

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        dt = inputs["dt"][..., None]  # [B, (T,) E, 1]
        angle = dt * self.omega  # [B, (T,) E, N]
        a = torch.complex(torch.cos(angle), torch.sin(angle))  # unit modulus
        b = (dt * inputs["x"][..., None]) * inputs["B"][..., None, :]  # real, promoted by the kernel
        return a, b

    def native_args(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """(dt, omega, x, B): rotation_scan's and rotation_states' inputs before C."""
        return inputs["dt"], self.omega, inputs["x"], inputs["B"]
