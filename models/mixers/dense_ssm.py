"""Dense-SSM (bilinear RNN): a linear RNN whose dense transition matrix is chosen by the input.

    A(x_t) = A_0 + reshape(W_A x_t, [n, n])      input-dependent dense transition
    h_t = A(x_t) h_{t-1} + B x_t + b              h_0 = 0,  h_t in R^n,  n = d_hidden
    y_t = W_out h_t

With one-hot-like token embeddings A(x_t) is one learned matrix per token, so the model can
represent any finite group's action (the "bilinear" RNN). Affine (is_affine = True):
dh_t/dh_{t-1} = A(x_t); transition(inputs_t) returns it, [B, n, n].
Init keeps products bounded: A_0 = 0.8 * Q with Q random orthogonal (all singular values 0.8);
W_A ~ N(0, (0.05 / sqrt(n * d_model))^2), so for unit-variance inputs reshape(W_A x) has entries
of std ~0.05 / sqrt(n) and spectral norm ~0.1, giving ||A(x_t)||_2 <~ 0.9 at init; B, b as
torch.nn.Linear.

Fast path: the step loop without hooks (batched matrix-vector products on A(x_t) [B, T, n, n],
computed in parallel by prepare). An exact parallel form needs products of the input-dependent
n x n matrices (n^3 per step against the loop's n^2), so the loop is the fast path. Memory:
prepare holds B * T * n^2 floats. Instrumented path: the same loop honouring state pins,
hook_state [B, T, n]. No mixer_options.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("dense_ssm", n_layers=1, residual=False, norm="none")
class DenseSSM(RecurrentMixer):
    is_affine = True

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        n = cfg.hidden
        self.n = n
        self.state_shape = (n,)
        self.A0 = nn.Parameter(0.8 * nn.init.orthogonal_(torch.empty(n, n)))
        self.A_proj = nn.Linear(cfg.d_model, n * n, bias=False)  # W_A
        nn.init.normal_(self.A_proj.weight, std=0.05 / math.sqrt(n * cfg.d_model))
        self.in_proj = nn.Linear(cfg.d_model, n)  # B x + b
        self.out_proj = nn.Linear(n, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        n, d = cfg.hidden, cfg.d_model
        return n * n + linear_size(d, n * n, False) + linear_size(d, n) + linear_size(n, d), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        A = nn.functional.linear(x, self.A_proj.weight, self.A0.flatten())  # A_0 + W_A x, one addmm
        A = A.unflatten(-1, (self.n, self.n))  # [B, T, n, n]
        return {"A": A, "u": self.in_proj(x)}

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return (inputs_t["A"] @ h.unsqueeze(-1)).squeeze(-1) + inputs_t["u"]  # [B, n]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs_t["A"]  # [B, n, n]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
