"""S4D: a time-invariant diagonal SSM per channel with the HiPPO-LegS-derived diagonal init.

Per channel d (D = d_model channels, M = d_state complex modes each):

    dA = exp(dt_d A_d)                   A_d [M] complex, Re A < 0 (ZOH discretisation)
    dB = (dA - 1) / A_d * B_d            B_d [M] complex
    h_t = dA * h_{t-1} + dB x_t          h_t complex [B, D, M] (hook_state complex64)
    y_t = 2 Re(C_d . h_t) + D_d x_t      conjugate-pair trick: the real system has 2M states
    out = out_proj(GELU(y))              [B, T, d_model]

Time-invariant, so the map x -> y is a causal convolution with K_d[k] = 2 Re(sum_m C dB dA^k):
the fast path computes K and convolves with an FFT (in float64), the instrumented path runs the
recurrence through models.kernels.diag_scan (state patches as pins). Both give the same outputs.
Declared state patches (models.StatePatch) run the recurrence by diag_scan with the read-out fused.

Init (Gu et al. 2022, "On the Parameterization and Initialization of Diagonal State Space
Models", S4D-LegS): the HiPPO-LegS matrix of size 2M is normal plus low rank,
A_legs = S - P P^T with P_n = sqrt(n + 1/2); S = -1/2 I + skew is diagonalised (S = V L V^*),
and A_d = the M eigenvalues with positive imaginary part (Re = -1/2), B_d = V^* B_legs with
B_legs[n] = sqrt(2n + 1); C ~ complex normal; dt log-uniform in [dt_min, dt_max] per channel.
Affine and diagonal: transition(inputs_t) = dA, [B, D, M], |dA| = exp(dt Re A) in (0, 1).

mixer_options: dt_min (0.001), dt_max (0.1).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.kernels import diag_scan
from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer

OPTIONS = {"dt_min": 0.001, "dt_max": 0.1}


def legs_diagonal(n_modes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """S4D-LegS: (eigenvalues [M] with Im > 0, projected B [M]) of HiPPO-LegS's normal part, complex128."""
    n = 2 * n_modes
    q = torch.sqrt(1 + 2 * torch.arange(n, dtype=torch.float64))
    legs = -(torch.tril(q[:, None] * q[None, :], -1) + torch.diag(torch.arange(1, n + 1, dtype=torch.float64)))
    p = torch.sqrt(torch.arange(n, dtype=torch.float64) + 0.5)
    normal = legs + p[:, None] * p[None, :]  # -1/2 I + skew-symmetric
    eigvals, eigvecs = torch.linalg.eig(normal)
    keep = torch.argsort(eigvals.imag)[n_modes:]  # the upper half of the conjugate pairs
    b = eigvecs[:, keep].conj().T @ q.to(torch.complex128)  # V^* B_legs
    return eigvals[keep], b


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    if not 0 < opts["dt_min"] <= opts["dt_max"]:
        raise ValueError(f"s4d mixer_options need 0 < dt_min <= dt_max; got {opts['dt_min']}, {opts['dt_max']}")
    return opts


@register_mixer("s4d", n_layers=2)
class S4D(RecurrentMixer):
    is_affine = True

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        opts = _options(cfg)
        d, m = cfg.d_model, cfg.d_state
        self.state_shape = (d, m)
        eig, b = legs_diagonal(m)
        self.log_neg_re = nn.Parameter(torch.log(-eig.real).float().repeat(d, 1))  # [D, M]
        self.im = nn.Parameter(eig.imag.float().repeat(d, 1))  # [D, M]
        self.log_neg_re._no_weight_decay = self.im._no_weight_decay = True  # eigenvalues, not weights
        self.B = nn.Parameter(torch.view_as_real(b.to(torch.complex64)).repeat(d, 1, 1))  # [D, M, 2]
        self.C = nn.Parameter(torch.randn(d, m, 2) * math.sqrt(0.5))  # [D, M, 2]
        log_lo, log_hi = math.log(opts["dt_min"]), math.log(opts["dt_max"])
        self.log_dt = nn.Parameter(torch.rand(d) * (log_hi - log_lo) + log_lo)  # [D]
        self.D = nn.Parameter(torch.ones(d))
        self.out_proj = nn.Linear(d, d)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        _options(cfg)  # checked as the constructor does
        d = cfg.d_model
        return 6 * d * cfg.d_state + 2 * d + linear_size(d, d), 0  # log_neg_re, im [D, M]; B, C [D, M, 2]

    def discrete(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dA, dB) [D, M] complex64 (ZOH)."""
        A = torch.complex(-torch.exp(self.log_neg_re), self.im)  # [D, M]
        dtA = torch.exp(self.log_dt)[:, None] * A
        dA = torch.exp(dtA)
        return dA, (dA - 1) / A * torch.view_as_complex(self.B)

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"x": x}  # [B, T, D]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        dA, _ = self.discrete()
        return dA.expand(inputs_t["x"].shape[0], *dA.shape)  # [B, D, M]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        dA, dB = self.discrete()
        return dA * h + dB * inputs_t["x"][..., None]  # [B, D, M]

    def scan(self, inputs, pins=None, initial=None, shift=None):
        dA, dB = self.discrete()
        x = inputs["x"]
        a = dA.expand(*x.shape, dA.shape[-1])  # [B, T, D, M] (a view)
        b = dB * x[..., None] if shift is None else dB * x[..., None] + shift
        states = diag_scan(a, b, pins=pins, initial_state=initial).output  # [B, T, D, M]
        return states, states

    def readout(self, x, states, inputs) -> torch.Tensor:
        y = 2 * (states * torch.view_as_complex(self.C)).sum(-1).real  # [B, T, D]
        return self.finish(y, x)

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.gelu(y + self.D * x))

    def convolution_kernel(self, length: int) -> torch.Tensor:
        """K [D, T] with K[d, k] = 2 Re(sum_m C dB dA^k), computed in complex128."""
        dA, dB = (v.to(torch.complex128) for v in self.discrete())
        powers = torch.exp(torch.log(dA)[..., None] * torch.arange(length, dtype=torch.float64, device=dA.device))  # [D, M, T]
        weights = torch.view_as_complex(self.C).to(torch.complex128) * dB  # [D, M]
        return 2 * torch.einsum("dm,dmk->dk", weights, powers).real

    def convolve(self, x: torch.Tensor) -> torch.Tensor:
        """The SSM part y_t = sum_k K[k] x_{t-k} by FFT in float64: [B, T, D] -> [B, T, D]."""
        length = x.shape[1]
        kernel = torch.fft.rfft(self.convolution_kernel(length), n=2 * length)  # [D, F]
        signal = torch.fft.rfft(x.double().transpose(1, 2), n=2 * length)  # [B, D, F]
        return torch.fft.irfft(signal * kernel, n=2 * length)[..., :length].transpose(1, 2).to(x.dtype)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.finish(self.convolve(x), x)

    def fast_segment(self, x, inputs, initial=None):
        """The recurrence from `initial` by diag_scan with the read-out fused, and its final state
        [B, D, M] (the FFT convolution starts from zero and keeps no state): declared state patches."""
        dA, dB = self.discrete()
        u = inputs["x"]
        b = dB * u[..., None]  # [B, T, D, M]
        c = torch.view_as_complex(self.C).expand(b.shape)
        out = diag_scan(dA.expand(b.shape), b, c, initial_state=initial, output_final_state=True)
        return self.finish(2 * out.output.real, x), out.final_state
