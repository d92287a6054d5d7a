"""Hyena (Poli et al. 2023, "Hyena Hierarchy: Towards Larger Convolutional Language Models"),
the order-2 operator.

    z = shortconv(W_in x)                depthwise causal, width d_conv           [B, T, 3D]
    (x0, x1, v) = split(z)                                                        each [B, T, D]
    v  <- x1 * v                                                                  (inner gate)
    v  <- h * v + bias * v               causal long convolution, by FFT
    y  = W_out (x0 * v)                                                           (outer gate)

The long filter h [D, L] (L = cfg.max_len) is implicit:
    t_l = l / (L - 1),  pos_l = [t_l, cos(2 pi f_j l / L), -sin(2 pi f_j l / L)]_{j < bands}
    h[:, l] = MLP(pos_l) * exp(-|delta_c| t_l)
with MLP = Linear(emb_dim, order) -> Sin -> Linear(order, order) -> Sin -> Linear(order, D), where
Sin(z) = sin(w * z) has a learned frequency per unit (init w = 1), and the decay rates delta_c
spread over channels from log(1e-2)/1.5 to log(1e-2)/0.3 (filters fall to 1e-2 between 30% and
150% of L), as in the reference implementation. A sequence of length T uses h[:, :T].

Hyena has no finite recurrent state: the long convolution looks back over the whole prefix with a
filter that is not a finite sum of exponentials, so there is no hook_state (the "state" would be
the whole input history). Fast and instrumented paths are the same computation.

Decoding (models.decoding, mix_from_history) carries the short conv's last d_conv - 1 inputs and
every earlier long-conv input x1_s * v_s (the history [B, t, D]): a new token costs one row of
each projection and sum_s h[:, t - s] (x1 v)_s, O(t D), never the prefix again. The filter's
taps for max_len positions are computed once (no gradient wanted) and kept until a parameter of
the filter changes.

Hooks: hook_conv [B, T, 3D] (short-conv output), hook_gate [B, T, 2, D] (the outer gate x0 and
the inner gate x1, in that order).

mixer_options: filter_order (MLP width, default 64), emb_dim (odd >= 3, default 5).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.hooks import HookPoint
from models.mixers.base import FLOAT32_BYTES, Mixer, linear_size, mixer_options, register_mixer
from models.mixers.baseconv import causal_conv_last, check_length

OPTIONS = {"filter_order": 64, "emb_dim": 5}


def positional_features(length: int, emb_dim: int) -> torch.Tensor:
    """[L, emb_dim]: normalised time t in [0, 1] and (emb_dim - 1) / 2 complex-exponential bands."""
    bands = (emb_dim - 1) // 2
    t = torch.linspace(0, 1, length)[:, None]  # [L, 1]
    angle = 2 * math.pi * torch.arange(length)[:, None] / length  # [L, 1]
    freqs = torch.linspace(1e-4, bands - 1, bands)[None, :]  # [1, bands]
    return torch.cat([t, torch.cos(freqs * angle), -torch.sin(freqs * angle)], dim=-1)


class Sin(nn.Module):
    """sin(w * z) with a learned frequency per unit."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.freq = nn.Parameter(torch.ones(width))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * z)


class ImplicitFilter(nn.Module):
    """h [D, L] = MLP(positional features) * exponential decay window."""

    def __init__(self, d_model: int, max_len: int, order: int, emb_dim: int) -> None:
        super().__init__()
        self.register_buffer("pos", positional_features(max_len, emb_dim), persistent=False)
        self.mlp = nn.Sequential(
            nn.Linear(emb_dim, order), Sin(order),
            nn.Linear(order, order), Sin(order),
            nn.Linear(order, d_model, bias=False),
        )
        target = math.log(1e-2)
        self.register_buffer("decay_rates", torch.linspace(target / 1.5, target / 0.3, d_model).abs(), persistent=False)

    def forward(self, length: int) -> torch.Tensor:  # -> [D, length], the first `length` taps
        pos = self.pos[:length]  # [T, emb_dim]
        return (self.mlp(pos) * torch.exp(-pos[:, :1] * self.decay_rates)).T


