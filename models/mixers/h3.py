"""H3 (Fu et al. 2023, "Hungry Hungry Hippos: Towards Language Modeling with State Space Models").

    q_t, k_t, v_t = W_q x_t, W_k x_t, W_v x_t                                        [C]
    kbar = SSM_shift(k)         a shift SSM = a learned causal depthwise conv of width d_conv
    u_t  = kbar_t * v_t                                                              [C]
    h_t  = Abar * h_{t-1} + Bbar * u_t       h_0 = 0, per channel c a diagonal N-state [C, N]
    s_t  = sum_n C[c, n] h_t[c, n] + Dskip[c] u_t[c]
    y_t  = W_o (q_t * s_t)

C = n_heads * d_head channels; this is the paper's head-dimension-1 form (every operation is
per channel), and the heads only group channels for hook_q/k/v [B, T, H, d_head].
The diagonal SSM is S4D-style and time-invariant with real negative A (S4D-Real init
A[c, n] = -(n + 1)), zero-order-hold discretisation with a learned step dt[c] (log-uniform in
[1e-3, 1e-1] at init): Abar = exp(dt A), Bbar = (Abar - 1) / A * B. N = cfg.d_state.

Being time-invariant, the SSM is a convolution with kernel K[c, l] = sum_n C Bbar Abar^l
(plus the Dskip term). Fast path: FFT convolution of u with K. Instrumented path: the recurrence
(models.kernels.diag_scan, which honours state pins; `step` is the same update one step at a time),
hook_state [B, T, C, N] with causal state patches; declared ones (models.StatePatch) run diag_scan
with the read-out fused. The update is affine (is_affine) with the
diagonal transition Abar.

Hooks: hook_q, hook_k, hook_v [B, T, H, d_head], hook_conv [B, T, C] (the shifted keys kbar),
hook_state [B, T, C, N].
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.hooks import HookPoint
from models.kernels import diag_scan
from models.kernels.fft_conv import fft_causal_conv
from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("h3", n_layers=2, mlp=True, d_conv=4, d_state=16, norm="layernorm")
class H3(RecurrentMixer):
    is_affine = True

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        mixer_options(cfg, {})
        self.n_heads, self.d_head = cfg.n_heads, cfg.head_dim
        channels, n = self.n_heads * self.d_head, cfg.d_state
        self.state_shape = (channels, n)
        self.qkv = nn.Linear(cfg.d_model, 3 * channels)
        self.shift_conv_weight = nn.Parameter(torch.randn(channels, cfg.d_conv) / math.sqrt(cfg.d_conv))
        log_dt = torch.rand(channels) * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3)
        self.log_dt = nn.Parameter(log_dt)
        self.log_neg_a = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(channels, 1))
        self.log_neg_a._no_weight_decay = True  # a decay rate, not a weight (interp.training.train.make_optimizer)
        self.b = nn.Parameter(torch.ones(channels, n))
        self.c = nn.Parameter(torch.randn(channels, n) * math.sqrt(0.5))
        self.d_skip = nn.Parameter(torch.randn(channels))
        self.out_proj = nn.Linear(channels, cfg.d_model)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_conv = HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        channels, d = cfg.n_heads * cfg.head_dim, cfg.d_model
        return (linear_size(d, 3 * channels) + channels * (cfg.d_conv + 2 + 3 * cfg.d_state)
                + linear_size(channels, d)), 0

    def discretised(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dt A, Abar, Bbar), each [C, N], zero-order hold."""
        a = -self.log_neg_a.exp()
        dt_a = self.log_dt.exp()[:, None] * a
        abar = dt_a.exp()
        return dt_a, abar, (abar - 1) / a * self.b

    def kernel(self, length: int) -> torch.Tensor:
        """K[c, l] = sum_n C Bbar Abar^l for l < length -> [C, T]."""
        dt_a, _, bbar = self.discretised()
        steps = torch.arange(length, device=dt_a.device, dtype=dt_a.dtype)
        powers = (dt_a[:, :, None] * steps).exp()  # [C, N, T] = Abar^l
        return torch.einsum("cn,cnl->cl", self.c * bbar, powers)

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, length, _ = x.shape
        heads = self.qkv(x).view(batch, length, 3, self.n_heads, self.d_head)
        q = self.hook_q(heads[:, :, 0]).flatten(2)  # [B, T, C]
        k = self.hook_k(heads[:, :, 1]).flatten(2)
        v = self.hook_v(heads[:, :, 2]).flatten(2)
        kbar = self.hook_conv(self.convolve(k, self.shift_conv_weight))  # [B, T, C]
        return {"u": kbar * v, "q": q}

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        _, abar, bbar = self.discretised()
        return abar * h + bbar * inputs_t["u"][..., None]  # [B, C, N]

    def scan(self, inputs: dict[str, torch.Tensor], pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrence by the diagonal-scan kernel, honouring pins, from `initial` [B, C, N]
        (None: zeros), shift [B, T, C, N] added to each step -> (states, states) [B, T, C, N]."""
        _, abar, bbar = self.discretised()
        u = inputs["u"]  # [B, T, C]
        a = abar.expand(*u.shape[:2], *abar.shape)
        b = bbar * u[..., None] if shift is None else bbar * u[..., None] + shift
        states = diag_scan(a, b, pins=pins, initial_state=initial).output
        return states, states

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        _, abar, _ = self.discretised()
        return abar.expand(inputs_t["u"].shape[0], *self.state_shape)

    def gated_output(self, ssm_out: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """ssm_out [B, T, C] (without the skip term) -> W_o (q * (ssm_out + Dskip u)) [B, T, D]."""
        return self.out_proj(inputs["q"] * (ssm_out + self.d_skip * inputs["u"]))

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.gated_output((states * self.c).sum(-1), inputs)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        inputs = self.prepare(x)
        u = inputs["u"]
        return self.gated_output(fft_causal_conv(u, self.kernel(u.shape[1])), inputs)

    def fast_segment(self, x, inputs, initial=None):
        """The recurrence from `initial` by diag_scan with the read-out fused, and its final state
        [B, C, N] (the FFT convolution starts from zero): declared state patches."""
        _, abar, bbar = self.discretised()
        b = bbar * inputs["u"][..., None]  # [B, T, C, N]
        out = diag_scan(abar.expand(b.shape), b, self.c.expand(b.shape), initial_state=initial, output_final_state=True)
        return self.gated_output(out.output, inputs), out.final_state
