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

Hooks: hook_gate [B, T, D] (g), hook_conv [B, T, D] (the short-conv output c).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.hooks import HookPoint
from models.kernels import short_conv
from models.kernels.fft_conv import fft_causal_conv
from models.mixers.base import Mixer, mixer_options, register_mixer


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

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        length = x.shape[1]
        if length > self.cfg.max_len:
            raise ValueError(f"baseconv filters cover max_len={self.cfg.max_len} positions; got T={length}")
        gate = self.hook_gate(self.gate_proj(x))  # [B, T, D]
        c = self.hook_conv(short_conv(self.in_proj(x), self.conv_weight, self.conv_bias))
        return self.out_proj(gate * fft_causal_conv(c, self.long_filter[:, :length]))
