"""LayerNorm RNN: an Elman RNN whose nonlinearity is a whole-vector normalisation.

    v_t = W h_{t-1} + U x_t + b
    h_t = LN(v_t) = (v_t - mean(v_t)) / sqrt(var(v_t) + eps)        h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

The normalisation is LayerNorm without its per-coordinate gain and bias (those would make it
anisotropic; W_out absorbs them): it centres v_t and rescales the whole vector by one scalar, so
h_t lies on the sphere of radius sqrt(n) in the hyperplane sum(h) = 0 (up to eps = 1e-5). This is
the "whole-vector normalisation" of the error-control study: nonlinear, hence state-dependent
Jacobians dh_t/dh_{t-1} = (1/sigma_t)(I - 1 1^T / n - h_t h_t^T / n) W, but isotropic.

Fast path: no library kernel computes this recurrence; the fast path is the step loop without
hooks. Instrumented path: the loop honouring pins, hook_state [B, T, H]. Weights as torch.nn.RNN
(U(-1/sqrt(H), 1/sqrt(H))). No mixer_options.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer

EPS = 1e-5


@register_mixer("layernorm_rnn", n_layers=1, residual=False, norm="none")
class LayerNormRNN(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        hidden = cfg.hidden
        self.state_shape = (hidden,)
        self.in_proj = nn.Linear(cfg.d_model, hidden)  # U x + b
        bound = 1.0 / math.sqrt(hidden)
        self.recurrent = nn.Parameter(torch.empty(hidden, hidden).uniform_(-bound, bound))  # W
        self.out_proj = nn.Linear(hidden, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        h, d = cfg.hidden, cfg.d_model
        return linear_size(d, h) + h * h + linear_size(h, d), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"drive": self.in_proj(x)}  # [B, T, H]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        v = h @ self.recurrent.T + inputs_t["drive"]
        return nn.functional.layer_norm(v, v.shape[-1:], eps=EPS)  # [B, H]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
