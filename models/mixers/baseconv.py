"""BaseConv (Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
Models"): a gated convolution.

    g_t = W_1 x_t                                           gate (linear projection)       [D]
    c   = shortconv(W_2 x)                                  depthwise causal, width d_conv [B, T, D]
    l   = k * c                                             causal long convolution, by FFT
    y_t = W_o (g_t * l_t)

The long filter k [D, L] (L = cfg.max_len) is explicit: one learned weight per channel and lag,
initialised as k[:, 0] = 1 plus N(0, 1/L) noise, so at init the layer is a gated short convolution
with a small long-range part. A sequence of length T uses k[:, :T].
Zoology composes a layer from either a short or a long convolution; here every layer has both,
the short one first, so a two-layer model can mix locally and globally in each layer.

BaseConv has no finite recurrent state (an explicit filter over the whole prefix), so there is
no hook_state. Fast and instrumented paths are the same computation.

Decoding (models.decoding, mix_from_history) carries the short conv's last d_conv - 1 inputs and
every earlier c_s (the history [B, t, D]): a new token costs one row of each projection and
l_t = sum_s k[:, t - s] c_s, O(t D), never the prefix again.

Hooks: hook_gate [B, T, D] (g), hook_conv [B, T, D] (the short-conv output c).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.hooks import HookPoint
from models.kernels.fft_conv import fft_causal_conv
from models.mixers.base import Mixer, linear_size, mixer_options, register_mixer


@register_mixer("baseconv", n_layers=2, mlp=True, d_conv=3, norm="layernorm")
class BaseConv(Mixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        d = cfg.d_model
        self.gate_proj = nn.Linear(d, d)
        self.in_proj = nn.Linear(d, d)
        self.conv_weight = nn.Parameter(torch.randn(d, cfg.d_conv) / math.sqrt(cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(d))
        long_filter = torch.randn(d, cfg.max_len) / math.sqrt(cfg.max_len)
        long_filter[:, 0] += 1.0
        self.long_filter = nn.Parameter(long_filter)
        self.out_proj = nn.Linear(d, d)
        self.hook_gate, self.hook_conv = HookPoint(), HookPoint()
        self.history_width = d  # models.decoding: the width of the long convolution's inputs

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        d = cfg.d_model
        return 3 * linear_size(d, d) + d * (cfg.d_conv + 1) + d * cfg.max_len, 0

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.mix_from_history(x, None, 0)

    def mix_from_history(self, x: torch.Tensor, history: torch.Tensor | None, start: int) -> torch.Tensor:
        """x [B, n, D] (after hook_in) at positions start, ..., start + n - 1 -> [B, n, D]; history
        [B, >= start + n, D]: the long conv's inputs c, valid before start, this call's written
        at [start, start + n) (None: a whole sequence, start 0). The short conv continues from
        conv_carry while decoding (Mixer.convolve)."""
        length = check_length(self, start + x.shape[1])
        gate = self.hook_gate(self.gate_proj(x))  # [B, n, D]
        c = self.hook_conv(self.convolve(self.in_proj(x), self.conv_weight, self.conv_bias))
        if history is not None:
            history[:, start:length] = c
            c = history[:, :length]
        return self.out_proj(gate * causal_conv_last(c, self.long_filter, x.shape[1]))


def check_length(mixer, length: int) -> int:
    if length > mixer.cfg.max_len:
        raise ValueError(f"{mixer.mixer_name} filters cover max_len={mixer.cfg.max_len} positions; got T={length}")
    return length


def causal_conv_last(u: torch.Tensor, k: torch.Tensor, n: int) -> torch.Tensor:
    """The causal convolution of u [B, t, C] with k [C, L >= t] at the last n positions -> [B, n, C]:
    by FFT over all of u (n > 1), or one position's sum_s k[:, t - 1 - s] u_s (n = 1: O(t C))."""
    length = u.shape[1]
    if n > 1 or length == 1:
        return fft_causal_conv(u, k)[:, length - n:]
    return torch.einsum("btc,tc->bc", u, k[:, :length].flip(1).T)[:, None]
