"""Token-gated RNN: a linear RNN whose transition is gated by the current token only.

    a_t = sigmoid(W x_t + b_W)                  gate in (0, 1)^n, depends on x_t only
    h_t = a_t * (A h_{t-1}) + B x_t + b         h_0 = 0,  h_t in R^n,  n = d_hidden
    y_t = W_out h_t

Affine (is_affine = True): dh_t/dh_{t-1} = diag(a_t) A does not depend on the state;
transition(inputs_t) returns it dense, [B, n, n]. Init: A a random orthogonal matrix, so
||diag(a_t) A||_2 <= max_i a_t,i < 1 and products of transitions contract; W, B, b as
torch.nn.Linear. hook_gate [B, T, n] holds a_t; it is computed before the scan on every path, so
a patch on it changes the recurrence directly.

Fast path: the step loop without hooks. An exact parallel form needs the products of the
time-varying n x n transitions (n^3 per step against the loop's n^2), so at the widths used here
(n = 64) it costs far more than it saves; the loop is the fast path. Instrumented path: the same
loop honouring state pins, hook_state [B, T, n]. No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks import HookPoint
from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("token_gated_rnn", n_layers=1, residual=False, norm="none")
class TokenGatedRNN(RecurrentMixer):
    is_affine = True

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        n = cfg.hidden
        self.state_shape = (n,)
        self.A = nn.Parameter(nn.init.orthogonal_(torch.empty(n, n)))
        self.gate_proj = nn.Linear(cfg.d_model, n)  # W x + b_W
        self.in_proj = nn.Linear(cfg.d_model, n)  # B x + b
        self.out_proj = nn.Linear(n, cfg.d_model)
        self.hook_gate = HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        n, d = cfg.hidden, cfg.d_model
        return n * n + 2 * linear_size(d, n) + linear_size(n, d), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        gate = self.hook_gate(torch.sigmoid(self.gate_proj(x)))  # [B, T, n]
        return {"gate": gate, "u": self.in_proj(x)}

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return inputs_t["gate"] * (h @ self.A.T) + inputs_t["u"]  # [B, n]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs_t["gate"].unsqueeze(-1) * self.A  # diag(a_t) A: [B, n, n]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
