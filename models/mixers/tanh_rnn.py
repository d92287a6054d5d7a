"""Elman tanh RNN.

    h_t = tanh(W_hh h_{t-1} + W_ih x_t + b)        h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

State-dependent: dh_t/dh_{t-1} = diag(1 - h_t^2) W_hh depends on the state.
Fast path: torch.nn.RNN. Instrumented path: the same weights in a step loop, hook_state [B, T, H].
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks import HookPoint, apply_pin, scan_with_state_hook
from models.mixers.base import Mixer, register_mixer


@register_mixer("tanh_rnn", n_layers=1, residual=False, norm="none")
class TanhRNN(Mixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.rnn = nn.RNN(cfg.d_model, cfg.hidden, nonlinearity="tanh", batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)
        self.hook_state = HookPoint()

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        if self.use_instrumented(self.hook_state):
            _, states = scan_with_state_hook(self.hook_state, lambda pins: self.scan(x, pins), 1)
        else:
            states, _ = self.rnn(x)
        return self.out_proj(states)

    def scan(self, x: torch.Tensor, pins=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step loop; returns (states, states), both [B, T, H]."""
        drive = x @ self.rnn.weight_ih_l0.T + self.rnn.bias_ih_l0 + self.rnn.bias_hh_l0  # [B, T, H]
        h = x.new_zeros(x.shape[0], self.cfg.hidden)
        states = []
        for t in range(x.shape[1]):
            h = torch.tanh(drive[:, t] + h @ self.rnn.weight_hh_l0.T)
            h = apply_pin(h, pins, t)
            states.append(h)
        states = torch.stack(states, dim=1)
        return states, states
