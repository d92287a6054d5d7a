"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025), laid out exactly like fla's GatedDeltaNet layer
(so `models.interop` maps an fla GatedDeltaNetForCausalLM 1:1).

H = n_heads query/key heads of width K = d_head (mixer_options num_heads / head_dim override them,
for a hybrid whose attention heads differ); HV = num_v_heads value heads (H by default; a
multiple of H: value head i reads query/key head i // (HV / H), fla's GVA) of width
V = expand_v * K. From the mixer input x_t [d_model]:

    c_t = SiLU(conv([W_q x | W_k x | W_v x])_t)        short causal depthwise conv, width d_conv
    q_t, k_t, v_t = split(c_t) per head                q, k [H, K], v [HV, V]
    q_t <- K^-1/2 q_t / sqrt(|q_t|^2 + 1e-6),  k_t <- k_t / sqrt(|k_t|^2 + 1e-6)   (fla's l2norm)
    beta_t  = s * sigmoid(W_b x_t)                     [HV]   s = beta_scale (2: allow_neg_eigval)
    dt_t    = softplus(W_a x_t + dt_bias)              [HV]   hook_dt
    alpha_t = exp(g_t),  g_t = -exp(A_log) dt_t        [HV]   the per-step decay in (0, 1]
    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T      S_t [HV, V (values), K (keys)]
    o_t = S_t q_t                                      [HV, V]
    y_t = W_o concat_h( RMSNorm(o_t,h) * act(W_g x_t)_h )   act = SiLU (fla's swish) or sigmoid;
                                                        without the gate just RMSNorm(o_t,h)

Affine in the state: vec(S_t) = alpha_t M_t vec(S_{t-1}) + ..., M_t acting on each value row as
I - beta_t k_t k_t^T (`transition` returns alpha_t M_t dense, [B, n, n], n = HV V K).

Hooks (besides hook_in / hook_out / hook_state):
  hook_conv   [B, T, 2 H K + HV V]  the SiLU'd short-conv outputs of q | k | v
  hook_q, hook_k  [B, T, HV, K]  the normalised (q: and scaled) queries and keys the recurrence
                             uses, one per value head (repeated across a GVA group)
  hook_v      [B, T, HV, V]
  hook_beta   [B, T, HV]     beta = s * sigmoid(.)
  hook_dt     [B, T, HV]     softplus(W_a x + dt_bias); the log decay is g = -exp(A_log) dt
  hook_gate   [B, T, HV, V]  act(W_g x), only with mixer_options gate=True
  hook_state  [B, T, HV, V, K]  S_t after step t, values x keys (fla's GatedDeltaNet layer stores
                             the same layout: its kernels run with state_v_first=True)
  hook_z      [B, T, HV, V]  each value head's RMSNorm(o_t) [* gate], what W_o reads
  hook_result [B, T, HV, d_model]  each value head's share of the output (sum over heads = hook_out)

Paths (models.mixers.delta.DeltaRuleMixer): fast = models.kernels.delta_rule with the decay g,
outputs only; instrumented = the same kernel with every step's state exported and hook_state
pins honoured (a patch at t re-runs the recurrence from the pinned state, so every later step
changes and nothing before t).

mixer_options: num_heads (None: cfg.n_heads), head_dim (None: cfg.head_dim), expand_v (2.0, fla's
default), num_v_heads (None: H), gate (True: fla's use_gate), gate_activation ("swish" / "silu" /
"sigmoid"), conv_bias (False), norm_eps (1e-5: the output norm's eps), chunk_size (64), impl
(delta_rule's: "auto", "naive", "chunked", "native", "triton").
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
    "expand_v": 2.0,
    "num_v_heads": None,
    "gate": True,
    "gate_activation": "swish",
    "conv_bias": False,
    "norm_eps": 1e-5,
    "chunk_size": 64,
    "impl": "auto",
}
ACTIVATIONS = ("swish", "silu", "sigmoid")


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    for name in ("num_heads", "head_dim"):
        value = opts[name]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"gated_deltanet mixer_options[{name!r}] must be None or a positive int; got {value!r}")
    heads = opts["num_heads"] or cfg.n_heads
    d_k = opts["head_dim"] or cfg.head_dim
    v_heads = opts["num_v_heads"] if opts["num_v_heads"] is not None else heads
    if not isinstance(v_heads, int) or isinstance(v_heads, bool) or v_heads < heads or v_heads % heads:
        raise ValueError(f"gated_deltanet mixer_options['num_v_heads'] must be None or a multiple of the "
                         f"{heads} query/key heads; got {opts['num_v_heads']!r}")
    d_v = opts["expand_v"] * d_k
    if not isinstance(opts["expand_v"], (int, float)) or d_v < 1 or not math.isclose(d_v, round(d_v)):
        raise ValueError(f"gated_deltanet mixer_options['expand_v'] * d_head must be a positive int; got "
                         f"{opts['expand_v']!r} * {d_k}")
    for name in ("gate", "conv_bias"):
        if not isinstance(opts[name], bool):
            raise TypeError(f"gated_deltanet mixer_options[{name!r}] must be a bool; got {opts[name]!r}")
    if opts["gate_activation"] not in ACTIVATIONS:
        raise ValueError(f"gated_deltanet mixer_options['gate_activation'] must be one of {ACTIVATIONS}; "
                         f"got {opts['gate_activation']!r}")
    if opts["impl"] not in IMPLS:
        raise ValueError(f"gated_deltanet mixer_options['impl'] must be one of {IMPLS}; got {opts['impl']!r}")
    scales = cfg.beta_scales  # one per cfg.n_heads
    if (v_heads != heads or heads != cfg.n_heads) and len(set(scales)) > 1:
        raise ValueError(f"gated_deltanet with num_v_heads={v_heads} or num_heads={heads} != n_heads={cfg.n_heads} "
                         f"needs one beta_scale for every head; got {cfg.beta_scale!r}")
    scales = scales if heads == cfg.n_heads else scales[:1] * heads
    return {**opts, "num_heads": heads, "head_dim": d_k, "num_v_heads": v_heads, "d_v": int(round(d_v)),
            "beta_scales": [scales[i * heads // v_heads] for i in range(v_heads)]}


_PRESET = dict(n_layers=2, d_model=64, n_heads=4, d_conv=4, norm="rmsnorm", mlp=True)


@register_mixer("gated_deltanet", **_PRESET)
class GatedDeltaNet(DeltaRuleMixer):

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.resume_context = cfg.d_conv - 1  # prepare()'s short conv reads d_conv - 1 earlier inputs
        self.carries_conv = True  # ... through convolve: a decoder carries its window (models.decoding)
        opts = self.options = _options(cfg)
        self.heads, self.v_heads, self.d_k, self.d_v = opts["num_heads"], opts["num_v_heads"], opts["head_dim"], opts["d_v"]
        self.state_shape = (self.v_heads, self.d_v, self.d_k)
        key_dim, value_dim = self.heads * self.d_k, self.v_heads * self.d_v
        self.split = [key_dim, key_dim, value_dim]
        self.q_proj = nn.Linear(cfg.d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, value_dim, bias=False)
        self.a_proj = nn.Linear(cfg.d_model, self.v_heads, bias=False)
        self.b_proj = nn.Linear(cfg.d_model, self.v_heads, bias=False)
        self.A_log = nn.Parameter(torch.log(torch.empty(self.v_heads).uniform_(1e-4, 16)))  # fla: A ~ U(0, 16)
        self.A_log._no_weight_decay = True
        dt = torch.exp(torch.rand(self.v_heads) * (math.log(0.1) - math.log(0.001)) + math.log(0.001)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus, as fla
        self.conv_weight = nn.Parameter(torch.empty(sum(self.split), cfg.d_conv))  # [q | k | v] channels
        nn.init.kaiming_uniform_(self.conv_weight, a=5**0.5)  # as nn.Conv1d (fan_in = d_conv)
        self.conv_bias = nn.Parameter(torch.zeros(sum(self.split))) if opts["conv_bias"] else None
        self.register_buffer("beta_scales", torch.tensor(opts["beta_scales"]), persistent=False)
        self.o_norm = nn.RMSNorm(self.d_v, eps=float(opts["norm_eps"]))
        if opts["gate"]:
            self.g_proj = nn.Linear(cfg.d_model, value_dim, bias=False)
            self.hook_gate = HookPoint()
        self.o_proj = nn.Linear(value_dim, cfg.d_model, bias=False)
        for name in ("hook_conv", "hook_q", "hook_k", "hook_v", "hook_beta", "hook_dt", "hook_z", "hook_result"):
            setattr(self, name, HookPoint())

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d = _options(cfg), cfg.d_model
        v_heads, d_v = opts["num_v_heads"], opts["d_v"]
        key_dim, value_dim = opts["num_heads"] * opts["head_dim"], v_heads * d_v
        channels = 2 * key_dim + value_dim
        return (linear_size(d, channels, False) + 2 * linear_size(d, v_heads, False) + 2 * v_heads
                + channels * (cfg.d_conv + opts["conv_bias"]) + d_v + linear_size(d, value_dim, False) * opts["gate"]
                + linear_size(value_dim, d, False)), FLOAT32_BYTES * v_heads  # beta_scales

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        batch, length, _ = x.shape
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        conv = self.hook_conv(F.silu(self.convolve(qkv, self.conv_weight, self.conv_bias)))  # [B, T, 2HK + HV V]
        q, k, v = conv.split(self.split, dim=-1)
        group = self.v_heads // self.heads

        def heads(x):  # [B, T, H K] -> [B, T, HV, K], unit norm as fla's l2norm
            x = x.reshape(batch, length, self.heads, self.d_k)
            return (x * torch.rsqrt(x.square().sum(-1, keepdim=True) + 1e-6)).repeat_interleave(group, dim=2)

        dt = self.hook_dt(F.softplus(self.a_proj(x) + self.dt_bias))  # [B, T, HV]
        inputs = {
            "q": self.hook_q(heads(q) * self.d_k**-0.5),
            "k": self.hook_k(heads(k)),
            "v": self.hook_v(v.reshape(batch, length, self.v_heads, self.d_v)),
            "beta": self.hook_beta(self.beta_scales * torch.sigmoid(self.b_proj(x))),  # [B, T, HV]
            "g": -torch.exp(self.A_log) * dt,  # log alpha [B, T, HV]
        }
        if self.options["gate"]:
            gate = self.g_proj(x).reshape(batch, length, self.v_heads, self.d_v)
            gate = torch.sigmoid(gate) if self.options["gate_activation"] == "sigmoid" else F.silu(gate)
            inputs["gate"] = self.hook_gate(gate)
        return inputs

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        k, v, beta = inputs_t["k"], inputs_t["v"], inputs_t["beta"]  # [B, HV, K], [B, HV, V], [B, HV]
        h = torch.exp(inputs_t["g"])[..., None, None] * h
        recalled = torch.einsum("bhvk,bhk->bhv", h, k)
        return h + (beta[..., None] * (v - recalled))[..., None] * k[:, :, None, :]  # [B, HV, V, K]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Dense [B, n, n], n = HV V K: vec(S_t) = M_t vec(S_{t-1}) + ..., row-major (h, v, k)."""
        k, beta = inputs_t["k"], inputs_t["beta"]  # [B, HV, K], [B, HV]
        batch, heads, d = k.shape
        alpha = torch.exp(inputs_t["g"])[..., None, None]  # [B, HV, 1, 1]
        A = alpha * (torch.eye(d, dtype=k.dtype, device=k.device) - beta[..., None, None] * k[..., :, None] * k[..., None, :])
        eye_h = torch.eye(heads, dtype=k.dtype, device=k.device)
        eye_v = torch.eye(self.d_v, dtype=k.dtype, device=k.device)
        M = torch.einsum("hg,vw,bhij->bhvjgwi", eye_h, eye_v, A)  # S_t[h, v, j] = sum_i S_{t-1}[h, v, i] A[h, i, j]
        n = heads * self.d_v * d
        return M.reshape(batch, n, n)

    def kernel(self, inputs, initial=None, **kwargs):
        return delta_rule(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], g=inputs["g"],
                          initial_state=initial, chunk_size=self.options["chunk_size"],
                          impl=self.options["impl"], **kwargs)

    def output_projection(self) -> nn.Linear:
        return self.o_proj
