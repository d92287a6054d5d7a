"""Kimi Delta Attention (KDA; Kimi Team 2025, "Kimi Linear"): the delta rule with a decay per key
channel, laid out like transformers' KimiLinearDeltaAttention and fla's KimiDeltaAttention (so
`models.interop.kimi_linear` maps a KimiLinearForCausalLM layer 1:1).

H = num_heads heads with keys of width K = head_dim and values of width V = expand_v * K. From the
mixer input x_t [d_model]:

    c_t = SiLU(conv([W_q x | W_k x | W_v x])_t)        short causal depthwise conv, width d_conv
    q_t, k_t, v_t = split(c_t) per head                q, k [H, K], v [H, V]
    q_t <- K^-1/2 q_t / sqrt(|q_t|^2 + 1e-6),  k_t <- k_t / sqrt(|k_t|^2 + 1e-6)   (fla's l2norm)
    beta_t  = s * sigmoid(W_b x_t)                     [H]      s = beta_scale
    dt_t    = softplus(W_fb W_fa x_t + dt_bias)        [H, K]   hook_dt (W_fa: rank V)
    alpha_t = exp(g_t),  g_t = -exp(A_log_h) dt_t      [H, K]   the per-channel decay in (0, 1]
    S_t = S_{t-1} Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T      S_t [H, V (values), K (keys)]
    o_t = S_t q_t                                      [H, V]
    y_t = W_o concat_h( RMSNorm(o_t,h) * sigmoid(W_gb W_ga x_t)_h )     (W_ga: rank V)

so alpha_t scales each key column of the state (fla's [K, V] layout: S^T_t = (I - beta k k^T)
Diag(alpha_t) S^T_{t-1} + beta k v^T). Affine in the state: vec(S_t) = M_t vec(S_{t-1}) + ..., M_t
acting on each value row as Diag(alpha_t) (I - beta_t k_t k_t^T) (`transition`, dense [B, n, n],
n = H V K).

Hooks (besides hook_in / hook_out / hook_state):
  hook_conv   [B, T, 2 H K + H V]  the SiLU'd short-conv outputs of q | k | v
  hook_q, hook_k  [B, T, H, K]  the normalised (q: and scaled) queries and keys the recurrence uses
  hook_v      [B, T, H, V]
  hook_beta   [B, T, H]     beta = s * sigmoid(.)
  hook_dt     [B, T, H, K]  softplus(W_fb W_fa x + dt_bias); the log decay is g = -exp(A_log) dt
  hook_gate   [B, T, H, V]  sigmoid(W_gb W_ga x), the output gate
  hook_state  [B, T, H, V, K]  S_t after step t, values x keys (transformers' recurrent state is
                             the transpose, [H, K, V])
  hook_z      [B, T, H, V]  each head's RMSNorm(o_t) * gate, what W_o reads
  hook_result [B, T, H, d_model]  each head's share of the output (sum over heads = hook_out)

Paths (models.mixers.delta.DeltaRuleMixer): fast = models.kernels.delta_rule with the channel-wise
decay g [B, T, H, K], outputs only; instrumented = the same kernel with every step's state
exported and hook_state pins honoured (a patch at t changes every later step, nothing before t).
Memory: the chunked form (under autograd) forms each chunk's decay factors [B, H, C, C, K]
(models.kernels.delta_rule), so the default chunk is 16 steps, not 64.

mixer_options: num_heads (None: cfg.n_heads), head_dim (None: cfg.head_dim), expand_v (1.0),
conv_bias (False), gate_bias (False: transformers' layout; fla's g_proj has a bias on W_gb),
norm_eps (1e-5: the output norm's eps), chunk_size (16), impl (delta_rule's: "auto", "naive",
"chunked", "native", "triton").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.hooks import HookPoint
from models.kernels import delta_rule
from models.kernels.delta_rule import IMPLS
from models.mixers.base import FLOAT32_BYTES, linear_size, mixer_options, register_mixer
from models.mixers.delta import DeltaRuleMixer

OPTIONS = {
    "num_heads": None,
    "head_dim": None,
    "expand_v": 1.0,
    "conv_bias": False,
    "gate_bias": False,
    "norm_eps": 1e-5,
    "chunk_size": 16,
    "impl": "auto",
}


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    for name in ("num_heads", "head_dim"):
        value = opts[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"kda mixer_options[{name!r}] must be None or a positive int; got {value!r}")
    heads = opts["num_heads"] or cfg.n_heads
    d_k = opts["head_dim"] or cfg.head_dim
    d_v = opts["expand_v"] * d_k
    if not isinstance(opts["expand_v"], (int, float)) or d_v < 1 or not math.isclose(d_v, round(d_v)):
        raise ValueError(f"kda mixer_options['expand_v'] * head_dim must be a positive int; got "
                         f"{opts['expand_v']!r} * {d_k}")
    for name in ("conv_bias", "gate_bias"):
        if not isinstance(opts[name], bool):
            raise TypeError(f"kda mixer_options[{name!r}] must be a bool; got {opts[name]!r}")
    if opts["impl"] not in IMPLS:
        raise ValueError(f"kda mixer_options['impl'] must be one of {IMPLS}; got {opts['impl']!r}")
    scales = cfg.beta_scales  # one per cfg.n_heads
    if heads != cfg.n_heads and len(set(scales)) > 1:
        raise ValueError(f"kda with num_heads={heads} != n_heads={cfg.n_heads} needs one beta_scale for every "
                         f"head; got {cfg.beta_scale!r}")
    return {**opts, "num_heads": heads, "head_dim": d_k, "d_v": int(round(d_v)),
            "beta_scales": scales if heads == cfg.n_heads else scales[:1] * heads}


_PRESET = dict(n_layers=2, d_model=64, n_heads=4, d_conv=4, norm="rmsnorm", mlp=True)


@register_mixer("kda", **_PRESET)
class KimiDeltaAttention(DeltaRuleMixer):

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        opts = self.options = _options(cfg)
        self.heads, self.d_k, self.d_v = opts["num_heads"], opts["head_dim"], opts["d_v"]
        self.state_shape = (self.heads, self.d_v, self.d_k)
        key_dim, value_dim = self.heads * self.d_k, self.heads * self.d_v
        self.split = [key_dim, key_dim, value_dim]
        self.q_proj = nn.Linear(cfg.d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, value_dim, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(sum(self.split), cfg.d_conv))  # [q | k | v] channels
        nn.init.kaiming_uniform_(self.conv_weight, a=5**0.5)  # as nn.Conv1d (fan_in = d_conv)
        self.conv_bias = nn.Parameter(torch.zeros(sum(self.split))) if opts["conv_bias"] else None
        self.f_a_proj = nn.Linear(cfg.d_model, self.d_v, bias=False)
        self.f_b_proj = nn.Linear(self.d_v, key_dim, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.heads).uniform_(1, 16)))  # fla: A ~ U(1, 16)
        self.A_log._no_weight_decay = True
        dt = torch.exp(torch.rand(key_dim) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus, as fla
        self.b_proj = nn.Linear(cfg.d_model, self.heads, bias=False)
        self.register_buffer("beta_scales", torch.tensor(opts["beta_scales"]), persistent=False)
        self.g_a_proj = nn.Linear(cfg.d_model, self.d_v, bias=False)
        self.g_b_proj = nn.Linear(self.d_v, value_dim, bias=opts["gate_bias"])
        self.o_norm = nn.RMSNorm(self.d_v, eps=float(opts["norm_eps"]))
        self.o_proj = nn.Linear(value_dim, cfg.d_model, bias=False)
        for name in ("hook_conv", "hook_q", "hook_k", "hook_v", "hook_beta", "hook_dt", "hook_gate", "hook_z",
                     "hook_result"):
            setattr(self, name, HookPoint())

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d = _options(cfg), cfg.d_model
        heads, d_v = opts["num_heads"], opts["d_v"]
        key_dim, value_dim = heads * opts["head_dim"], heads * d_v
        channels = 2 * key_dim + value_dim
        return (linear_size(d, channels, False) + channels * (cfg.d_conv + opts["conv_bias"])
                + linear_size(d, d_v, False) + linear_size(d_v, key_dim, False) + heads + key_dim
                + linear_size(d, heads, False) + linear_size(d, d_v, False)
                + linear_size(d_v, value_dim, opts["gate_bias"])
                + d_v + linear_size(value_dim, d, False)), FLOAT32_BYTES * heads  # beta_scales

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        batch, length, _ = x.shape
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        conv = self.hook_conv(F.silu(self.convolve(qkv, self.conv_weight, self.conv_bias)))  # [B, T, 2HK + HV]
        q, k, v = conv.split(self.split, dim=-1)

        def heads(x):  # [B, T, H K] -> [B, T, H, K], unit norm as fla's l2norm
            x = x.reshape(batch, length, self.heads, self.d_k)
            return x / torch.sqrt(x.square().sum(-1, keepdim=True) + 1e-6)

        dt = F.softplus(self.f_b_proj(self.f_a_proj(x)) + self.dt_bias)
        dt = self.hook_dt(dt.reshape(batch, length, self.heads, self.d_k))  # [B, T, H, K]
        gate = self.g_b_proj(self.g_a_proj(x)).reshape(batch, length, self.heads, self.d_v)
        return {
            "q": self.hook_q(heads(q) * self.d_k**-0.5),
            "k": self.hook_k(heads(k)),
            "v": self.hook_v(v.reshape(batch, length, self.heads, self.d_v)),
            "beta": self.hook_beta(self.beta_scales * torch.sigmoid(self.b_proj(x))),  # [B, T, H]
            "g": -torch.exp(self.A_log)[:, None] * dt,  # log alpha [B, T, H, K]
            "gate": self.hook_gate(torch.sigmoid(gate)),  # [B, T, H, V]
        }

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        k, v, beta = inputs_t["k"], inputs_t["v"], inputs_t["beta"]  # [B, H, K], [B, H, V], [B, H]
        h = torch.exp(inputs_t["g"])[:, :, None, :] * h  # S_{t-1} Diag(alpha_t)
        recalled = torch.einsum("bhvk,bhk->bhv", h, k)
        return h + (beta[..., None] * (v - recalled))[..., None] * k[:, :, None, :]  # [B, H, V, K]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Dense [B, n, n], n = H V K: vec(S_t) = M_t vec(S_{t-1}) + ..., row-major (h, v, k)."""
        k, beta = inputs_t["k"], inputs_t["beta"]  # [B, H, K], [B, H]
        batch, heads, d = k.shape
        eye = torch.eye(d, dtype=k.dtype, device=k.device)
        # S_t[h, v, j] = sum_i S_{t-1}[h, v, i] alpha_i (I - beta k k^T)[i, j]
        A = torch.exp(inputs_t["g"])[..., :, None] * (eye - beta[..., None, None] * k[..., :, None] * k[..., None, :])
        eye_h = torch.eye(heads, dtype=k.dtype, device=k.device)
        eye_v = torch.eye(self.d_v, dtype=k.dtype, device=k.device)
        M = torch.einsum("hg,vw,bhij->bhvjgwi", eye_h, eye_v, A)
        n = heads * self.d_v * d
        return M.reshape(batch, n, n)

    def kernel(self, inputs, initial=None, **kwargs):
        return delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], g=inputs["g"],
                          initial_state=initial, chunk_size=self.options["chunk_size"],
                          impl=self.options["impl"], **kwargs)

    def output_projection(self) -> nn.Linear:
        return self.o_proj
