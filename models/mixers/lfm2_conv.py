"""LFM2's gated short convolution (Liquid AI, transformers' Lfm2ShortConv), a recurrent mixer
whose state is the convolution's window (models/mixers/conv_window.py).

C = d_model channels, W = d_conv taps. From the mixer input x_t [D]:

    b_t, c_t, u_t = split(W_in x_t + b_in)           [C] each: input gate, output gate, values
    v_t = b_t * u_t                                   [C]     the conv input
    h_t = (v_{t-W+1}, ..., v_{t-1}, v_t)              [C, W]  the window, oldest first (v_s = 0, s < 0)
        = shift(h_{t-1}) with v_t appended            (h_{-1} = 0)
    y_t = sum_k w[:, k] h_t[:, k] (+ b_conv)          [C]     causal depthwise conv (w[:, -1] meets v_t)
    o_t = W_out (c_t * y_t) + b_out                   [D]

There is no other state: the window is all a step carries (it is transformers' conv cache, W
entries, in the same layout), so hook_state is the window. A patch on hook_state at step t
replaces the conv inputs the outputs at t, ..., t + W - 1 read (the window forgets after W - 1
steps); nothing before t changes. It replaces conv inputs only: the gates at t come from x_t.

Hooks (besides hook_in / hook_out):
  hook_bx     [B, T, C]     v_t = b_t * u_t, the conv input
  hook_gate   [B, T, C]     c_t, the output gate
  hook_state  [B, T, C, W]  h_t, the window after step t
  hook_conv   [B, T, C]     y_t, the short-conv output before the output gate

Paths (conv_window): fast = models.kernels.short_conv; instrumented = every window, y read out
from them. Decoding (models.decoding) carries h as the recurrent state: one step per token.

mixer_options: bias (bool, default False): biases in W_in, the conv and W_out (transformers'
conv_bias, which sets all three).
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks import HookPoint
from models.mixers.base import linear_size, mixer_options, register_mixer
from models.mixers.conv_window import ConvWindowMixer

OPTIONS = {"bias": False}


def _options(cfg) -> dict:
    options = mixer_options(cfg, OPTIONS)
    if not isinstance(options["bias"], bool):
        raise TypeError(f"lfm2_conv mixer_options['bias'] must be a bool; got {options['bias']!r}")
    return options


@register_mixer("lfm2_conv", n_layers=2, d_model=64, d_conv=3, norm="rmsnorm", mlp=True, mlp_activation="swiglu")
class Lfm2Conv(ConvWindowMixer):

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.options = _options(cfg)
        bias = self.options["bias"]
        channels, self.width = cfg.d_model, cfg.d_conv
        self.state_shape = (channels, self.width)
        self.in_proj = nn.Linear(cfg.d_model, 3 * channels, bias=bias)
        self.conv_weight = nn.Parameter(torch.empty(channels, self.width))
        nn.init.kaiming_uniform_(self.conv_weight, a=5**0.5)  # as nn.Conv1d (fan_in = W)
        self.conv_bias = nn.Parameter(torch.zeros(channels)) if bias else None
        self.out_proj = nn.Linear(channels, cfg.d_model, bias=bias)
        self.hook_bx, self.hook_gate, self.hook_conv = HookPoint(), HookPoint(), HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        bias, d = _options(cfg)["bias"], cfg.d_model
        return linear_size(d, 3 * d, bias) + d * (cfg.d_conv + bias) + linear_size(d, d, bias), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # x [B, T, D]
        b, c, u = self.in_proj(x).chunk(3, dim=-1)  # [B, T, C] each
        return {"v": self.hook_bx(b * u), "gate": self.hook_gate(c)}

    def conv_params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.conv_weight, self.conv_bias

    def output(self, y: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # y [B, T, C] -> [B, T, D]
        return self.out_proj(inputs["gate"] * self.hook_conv(y))