def _options(cfg) -> tuple[int, int]:
    """(filter_order, emb_dim) of cfg.mixer_options, checked."""
    options = mixer_options(cfg, OPTIONS)
    order, emb_dim = options["filter_order"], options["emb_dim"]
    if not isinstance(order, int) or isinstance(order, bool) or order < 1:
        raise ValueError(f"mixer_options['filter_order'] must be a positive int; got {order!r}")
    if not isinstance(emb_dim, int) or isinstance(emb_dim, bool) or emb_dim < 3 or emb_dim % 2 == 0:
        raise ValueError(f"mixer_options['emb_dim'] must be an odd int >= 3; got {emb_dim!r}")
    return order, emb_dim


@register_mixer("hyena", n_layers=2, mlp=True, d_conv=3, norm="layernorm")
class Hyena(Mixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        order, emb_dim = _options(cfg)
        d = cfg.d_model
        self.in_proj = nn.Linear(d, 3 * d)
        self.conv_weight = nn.Parameter(torch.randn(3 * d, cfg.d_conv) / math.sqrt(cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(3 * d))
        self.filter = ImplicitFilter(d, cfg.max_len, order, emb_dim)
        self.filter_bias = nn.Parameter(torch.randn(d))
        self.out_proj = nn.Linear(d, d)
        self.hook_conv, self.hook_gate = HookPoint(), HookPoint()
        self.history_width = d  # models.decoding: the width of the long convolution's inputs

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        (order, emb_dim), d = _options(cfg), cfg.d_model
        filter_mlp = linear_size(emb_dim, order) + linear_size(order, order) + 2 * order + linear_size(order, d, False)
        return (linear_size(d, 3 * d) + 3 * d * (cfg.d_conv + 1) + filter_mlp + d + linear_size(d, d),
                FLOAT32_BYTES * (cfg.max_len * emb_dim + d))  # the filter's pos and decay_rates

    def taps(self, length: int) -> torch.Tensor:
        """The filter h[:, :length] [D, length]: without a gradient wanted, from h over max_len
        positions computed once and kept while the filter's parameters are unchanged."""
        if torch.is_grad_enabled():
            return self.filter(length)
        key = tuple((id(p), p._version, p.dtype, p.device) for p in self.filter.parameters())
        kept = self.__dict__.get("kept_taps")
        if kept is None or kept[0] != key:
            kept = self.__dict__["kept_taps"] = (key, self.filter(self.cfg.max_len))
        return kept[1][:, :length]

    def long_conv(self, v: torch.Tensor, history: torch.Tensor | None = None, start: int = 0) -> torch.Tensor:
        """v [B, n, D] at positions start, ... -> (h * v) + bias * v there [B, n, D], the causal long
        convolution (by FFT; one position directly); history as in mix_from_history (v is written
        into it and the convolution reads every position before)."""
        length = check_length(self, start + v.shape[1])
        u = v
        if history is not None:
            history[:, start:length] = v
            u = history[:, :length]
        return causal_conv_last(u, self.taps(length), v.shape[1]) + self.filter_bias * v

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        return self.mix_from_history(x, None, 0)

    def mix_from_history(self, x: torch.Tensor, history: torch.Tensor | None, start: int) -> torch.Tensor:
        """x [B, n, D] (after hook_in) at positions start, ..., start + n - 1 -> [B, n, D]; history
        [B, >= start + n, D]: the long conv's inputs x1 * v, valid before start, this call's
        written at [start, start + n) (None: a whole sequence, start 0). The short conv continues
        from conv_carry while decoding (Mixer.convolve)."""
        d = x.shape[-1]
        z = self.hook_conv(self.convolve(self.in_proj(x), self.conv_weight, self.conv_bias))  # [B, n, 3D]
        x0, x1, v = z.split(d, dim=-1)
        gates = self.hook_gate(torch.stack([x0, x1], dim=2))  # [B, n, 2, D]
        y = self.long_conv(gates[:, :, 1] * v, history, start)  # [B, n, D]
        return self.out_proj(gates[:, :, 0] * y)
