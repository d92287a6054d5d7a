"""Sphere RNN: an Elman RNN whose nonlinearity projects the whole vector onto a sphere.

    v_t = W h_{t-1} + U x_t + b
    h_t = sqrt(n) * v_t / ||v_t||_2                 h_0 = 0,  h_t in R^n,  n = d_hidden
    y_t = W_out h_t

The radius sqrt(n) keeps coordinates O(1) (as LayerNorm does); ||v_t|| is clamped below at 1e-12
(torch.nn.functional.normalize). One of the "whole-vector normalisations" of the error-control
study: nonlinear, with state-dependent Jacobians dh_t/dh_{t-1} =
(sqrt(n)/||v_t||)(I - h_t h_t^T / n) W, but isotropic.

Fast path: no library kernel computes this recurrence; the fast path is the step loop without
hooks. Instrumented path: the loop honouring pins, hook_state [B, T, n]. Weights as torch.nn.RNN
(U(-1/sqrt(n), 1/sqrt(n))). No mixer_options.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("sphere_rnn", n_layers=1, residual=False, norm="none")
class SphereRNN(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        n = cfg.hidden
        self.state_shape = (n,)
        self.radius = math.sqrt(n)
        self.in_proj = nn.Linear(cfg.d_model, n)  # U x + b
        bound = 1.0 / math.sqrt(n)
        self.recurrent = nn.Parameter(torch.empty(n, n).uniform_(-bound, bound))  # W
        self.out_proj = nn.Linear(n, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        n, d = cfg.hidden, cfg.d_model
        return linear_size(d, n) + n * n + linear_size(n, d), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"drive": self.in_proj(x)}  # [B, T, n]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        v = h @ self.recurrent.T + inputs_t["drive"]
        return self.radius * nn.functional.normalize(v, dim=-1)  # [B, n]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
