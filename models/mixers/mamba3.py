"""Mamba-3-style SSM: trapezoidal discretisation and a data-dependent rotation (complex state).

    x, z, dt, B, C as in models.mixers.mamba (short conv kept, hook_conv / hook_dt / hook_gate)
    theta_t = rot_proj(x_t)                          [B, T, N]  data-dependent angular rate
    lam_t   = sigmoid(lam_proj(x_t))                 [B, T, E]  trapezoid weight (1: Euler, 1/2: trapezoid)
    a_t     = exp(dt_t (A + i theta_t))              [B, T, E, N] complex: decay exp(dt A), rotation dt theta
    u_t     = x_t B_t^T                              [B, T, E, N]  (u_{-1} = 0)
    h_t     = a_t h_{t-1} + lam_t dt_t u_t + (1 - lam_t) dt_t a_t u_{t-1}     (hook_state complex64)
    y_t     = Re(h_t C_t) + D x_t,  gated by SiLU(z), out_proj

After Mamba-3 (Lahoti et al. 2025): the generalised trapezoidal rule mixes the current and the
previous input under the transition, and the complex transition (equivalently a data-dependent
rotary embedding of B and C) lets a diagonal SSM rotate its state. Not reproduced: MIMO, the
removal of the short conv, B/C normalisation. Affine and diagonal in h:
transition(inputs_t) = exp(dt_t (A + i theta_t)), |a| = exp(dt A) in (0, 1).
mixer_options: as mamba.

Fast path on the CPU (float32/64, a C compiler): native.complex.trapezoid_scan forms a and the
trapezoid's input terms inside its C loop with the read-out fused (nothing [B, T, E, N]); no-grad
instrumented scans: native.complex.trapezoid_states (complex64 states in torch's layout, pins
honoured). Both take x_prev / B_prev from the prepared inputs (resume() prepares them from its
context). Elsewhere Mamba's unfused path: transition_terms into diag_scan.
"""

from __future__ import annotations

import torch
from torch import nn

from models.mixers.base import linear_size, register_mixer
from models.mixers.mamba import ComplexNativeMamba


@register_mixer("mamba3", n_layers=2, norm="rmsnorm")
class Mamba3(ComplexNativeMamba):
    native_kernel = "trapezoid"  # native.complex.trapezoid_scan / trapezoid_states

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv  # the short conv, and x_prev / B_prev one step further back
        self.carries_conv = False  # x_prev / B_prev: a decoder carries the mixer inputs instead
        self.rot_proj = nn.Linear(self.d_inner, self.d_state)
        self.lam_proj = nn.Linear(self.d_inner, self.d_inner)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        parameters, buffers = super().element_counts(cfg, layer_idx)
        d_inner = cfg.expand * cfg.d_model
        return parameters + linear_size(d_inner, cfg.d_state) + linear_size(d_inner, d_inner), buffers

    def prepare(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        inputs = super().prepare(u)
        inputs["theta"] = self.rot_proj(inputs["x"])  # [B, T, N]
        inputs["lam"] = torch.sigmoid(self.lam_proj(inputs["x"]))  # [B, T, E]
        shift = lambda v: torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)  # noqa: E731
        inputs["x_prev"], inputs["B_prev"] = shift(inputs["x"]), shift(inputs["B"])  # step t-1's
        return inputs

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        # real and imaginary parts in real arithmetic, joined once (complex-by-real products on
        # the CPU cost several times their real counterparts)
        dt = inputs["dt"][..., None]  # [B, (T,) E, 1]
        decay, angle = torch.exp(dt * self.A()), dt * inputs["theta"][..., None, :]  # [B, (T,) E, N]
        a_re, a_im = decay * torch.cos(angle), decay * torch.sin(angle)
        lam = inputs["lam"][..., None]
        u_now = inputs["x"][..., None] * inputs["B"][..., None, :]  # [B, (T,) E, N]
        u_prev = (1 - lam) * dt * (inputs["x_prev"][..., None] * inputs["B_prev"][..., None, :])
        b_re = lam * dt * u_now + a_re * u_prev  # b = lam dt u_now + (1 - lam) dt a u_prev
        return torch.complex(a_re, a_im), torch.complex(b_re, a_im * u_prev)

    def native_args(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """(dt, A, theta, lam, x, B, x_prev, B_prev): trapezoid_scan's / trapezoid_states' inputs before C."""
        return (inputs["dt"], self.A(), inputs["theta"], inputs["lam"], inputs["x"], inputs["B"],
                inputs["x_prev"], inputs["B_prev"])
