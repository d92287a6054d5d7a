"""RWKV-7 "Goose" (Peng et al. 2025), laid out like fla's RWKV7Attention (the time mix, "rwkv7")
and RWKV7FeedForward (the channel mix, "rwkv7_ffn"), so models.interop.rwkv7 maps fla's
RWKV7ForCausalLM by name.

Time mix ("rwkv7"): H = n_heads heads of key width K = d_head (H K = d_model), value width
V = value_dim / H. From the mixer input x_t [D] (after the block's LayerNorm):

    x'_t  = x_{t-1}  (0 at t = 0)                      the token shift (decoding carries x_{t-1})
    x^c_t = x_t + (x'_t - x_t) * mu_c                  c in r, w, k, v, a, g: six learned mixes [D]
    r_t = W_r x^r_t,  k~_t = W_k x^k_t,  v~_t = W_v x^v_t             [H, K], [H, K], [H, V]
    w_t     = -e^{-1/2} sigmoid(B_w tanh(A_w x^w_t) + c_w)            the log decay [H, K]
    alpha_t = sigmoid(B_a A_a x^a_t + c_a)                            in-context learning rate [H, K]
    g_t     = B_g sigmoid(A_g x^g_t)                                  the output gate [H, V]
    v_t = v~_t                                         at layer 0, whose v is v_first
    v_t = v~_t + (v_first_t - v~_t) sigmoid(B_v A_v x^v_t + c_v)     at later layers (value residual)
    kappa_t = normalize(k~_t * k_k) per head           the removal key [H, K]
    k_t = k~_t * (1 + (alpha_t - 1) * k_a)             the replacement key [H, K]
    S_t = S_{t-1} (diag(exp(w_t)) - kappa_t (alpha_t * kappa_t)^T) + v_t k_t^T    [H, V, K] values x keys
    o_t = S_t r_t                                      [H, V]
    z_t = (GroupNorm_h(o_t) + (sum_i r_t,i k_t,i rk_h,i) v_t) * g_t      per head, the bonus term;
                                                       GroupNorm eps = K * norm_eps (fla's)
    y_t = W_o concat_h z_t

(models/kernels/rwkv7.py runs S_t with a = -kappa, b = kappa * alpha.) The A / B / c triples are
low-rank maps (w_lora, a_lora, v_lora, g_lora; fla's LoRA: lora.0 = A, lora.2 = B with bias c).
Affine in the state: vec(S_t) = M_t vec(S_{t-1}) + ..., M_t acting on each value row as
diag(exp(w_t)) - kappa_t (alpha_t * kappa_t)^T (`transition` returns it dense, n = H V K).

v_first: an rwkv7 mixer at layer l > 0 reads the values v of the rwkv7 mixer at layer 0 for the
same positions in the same call (SequenceModel links them, `link_layers`). Layer 0 keeps them
(detached once the last reader has read them), so a mixer called on its own after a forward
(interp.analysis.dynamics re-running prepare on a cached hook_in) reads that forward's v_first;
a call over other positions raises. A patch on layer 0's hook_v changes every later layer's
v_first, as in fla. SequenceModel.resume_from resumes an RWKV-7 stack from block 0.

Hooks (besides hook_in / hook_out / hook_state):
  hook_q      [B, T, H, K]  r_t, the receptance (the query of o_t = S_t r_t)
  hook_k      [B, T, H, K]  k_t, the replacement key;  hook_kk [B, T, H, K] kappa_t, the removal key
  hook_v      [B, T, H, V]  v_t, after the value residual
  hook_w      [B, T, H, K]  w_t, the log decay (the decay is exp(w_t))
  hook_a      [B, T, H, K]  alpha_t
  hook_gate   [B, T, H, V]  g_t
  hook_state  [B, T, H, V, K]  S_t after step t (fla's kernels store the transpose [K, V])
  hook_z      [B, T, H, V]  z_t per head, what W_o reads
  hook_result [B, T, H, d_model]  each head's share of the output (sum over heads = hook_out)

Paths (models.mixers.delta.DeltaRuleMixer): fast = the rwkv7 kernel returning outputs only;
instrumented = the same kernel with every state exported, hook_state pins honoured (a patch at t
re-runs the recurrence from the pinned state, so every later step changes and nothing before t).

mixer_options: value_dim (None: d_model), decay_low_rank, a_low_rank, v_low_rank, gate_low_rank
(ints, default 32), norm_eps (1e-5; the GroupNorm's eps is d_head * norm_eps), l2_eps (None:
kappa = x / max(|x|, 1e-12) as F.normalize; a float: x / sqrt(|x|^2 + l2_eps), fla's l2_norm), impl
(models.kernels.rwkv7's: "auto", "naive" or "native"; "auto" runs the native C loops, forward and
backward, on the CPU).

Channel mix ("rwkv7_ffn", models/mixers/conv_window.py with W = 2 taps):

    x^k_t = x_t + (x_{t-1} - x_t) * mu_k = [mu_k, 1 - mu_k] . (x_{t-1}, x_t)   a width-2 conv
    y_t   = W_value relu(W_key x^k_t)^2

Hooks: hook_state [B, T, D, 2] the window (x_{t-1}, x_t), hook_conv [B, T, D] x^k_t, hook_pre
[B, T, F] W_key x^k_t, hook_post [B, T, F] relu(.)^2 (the neurons W_value reads). Its width F is
cfg.mlp_width. It has no model preset of its own (the hybrid preset "rwkv7_stack" alternates time
and channel mixes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.hooks import HookPoint
from models.kernels.rwkv7 import IMPLS, rwkv7_scan
from models.mixers.base import (FLOAT32_BYTES, PRESETS, Mixer, head_outputs, linear_size, mixer_options,
                                 register_mixer)
from models.mixers.conv_window import ConvWindowMixer
from models.mixers.delta import DeltaRuleMixer

OPTIONS = {"value_dim": None, "decay_low_rank": 32, "a_low_rank": 32, "v_low_rank": 32, "gate_low_rank": 32,
           "norm_eps": 1e-5, "l2_eps": None, "impl": "auto"}
DECAY_SCALE = math.exp(-0.5)  # w = -e^{-1/2} sigmoid(.): the decay exp(w) lies in [exp(-e^{-1/2}), 1)
MIXES = ("r", "w", "k", "v", "a", "g")


class LoRA(nn.Module):
    """B act(A x) [+ c]: lora.0 = A [rank, D], lora.2 = B [out, rank] with bias c (fla's LoRA)."""

    def __init__(self, d_in: int, d_out: int, rank: int, activation: nn.Module, bias: bool = True) -> None:
        super().__init__()
        self.lora = nn.Sequential(nn.Linear(d_in, rank, bias=False), activation, nn.Linear(rank, d_out, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora(x)


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    value_dim = cfg.d_model if opts["value_dim"] is None else opts["value_dim"]
    if cfg.n_heads * cfg.head_dim != cfg.d_model:
        raise ValueError(f"rwkv7 needs n_heads * d_head == d_model (keys span the model width); got "
                         f"{cfg.n_heads} * {cfg.head_dim} != {cfg.d_model}")
    if not isinstance(value_dim, int) or isinstance(value_dim, bool) or value_dim < 1 or value_dim % cfg.n_heads:
        raise ValueError(f"rwkv7 mixer_options['value_dim'] must be None or a positive multiple of n_heads="
                         f"{cfg.n_heads}; got {opts['value_dim']!r}")
    for name in ("decay_low_rank", "a_low_rank", "v_low_rank", "gate_low_rank"):
        if not isinstance(opts[name], int) or isinstance(opts[name], bool) or opts[name] < 1:
            raise ValueError(f"rwkv7 mixer_options[{name!r}] must be a positive int; got {opts[name]!r}")
    for name, allow_none in (("norm_eps", False), ("l2_eps", True)):
        value = opts[name]
        if not (value is None and allow_none) and (
                not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0):
            raise ValueError(f"rwkv7 mixer_options[{name!r}] must be a positive float"
                             f"{' or None' if allow_none else ''}; got {value!r}")
    if opts["impl"] not in IMPLS:
        raise ValueError(f"rwkv7 mixer_options['impl'] must be one of {IMPLS}; got {opts['impl']!r}")
    return {**opts, "value_dim": value_dim}


_PRESET = dict(n_layers=2, d_model=64, n_heads=4, norm="layernorm", mlp=True)


@register_mixer("rwkv7", **_PRESET)
class RWKV7(DeltaRuleMixer):
    resume_context = 1  # the token shift reads the previous input ...
    carries_conv = True  # ... through convolve: a decoder carries it (models.decoding)

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        opts = self.options = _options(cfg)
        d, self.heads, self.d_k = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.d_v = opts["value_dim"] // self.heads
        self.state_shape = (self.heads, self.d_v, self.d_k)
        for c in MIXES:
            setattr(self, f"x_{c}", nn.Parameter(torch.zeros(d)))
        self.k_k, self.k_a = nn.Parameter(torch.full((d,), 0.85)), nn.Parameter(torch.ones(d))
        self.r_k = nn.Parameter(torch.zeros(self.heads, self.d_k))
        self.r_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, opts["value_dim"], bias=False)
        self.o_proj = nn.Linear(opts["value_dim"], d, bias=False)
        self.w_lora = LoRA(d, d, opts["decay_low_rank"], nn.Tanh())
        if layer_idx != 0:
            self.v_lora = LoRA(d, opts["value_dim"], opts["v_low_rank"], nn.Identity())
        self.a_lora = LoRA(d, d, opts["a_low_rank"], nn.Identity())
        self.g_lora = LoRA(d, opts["value_dim"], opts["gate_low_rank"], nn.Sigmoid(), bias=False)
        self.g_norm = nn.GroupNorm(self.heads, opts["value_dim"], eps=self.d_k * float(opts["norm_eps"]))
        self.register_buffer("shift_taps", torch.tensor([1.0, 0.0]).expand(d, 2).clone(), persistent=False)
        for name in ("hook_q", "hook_k", "hook_kk", "hook_v", "hook_w", "hook_a", "hook_gate", "hook_z",
                     "hook_result"):
            setattr(self, name, HookPoint())
        self.v_first: torch.Tensor | None = None  # layer 0: its values, until the last reader took them

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d = _options(cfg), cfg.d_model
        value_dim = opts["value_dim"]
        lora = lambda d_out, rank, bias=True: linear_size(d, rank, False) + linear_size(rank, d_out, bias)  # noqa: E731
        return ((len(MIXES) + 2) * d + cfg.n_heads * cfg.head_dim + 2 * d * d + 2 * d * value_dim
                + lora(d, opts["decay_low_rank"]) + (lora(value_dim, opts["v_low_rank"]) if layer_idx != 0 else 0)
                + lora(d, opts["a_low_rank"]) + lora(value_dim, opts["gate_low_rank"], False) + 2 * value_dim,
                FLOAT32_BYTES * 2 * d)  # shift_taps

    # -------------------------------------------------------------- v_first across layers

    def link_layers(self, mixers: list[Mixer]) -> None:
        """Called by SequenceModel with every layer's mixer: a reader (layer > 0) keeps layer 0's
        mixer (not as a submodule) and whether it is the last reader."""
        readers = [m.layer_idx for m in mixers if isinstance(m, RWKV7) and m.layer_idx > 0]
        if self.layer_idx > 0 and not isinstance(mixers[0], RWKV7):
            raise ValueError(f"an rwkv7 mixer at layer {self.layer_idx} reads layer 0's values (v_first); layer 0 "
                             f"is a {type(mixers[0]).__name__}, not rwkv7")
        self.__dict__["first"] = mixers[0]
        if self.layer_idx > 0:
            self.__dict__["reads_layer"] = 0  # SequenceModel.resume_start: a resumed run recomputes from block 0
        self.__dict__["last_reader"] = self.layer_idx == max(readers, default=-1)

    def value_first(self, v: torch.Tensor) -> torch.Tensor:
        """Layer 0's values [B, n, H V] at the positions of this call's v [B, n, H V]."""
        first = self.__dict__.get("first")
        v_first = None if first is None else first.v_first
        if v_first is None or v_first.shape != v.shape:
            raise ValueError(
                f"rwkv7 layer {self.layer_idx} reads layer 0's values v_first of the same positions "
                f"({tuple(v.shape)}); {'none are' if v_first is None else f'{tuple(v_first.shape)} are'} kept. "
                f"Run the model from its first block (SequenceModel.resume_from(layer=0), not a later one).")
        if self.__dict__["last_reader"]:  # later calls on their own (dynamics) read them without autograd
            first.v_first = v_first.detach()
        return v_first

    # -------------------------------------------------------------- recurrence

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        batch, length, _ = x.shape
        delta = self.convolve(x, self.shift_taps) - x  # x_{t-1} - x_t
        mixed = {c: torch.addcmul(x, delta, getattr(self, f"x_{c}")) for c in MIXES}
        k = self.k_proj(mixed["k"])
        v = self.v_proj(mixed["v"])
        if self.layer_idx == 0:
            v = self.hook_v(v.view(batch, length, self.heads, self.d_v)).flatten(2)
            self.v_first = v
        else:
            v = torch.lerp(v, self.value_first(v), torch.sigmoid(self.v_lora(mixed["v"])))
            v = self.hook_v(v.view(batch, length, self.heads, self.d_v)).flatten(2)
        alpha = torch.sigmoid(self.a_lora(mixed["a"]))  # [B, T, D]
        heads = lambda t: t.view(batch, length, self.heads, -1)  # noqa: E731  [B, T, H, .]
        kk = self.hook_kk(self._l2(heads(k * self.k_k)))
        k = k.addcmul(k * (alpha - 1), self.k_a)
        return {
            "q": self.hook_q(heads(self.r_proj(mixed["r"]))),
            "w": self.hook_w(heads(-DECAY_SCALE * torch.sigmoid(self.w_lora(mixed["w"])))),
            "k": self.hook_k(heads(k)),
            "v": heads(v),
            "a": self.hook_a(heads(alpha)),
            "kk": kk,
            "gate": self.hook_gate(heads(self.g_lora(mixed["g"]))),
        }

    def _l2(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> unit rows
        eps = self.options["l2_eps"]
        return F.normalize(x, dim=-1) if eps is None else x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:  # h [B, H, V, K]
        kk, a = inputs_t["kk"], inputs_t["a"]
        removed = torch.einsum("bhvk,bhk->bhv", h, -kk)
        return (h * torch.exp(inputs_t["w"])[:, :, None, :] + removed[..., None] * (kk * a)[:, :, None, :]
                + inputs_t["v"][..., None] * inputs_t["k"][:, :, None, :])

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        """Dense [B, n, n], n = H V K: vec(S_t) = M_t vec(S_{t-1}) + ..., row-major (h, v, k)."""
        kk, a, w = inputs_t["kk"], inputs_t["a"], inputs_t["w"]  # [B, H, K]
        batch, heads, d = kk.shape
        A = torch.diag_embed(torch.exp(w)) - kk[..., :, None] * (kk * a)[..., None, :]  # [B, H, K, K]
        eye_h = torch.eye(heads, dtype=kk.dtype, device=kk.device)
        eye_v = torch.eye(self.d_v, dtype=kk.dtype, device=kk.device)
        M = torch.einsum("hg,vw,bhij->bhvjgwi", eye_h, eye_v, A)  # S_t[h, v, j] = sum_i S_{t-1}[h, v, i] A[h, i, j]
        n = heads * self.d_v * d
        return M.reshape(batch, n, n)

    def kernel(self, inputs, initial=None, **kwargs):
        return rwkv7_scan(inputs["q"], inputs["w"], inputs["k"], inputs["v"], -inputs["kk"],
                          inputs["kk"] * inputs["a"], initial_state=initial, impl=self.options["impl"], **kwargs)

    def head_states(self, inputs: dict[str, torch.Tensor], heads: list[int]) -> torch.Tensor:
        """The states of heads `heads` only [B, T, k, V, K] (each head's recurrence runs apart)."""
        index = torch.tensor(heads, device=inputs["q"].device)
        return self.kernel({name: value[:, :, index] for name, value in inputs.items()}, export_at="all").states_at

    def scan(self, inputs, pins=None, initial=None, shift=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(o [B, T, H, V], states [B, T, H, V, K]) from the kernel, every state exported, pins
        and a shift honoured."""
        result = self.kernel(inputs, initial, export_at="all", pins=pins, shift=shift)
        return result.output, result.states_at

    def output(self, o: torch.Tensor, inputs) -> torch.Tensor:  # o [B, T, H, V] -> [B, T, D]
        batch, length = o.shape[:2]
        normed = self.g_norm(o.reshape(batch * length, -1)).view(o.shape)
        bonus = (inputs["q"] * inputs["k"] * self.r_k).sum(-1, keepdim=True) * inputs["v"]  # [B, T, H, V]
        return head_outputs((normed + bonus.to(o.dtype)) * inputs["gate"], self.o_proj, self.hook_z, self.hook_result)

    def output_projection(self) -> nn.Linear:
        return self.o_proj


@register_mixer("rwkv7_ffn", **_PRESET)
class RWKV7FeedForward(ConvWindowMixer):
    width = 2
    whole_sequence_hooks = ConvWindowMixer.whole_sequence_hooks + ("hook_pre", "hook_post")

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.state_shape = (cfg.d_model, 2)
        self.x_k = nn.Parameter(torch.zeros(cfg.d_model))
        self.key = nn.Linear(cfg.d_model, cfg.mlp_width, bias=False)
        self.value = nn.Linear(cfg.mlp_width, cfg.d_model, bias=False)
        self.hook_conv, self.hook_pre, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        return cfg.d_model + 2 * cfg.d_model * cfg.mlp_width, 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        return {"v": x}

    def conv_params(self) -> tuple[torch.Tensor, None]:
        return torch.stack([self.x_k, 1 - self.x_k], dim=-1), None  # [D, 2]: mu_k x_{t-1} + (1 - mu_k) x_t

    def output(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # y [B, T, D]
        return self.value(self.hook_post(torch.relu(self.hook_pre(self.key(self.hook_conv(y)))).square()))


# A stack of channel mixes alone is no model (it reads one token back per layer): no preset of its
# own; models.registry's hybrid "rwkv7_stack" alternates it with the time mix, as RWKV-7 does.
del PRESETS["rwkv7_ffn"]
