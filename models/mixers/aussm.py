"""AUSSM-style adaptive unitary SSM: Mamba with a unit-modulus, input-dependent complex transition.

    a_t = exp(i dt_t omega)          |a_t| = 1, omega [E, N] learned frequencies, dt_t = softplus(...)
    h_t = a_t * h_{t-1} + (dt_t x_t) B_t^T          h_t complex [B, E, N] (hook_state complex64)
    y_t = Re(h_t C_t) + D x_t,  gated by SiLU(z), out_proj

After Karuvally et al. 2025 ("Bridging expressivity and scalability with adaptive unitary SSMs"):
the transition only rotates, so nothing decays and the input chooses the rotation angle.
Everything else (projections, short conv, dt, hooks, kernels, patches) is models.mixers.mamba.
Affine and diagonal: transition(inputs_t) = exp(i dt omega), complex [B, E, N], every |.| = 1.
Init: omega[e, n] = pi * (n + 1) (the S4D-Lin frequencies). mixer_options: as mamba.

Fast path on the CPU (float32/64, a C compiler): native_scan.rotation_scan forms a and b inside
its C loop with the read-out fused (nothing [B, T, E, N]); no-grad instrumented scans:
native_scan.rotation_states (complex64 states in torch's layout, pins honoured). Elsewhere
Mamba's unfused path: transition_terms into diag_scan.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.hooks import scan_with_state_hook
from models.kernels import native_scan
from models.mixers.base import register_mixer
from models.mixers.mamba import Mamba


@register_mixer("aussm", n_layers=2, norm="rmsnorm")
class AUSSM(Mamba):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        del self.A_log  # no decay: the transition is a pure rotation
        freqs = math.pi * torch.arange(1, self.d_state + 1, dtype=torch.float32)
        self.omega = nn.Parameter(freqs.repeat(self.d_inner, 1))  # [E, N]

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        dt = inputs["dt"][..., None]  # [B, (T,) E, 1]
        angle = dt * self.omega  # [B, (T,) E, N]
        a = torch.complex(torch.cos(angle), torch.sin(angle))  # unit modulus
        b = (dt * inputs["x"][..., None]) * inputs["B"][..., None, :]  # real, promoted by the kernel
        return a, b

    def native_args(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """(dt, omega, x, B): rotation_scan's and rotation_states' inputs before C."""
        return inputs["dt"], self.omega, inputs["x"], inputs["B"]

    def fast_from(self, u, inputs, initial=None) -> torch.Tensor:
        """rotation_scan where it runs (CPU, float32/64, initial None or of the complex dtype),
        else Mamba's unfused fast path."""
        args = self.native_args(inputs)
        if native_scan.complex_supported(*args, inputs["C"], initial_state=initial):
            y = native_scan.rotation_scan(*args, inputs["C"], initial_state=initial, chunk_size=self.chunk_size)
            return self.finish(y, inputs)  # y [B, T, E]
        return super().fast_from(u, inputs, initial)

    def scan(self, inputs, pins=None, initial=None):
        """The states [B, T, E, N] complex (twice: the scan contract): rotation_states when no
        gradient is wanted and it runs here, else transition_terms into diag_scan."""
        args = self.native_args(inputs)
        if native_scan.complex_states_supported(*args, initial_state=initial, pins=pins):
            states = native_scan.rotation_states(*args, initial_state=initial, pins=pins)
            return states, states
        return super().scan(inputs, pins, initial)

    def instrumented_forward(self, u, inputs, initial=None) -> torch.Tensor:
        """Both scans (the first and the patched re-run) in rotation_states when it runs, else
        Mamba's (a and b formed once in torch)."""
        if not native_scan.complex_states_supported(*self.native_args(inputs), initial_state=initial):
            return super().instrumented_forward(u, inputs, initial)
        run = lambda pins: self.scan(inputs, pins, initial)  # noqa: E731
        _, states = scan_with_state_hook(self.hook_state, run, len(self.state_shape))
        return self.readout(u, states, inputs)
