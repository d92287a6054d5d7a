"""State-gated RNN: a tanh RNN whose recurrent drive is gated by the state and the input.

    g_t = sigmoid(W_g h_{t-1} + U_g x_t + b_g)             gate, depends on h_{t-1} and x_t
    h_t = tanh(g_t * (W h_{t-1}) + U x_t + b)              h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

State-dependent twice over: dh_t/dh_{t-1} = diag(1 - h_t^2) [diag(g_t) W + diag(W h_{t-1} g_t (1 - g_t)) W_g]
depends on h_{t-1} through both the tanh and the gate.

Fast path: no library kernel computes this recurrence, so the fast path is the same step loop
without hooks (and without collecting gates). Instrumented path: the loop with hook_state
[B, T, H] and hook_gate [B, T, H] (g_t). A patch on hook_gate replaces g_t in the recurrence:
the scan re-runs with the patched gates pinned (like a state patch), before hook_state patches
apply. Weights: W, W_g [H, H] initialised U(-1/sqrt(H), 1/sqrt(H)) as in torch.nn.RNN; U, U_g, b,
b_g as torch.nn.Linear. No mixer_options.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.mixers.base import GatedRecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("state_gated_rnn", n_layers=1, residual=False, norm="none")
class StateGatedRNN(GatedRecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        hidden = cfg.hidden
        self.state_shape = (hidden,)
        self.in_proj = nn.Linear(cfg.d_model, 2 * hidden)  # [U; U_g] x + [b; b_g]
        bound = 1.0 / math.sqrt(hidden)
        self.recurrent = nn.Parameter(torch.empty(2 * hidden, hidden).uniform_(-bound, bound))  # [W; W_g]
        self.out_proj = nn.Linear(hidden, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        h, d = cfg.hidden, cfg.d_model
        return linear_size(d, 2 * h) + 2 * h * h + linear_size(h, d), 0

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        drive, drive_gate = self.in_proj(x).chunk(2, dim=-1)
        return {"drive": drive, "drive_gate": drive_gate}  # U x + b, U_g x + b_g: [B, T, H] each

    def gate_step(self, inputs_t, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_t [B, H], W h_{t-1} [B, H]) from one matmul."""
        rec, rec_gate = (h @ self.recurrent.T).chunk(2, dim=-1)
        return torch.sigmoid(rec_gate + inputs_t["drive_gate"]), rec

    def state_step(self, inputs_t, gate: torch.Tensor, rec: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(gate * rec + inputs_t["drive"])  # [B, H]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
