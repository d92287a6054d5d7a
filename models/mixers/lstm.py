"""LSTM (PyTorch's formulation, one layer).

    z_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh                       [4H] = (i, f, g, o) blocks
    i_t = sigmoid(z_i),  f_t = sigmoid(z_f),  g_t = tanh(z_g),  o_t = sigmoid(z_o)
    c_t = f_t * c_{t-1} + i_t * g_t
    h_t = o_t * tanh(c_t)                                             h_0 = c_0 = 0
    y_t = W_out h_t

State: (h_t, c_t) stored as state_shape (2, H): state[..., 0, :] = h, state[..., 1, :] = c, so
hook_state is [B, T, 2, H] and a state patch may replace h, c or both. State-dependent.
Gates: hook_gate [B, T, 4, H] = (i, f, g, o) after their nonlinearities (PyTorch calls all four
"gates"; g is the cell candidate). A patch on hook_gate replaces the gates used in the recurrence:
the scan re-runs with the patched gates pinned, before hook_state patches apply.

Fast path: torch.nn.LSTM (cuDNN on GPU); it returns only the h sequence, which is all the readout
needs. fast_states (the full (h, c) sequence) and the instrumented path use the step loop with
the same weights. No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn

from models.mixers.base import GatedRecurrentMixer, mixer_options, register_mixer


@register_mixer("lstm", n_layers=1, residual=False, norm="none")
class LSTM(GatedRecurrentMixer):
    gate_dims = 2  # hook_gate [B, T, 4, H]

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.hidden = cfg.hidden
        self.state_shape = (2, cfg.hidden)
        self.lstm = nn.LSTM(cfg.d_model, cfg.hidden, batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        lstm = self.lstm
        return {"drive": x @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + lstm.bias_hh_l0}  # [B, T, 4H]

    def gate_step(self, inputs_t, state: torch.Tensor) -> tuple[torch.Tensor, None]:
        """state [B, 2, H] -> ((i, f, g, o) [B, 4, H], None)."""
        z = (inputs_t["drive"] + state[:, 0] @ self.lstm.weight_hh_l0.T).unflatten(-1, (4, self.hidden))
        i, f, g, o = z.unbind(1)
        return torch.stack([torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)], dim=1), None

    def state_step(self, inputs_t, gates: torch.Tensor, aux, state: torch.Tensor) -> torch.Tensor:
        """gates [B, 4, H], state [B, 2, H] -> next state [B, 2, H]."""
        i, f, g, o = gates.unbind(1)
        c = f * state[:, 1] + i * g
        return torch.stack([o * torch.tanh(c), c], dim=1)

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states[:, :, 0])  # h_t

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.lstm(x)[0])  # nn.LSTM: h sequence [B, T, H]
