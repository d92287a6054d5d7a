"""Mamba: the selective state-space mixer (Gu & Dao 2023, reference mamba_simple.py).

    x, z   = in_proj(u)                                   [B, T, E] each, E = expand * d_model
    x      = SiLU(short_conv(x))                          hook_conv [B, T, E], width d_conv
    dt, B, C = x_proj(x)                                  dt_low [B, T, R], B, C [B, T, N]
    dt     = softplus(dt_proj(dt_low))                    hook_dt [B, T, E] (bias = inv-softplus dt0)
    A      = -exp(A_log)                                  [E, N], S4D-real init A[e, n] = -(n + 1)
    h_t    = exp(dt_t A) * h_{t-1} + (dt_t x_t) B_t^T     h_t [B, E, N] (hook_state [B, T, E, N])
    y_t    = h_t C_t + D * x_t                            [B, T, E]
    out    = out_proj(y * SiLU(z))                        hook_gate = SiLU(z) [B, T, E]

Affine and diagonal (is_affine = True): dh_t/dh_{t-1} = exp(dt_t A), every entry in (0, 1)
since dt > 0 and A < 0; transition(inputs_t) returns it as [B, E, N].

Fast path: on the CPU (float32/64, a C compiler present) models.kernels.native.selective.selective_scan,
which forms exp(dt A) and dt x B inside its loop and reads out C h there, so no [B, T, E, N] tensor
exists in the forward or the backward; elsewhere (and for transitions the C kernels do not know)
models.kernels.diag_scan with the read-out C fused. Instrumented path: every state through
hook_state, from native.selective.selective_states (a and b formed in C; differentiable without pins)
on the CPU, except a scan with pins while a gradient is wanted, which runs diag_scan over a and b;
state patches are pins and the scan resumes from them. A hook_state gradient probe
(run_with_cache(incl_bwd=True)) and a shift without pins run native.selective.selective_states_shifted
(every state and the read-out in one C call; its backward writes d metric / d h_t). Declared state patches (models.StatePatch)
run on the fast path, the selective scan stopping at each patched step (its final state out) and
resuming from the patched state. The scan plumbing is models.mixers.diagonal.DiagonalScanMixer's.

Variants (negative_mamba, aussm, mamba3) subclass this and override `transition_terms` (and
`prepare` / `initial_state` where they need more inputs or a complex state; the read-out of a
complex state is its real part). The C kernels form a_t = s exp(dt_t A) - (s - 1) for a scale s:
a class whose transition_terms is that transition declares s as `native_transition_scale` beside
it (Mamba 1, negative_mamba 2) and runs them. The complex variants (aussm, mamba3) subclass
ComplexNativeMamba below, which runs their own C kernels (native.complex.rotation_* / trapezoid_*)
the same way; everything else runs diag_scan.

mixer_options: dt_rank (default ceil(d_model / 16)), dt_min (0.001), dt_max (0.1),
dt_init_floor (1e-4), conv_bias (True), bias (False, in/out projections), chunk_size (64).
dt_bc_norm_eps (None): a float puts RMS norms with weights (dt_norm, B_norm, C_norm, that eps) on
dt_low, B and C right after x_proj, as Jamba does (FalconMamba: the same with unit weights).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.hooks import HookPoint
from models.kernels.native import complex as native_complex
from models.kernels.native import selective as native_selective
from models.mixers.base import linear_size, mixer_options, register_mixer
from models.mixers.diagonal import DiagonalScanMixer

OPTIONS = {
    "dt_rank": None,
    "dt_min": 0.001,
    "dt_max": 0.1,
    "dt_init_floor": 1e-4,
    "conv_bias": True,
    "bias": False,
    "chunk_size": 64,
    "dt_bc_norm_eps": None,
}


def mamba_options(cfg) -> dict:
    """Defaults merged with cfg.mixer_options; unknown keys or a bad dt range raise."""
    merged = mixer_options(cfg, OPTIONS)
    if not 0 < merged["dt_min"] <= merged["dt_max"]:
        raise ValueError(
            f"{cfg.mixer} mixer_options need 0 < dt_min <= dt_max; got {merged['dt_min']}, {merged['dt_max']}"
        )
    eps = merged["dt_bc_norm_eps"]
    if eps is not None and (not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0):
        raise ValueError(f"{cfg.mixer} mixer_options dt_bc_norm_eps must be None or a positive float; got {eps!r}")
    return merged


@register_mixer("mamba", n_layers=2, norm="rmsnorm")
class Mamba(DiagonalScanMixer):
    native_transition_scale = 1.0  # transition_terms is the C kernels' transition with s = 1 (see native_scale)

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        opts = mamba_options(cfg)
        d_inner, n = cfg.expand * cfg.d_model, cfg.d_state
        self.d_inner, self.d_state = d_inner, n
        self.dt_rank = opts["dt_rank"] or math.ceil(cfg.d_model / 16)
        self.chunk_size = opts["chunk_size"]
        self.state_shape = (d_inner, n)
        self.in_proj = nn.Linear(cfg.d_model, 2 * d_inner, bias=opts["bias"])
        self.conv = nn.Conv1d(d_inner, d_inner, cfg.d_conv, groups=d_inner, bias=opts["conv_bias"])
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * n, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.A_log._no_weight_decay = True  # a decay rate, not a weight (interp.training.train.make_optimizer)
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, cfg.d_model, bias=opts["bias"])
        self._init_dt(opts)
        self.hook_conv = HookPoint()
        self.hook_dt = HookPoint()
        self.hook_gate = HookPoint()
        if opts["dt_bc_norm_eps"] is not None:
            eps = float(opts["dt_bc_norm_eps"])
            self.dt_norm, self.B_norm, self.C_norm = (nn.RMSNorm(d, eps=eps) for d in (self.dt_rank, n, n))

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d, n = mamba_options(cfg), cfg.d_model, cfg.d_state
        d_inner, rank = cfg.expand * d, opts["dt_rank"] or math.ceil(d / 16)
        norms = rank + 2 * n if opts["dt_bc_norm_eps"] is not None else 0
        return (linear_size(d, 2 * d_inner, opts["bias"]) + d_inner * (cfg.d_conv + bool(opts["conv_bias"]))
                + linear_size(d_inner, rank + 2 * n, False) + linear_size(rank, d_inner) + d_inner * (n + 1)
                + linear_size(d_inner, d, opts["bias"]) + norms), 0

    @torch.no_grad()
    def _init_dt(self, opts: dict) -> None:
        """dt_proj as in the reference: weight ~ U(+-R^-1/2), softplus(bias) log-uniform in [dt_min, dt_max]."""
        std = self.dt_rank ** -0.5
        nn.init.uniform_(self.dt_proj.weight, -std, std)
        log_lo, log_hi = math.log(opts["dt_min"]), math.log(opts["dt_max"])
        dt = torch.exp(torch.rand(self.d_inner) * (log_hi - log_lo) + log_lo).clamp(min=opts["dt_init_floor"])
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus

    def prepare(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        x, z = self.in_proj(u).chunk(2, dim=-1)  # [B, T, E] each
        x = self.hook_conv(F.silu(self.convolve(x, self.conv.weight[:, 0], self.conv.bias)))
        dt_low, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        if hasattr(self, "dt_norm"):
            dt_low, B, C = self.dt_norm(dt_low), self.B_norm(B), self.C_norm(C)
        dt = self.hook_dt(F.softplus(self.dt_proj(dt_low)))  # [B, T, E]
        gate = self.hook_gate(F.silu(z))  # [B, T, E]
        return {"x": x, "dt": dt, "B": B, "C": C, "gate": gate}

    def A(self) -> torch.Tensor:
        return -torch.exp(self.A_log)  # [E, N]

    def transition_terms(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(a, b) of h_t = a_t * h_{t-1} + b_t for every step given [B, T, ...] (or [B, ...]) inputs."""
        dt = inputs["dt"][..., None]  # [B, (T,) E, 1]
        a = torch.exp(dt * self.A())  # [B, (T,) E, N]
        b = (dt * inputs["x"][..., None]) * inputs["B"][..., None, :]  # [B, (T,) E, N]
        return a, b

    def native_states(self, inputs, pins=None, initial=None) -> torch.Tensor | None:
        """Every state [B, T, E, N] from native_selective.selective_states (a and b formed in its C
        loop) when the transition is a native one (native_scale) and it runs here (CPU,
        float32/64; with pins only when no gradient is wanted: its backward takes none), else None."""
        dt, x, B = inputs["dt"], inputs["x"], inputs["B"]
        scale = self.native_scale()
        if scale is None or not native_selective.selective_states_supported(dt, self.A(), x, B, initial, pins):
            return None
        return native_selective.selective_states(dt, self.A(), x, B, initial_state=initial, pins=pins, scale=scale)

    def head_states(self, inputs, heads) -> torch.Tensor | None:
        """The states of channels `heads` only [B, T, k, N] (each channel's recurrence runs apart)
        from native selective_states on those channels, or None where it does not run."""
        index = torch.tensor(heads, device=inputs["dt"].device)
        picked = {**inputs, "dt": inputs["dt"][..., index], "x": inputs["x"][..., index]}
        scale, A = self.native_scale(), self.A()[index]
        if scale is None or not native_selective.selective_states_supported(picked["dt"], A, picked["x"], picked["B"]):
            return None
        return native_selective.selective_states(picked["dt"], A, picked["x"], picked["B"], scale=scale)

    def native_states_supported(self, inputs, initial=None) -> bool:
        dt, x, B = inputs["dt"], inputs["x"], inputs["B"]
        return self.native_scale() is not None and native_selective.selective_states_supported(dt, self.A(), x, B, initial)

    def native_shifted(self, inputs, shift, initial=None):
        """(y [B, T, E], states [B, T, E, N]) with shift [B, T, E, N] added to each step's state from
        native_selective.selective_states_shifted (differentiable in shift: the states' adjoint) for
        a native transition on the CPU in float32/64, else None."""
        if not self.native_shifted_supported(inputs, initial) or not native_selective.selective_supported(shift):
            return None
        return native_selective.selective_states_shifted(inputs["dt"], self.A(), inputs["x"], inputs["B"], inputs["C"],
                                                         shift, initial_state=initial, scale=self.native_scale())

    def native_shifted_supported(self, inputs, initial=None) -> bool:
        return self.native_scale() is not None and native_selective.selective_supported(
            inputs["dt"], self.A(), inputs["x"], inputs["B"], inputs["C"], initial)

    def native_scan(self, inputs, initial=None, final: bool = False):
        """(y [B, T, E], h_{T-1} or None) from native_selective.selective_scan (a and b formed in its
        C loop, the read-out fused: no [B, T, E, N] tensor) for a native transition on the CPU in
        float32/64, else None."""
        dt, x, B, C = inputs["dt"], inputs["x"], inputs["B"], inputs["C"]
        scale = self.native_scale()
        if scale is None or not native_selective.selective_supported(dt, self.A(), x, B, C, initial):
            return None
        out = native_selective.selective_scan(dt, self.A(), x, B, C, initial_state=initial, chunk_size=self.chunk_size,
                                              scale=scale, output_final_state=final)
        return out if final else (out, None)

    def readout_c(self, inputs, b) -> torch.Tensor:
        return inputs["C"]  # [B, T, N], shared by every channel

    def readout(self, u, states, inputs) -> torch.Tensor:
        states = states.real if states.is_complex() else states  # C is real: Re(h C) = Re(h) C
        y = (states @ inputs["C"][..., None])[..., 0]  # [B, T, E, N] @ [B, T, N, 1] -> [B, T, E]
        return self.finish(y, inputs)

    def finish(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, T, E] read-out (the real part for complex-state variants) -> [B, T, d_model]."""
        y = y.real if y.is_complex() else y
        return self.out_proj((y + self.D * inputs["x"]) * inputs["gate"])

    def native_scale(self) -> float | None:
        """The scale s with which the native selective kernels form this class's transition
        (a = s exp(dt A) - (s - 1), b = dt x B; Mamba 1, negative Mamba 2), or None when they do not
        know it: s is the native_transition_scale declared by the class that defines the
        transition_terms in use, so a variant overriding transition_terms without declaring one
        (AUSSM, Mamba-3) gets None and the unfused path."""
        owner = next(k for k in type(self).__mro__ if "transition_terms" in vars(k))
        return vars(owner).get("native_transition_scale")


class ComplexNativeMamba(Mamba):
    """Base of the complex-state variants whose transition a native C kernel forms (aussm:
    "rotation", mamba3: "trapezoid"): `native_kernel` names native.complex's <name>_scan (fused
    read-out, differentiable) and <name>_states (every state; differentiable without pins), both
    taking native_args(inputs). They run on the CPU in float32/64 (initial state None or of the complex
    dtype); elsewhere Mamba's unfused path (transition_terms into diag_scan)."""

    native_kernel: str

    def native_args(self, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def native_scan(self, inputs, initial=None, final: bool = False):
        args = self.native_args(inputs)
        if not native_complex.complex_supported(*args, inputs["C"], initial_state=initial):
            return None
        fused = getattr(native_complex, f"{self.native_kernel}_scan")
        out = fused(*args, inputs["C"], initial_state=initial, chunk_size=self.chunk_size, output_final_state=final)
        return out if final else (out, None)  # y [B, T, E]

    def native_states(self, inputs, pins=None, initial=None) -> torch.Tensor | None:
        """The complex states [B, T, E, N] from <kernel>_states where it runs here
        (complex_states_supported: with pins only when no gradient is wanted), else None."""
        args = self.native_args(inputs)
        if not native_complex.complex_states_supported(*args, initial_state=initial, pins=pins):
            return None
        return getattr(native_complex, f"{self.native_kernel}_states")(*args, initial_state=initial, pins=pins)

    def native_states_supported(self, inputs, initial=None) -> bool:
        return native_complex.complex_states_supported(*self.native_args(inputs), initial_state=initial)
