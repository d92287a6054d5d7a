"""Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff"): Taylor linear attention + sliding-window softmax attention + a short convolution.

Per layer, with H heads, feature dim f (mixer_options["feature_dim"]), d_head = cfg.head_dim:

    u_t = shortconv(x)_t                                 depthwise causal, width d_conv   [D]
    q_t = W_q u_t,  k_t = W_k u_t   [H, f];   v_t = W_v u_t   [H, d_head]
    phi(z) = [1, z', vec(z' z'^T) / sqrt(2)],  z' = z / f^(1/4)      (1 + f + f^2 features)
          so phi(q) . phi(k) = 1 + s + s^2 / 2 with s = q . k / sqrt(f) (2nd-order Taylor of e^s)
    S_t = S_{t-1} + phi(k_t) [v_t; 1]^T        S_0 = 0,  state [H, 1 + f + f^2, d_head + 1]
    lin_t = (phi(q_t)^T S_t)[:d_head] / (phi(q_t)^T S_t)[d_head]       (normalised linear attention)
    swa_t = sliding-window causal softmax attention of x over the last `window` positions
            (own W_q', W_k', W_v', H heads of d_head; positions t - window < s <= t)
    y_t = W_o lin_t + W_o' swa_t

The paper's language models stack three kinds of layers (Taylor linear attention, sliding-window
attention with a small window, and short gated convolutions) and assign them to different depths.
For the two-layer retrieval models studied here every layer holds all three primitives, summed as
above, so each layer has both the global recurrent memory and the exact local lookback.
window = 0 drops the sliding-window part (the Zoology-style linear-attention-plus-conv layer).

The last column of S holds the normaliser sum_t phi(k_t), so the whole linear-attention state is
one tensor. The update is affine with identity transition (is_affine, transition = 1).
phi(q).phi(k) >= 1/2, so the normaliser of an unpatched run is >= (t + 1) / 2 and needs no epsilon.

Hooks: hook_conv [B, T, D] (short-conv output), hook_q, hook_k [B, T, H, f] (before phi),
hook_v [B, T, H, d_head], hook_state [B, T, H, 1 + f + f^2, d_head + 1] (causal patches),
hook_pattern [B, H, T, T] (sliding-window softmax probabilities; only when window > 0).

Fast path: the parallel form lin = (M o K)[V, 1] with K[s, t] = 1 + s_st + s_st^2 / 2 and M the
causal mask (the state is never built), plus scaled_dot_product_attention with a band mask.
Instrumented path: the state recurrence above (per-step states, patchable) and the explicit window
pattern.

mixer_options: feature_dim (int >= 1, default 16), window (int >= 0, default 64, the paper's size).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.hooks import HookPoint
from models.kernels import short_conv
from models.mixers.base import RecurrentMixer, mixer_options, register_mixer

OPTIONS = {"feature_dim": 16, "window": 64}


def taylor_features(z: torch.Tensor) -> torch.Tensor:
    """phi(z) = [1, z', vec(z' z'^T)/sqrt(2)], z' = z / f^(1/4): [..., f] -> [..., 1 + f + f^2]."""
    f = z.shape[-1]
    z = z / f**0.25
    second = (z[..., :, None] * z[..., None, :]).flatten(-2) / math.sqrt(2)
    return torch.cat([torch.ones_like(z[..., :1]), z, second], dim=-1)


def window_mask(length: int, window: int, device) -> torch.Tensor:
    """[T, T] bool, True where query s may attend key t: s - window < t <= s."""
    offset = torch.arange(length, device=device)[:, None] - torch.arange(length, device=device)
    return (offset >= 0) & (offset < window)


@register_mixer("based", n_layers=2, mlp=True, d_conv=3, norm="layernorm")
class Based(RecurrentMixer):
    is_affine = True
    resume_context = None  # the sliding window reads earlier positions in readout(): recompute

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        options = mixer_options(cfg, OPTIONS)
        self.feature_dim, self.window = options["feature_dim"], options["window"]
        if not isinstance(self.feature_dim, int) or isinstance(self.feature_dim, bool) or self.feature_dim < 1:
            raise ValueError(f"mixer_options['feature_dim'] must be a positive int; got {self.feature_dim!r}")
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 0:
            raise ValueError(f"mixer_options['window'] must be an int >= 0 (0 = no SWA); got {self.window!r}")
        d, h, f = cfg.d_model, cfg.n_heads, self.feature_dim
        self.n_heads, self.d_head = h, cfg.head_dim
        self.state_shape = (h, 1 + f + f * f, self.d_head + 1)
        self.conv_weight = nn.Parameter(torch.randn(d, cfg.d_conv) / math.sqrt(cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(d))
        self.proj_qk = nn.Linear(d, 2 * h * f, bias=False)
        self.proj_v = nn.Linear(d, h * self.d_head, bias=False)
        self.out_proj = nn.Linear(h * self.d_head, d)
        self.hook_conv = HookPoint()
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if self.window:
            self.swa_qkv = nn.Linear(d, 3 * h * self.d_head)
            self.swa_out = nn.Linear(h * self.d_head, d)
            self.hook_pattern = HookPoint()

    # --- linear attention as a recurrence ---------------------------------------------------
    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, length, _ = x.shape
        u = self.hook_conv(short_conv(x, self.conv_weight, self.conv_bias))  # [B, T, D]
        qk = self.proj_qk(u).view(batch, length, 2, self.n_heads, self.feature_dim)
        q, k = self.hook_q(qk[:, :, 0]), self.hook_k(qk[:, :, 1])  # [B, T, H, f]
        v = self.hook_v(self.proj_v(u).view(batch, length, self.n_heads, self.d_head))
        return {"q": q, "k": k, "v": v}

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        phi_k = taylor_features(inputs_t["k"])  # [B, H, F]
        v1 = torch.cat([inputs_t["v"], torch.ones_like(inputs_t["v"][..., :1])], dim=-1)  # [B, H, dh+1]
        return h + phi_k[..., :, None] * v1[..., None, :]  # [B, H, F, dh+1]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs_t["k"].new_ones(inputs_t["k"].shape[0], *self.state_shape)

    def read_states(self, states: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """states [B, T, H, F, dh+1], q [B, T, H, f] -> normalised linear attention [B, T, H, dh]."""
        out = torch.einsum("bthf,bthfe->bthe", taylor_features(q), states)
        return out[..., :-1] / out[..., -1:]

    def parallel(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same linear attention in its masked quadratic form -> [B, T, H, dh]."""
        q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))  # [B, H, T, .]
        s = q @ k.transpose(-1, -2) / math.sqrt(self.feature_dim)  # [B, H, T, T]
        kernel = (1 + s + s.square() / 2).tril()
        out = (kernel @ v) / kernel.sum(-1, keepdim=True)  # [B, H, T, dh]
        return out.transpose(1, 2)

    # --- sliding-window attention and output ----------------------------------------------
    def sliding_window(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, H*dh]
        batch, length, _ = x.shape
        qkv = self.swa_qkv(x).view(batch, length, 3, self.n_heads, self.d_head).transpose(1, 3)
        q, k, v = qkv.unbind(dim=2)  # [B, H, T, dh]
        allowed = window_mask(length, self.window, x.device)
        if self.use_instrumented(self.hook_pattern):
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
            pattern = self.hook_pattern(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
            z = pattern @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return z.transpose(1, 2).reshape(batch, length, -1)

    def combine(self, x: torch.Tensor, lin: torch.Tensor) -> torch.Tensor:
        y = self.out_proj(lin.flatten(2))  # [B, T, D]
        if self.window:
            y = y + self.swa_out(self.sliding_window(x))
        return y

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.combine(x, self.read_states(states, inputs["q"]))

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        inputs = self.prepare(x)
        if self.use_instrumented(self.hook_state):
            return self.instrumented_forward(x, inputs)
        return self.combine(x, self.parallel(inputs))
