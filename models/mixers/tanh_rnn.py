"""Elman tanh RNN.

    h_t = tanh(W_hh h_{t-1} + W_ih x_t + b)        h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

State-dependent: dh_t/dh_{t-1} = diag(1 - h_t^2) W_hh depends on the state.
Fast path: torch.nn.RNN. Instrumented path: the same weights in a step loop, hook_state [B, T, H].
No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn

from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("tanh_rnn", n_layers=1, residual=False, norm="none")
class TanhRNN(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.state_shape = (cfg.hidden,)
        self.rnn = nn.RNN(cfg.d_model, cfg.hidden, nonlinearity="tanh", batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        h, d = cfg.hidden, cfg.d_model
        return linear_size(d, h) + linear_size(h, h) + linear_size(h, d), 0  # nn.RNN: two biases

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        drive = x @ self.rnn.weight_ih_l0.T + self.rnn.bias_ih_l0 + self.rnn.bias_hh_l0  # [B, T, H]
        return {"drive": drive}

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(inputs_t["drive"] + h @ self.rnn.weight_hh_l0.T)  # [B, H]

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.rnn(x)[0])  # nn.RNN: [B, T, H]

    def fast_from(self, x, inputs, initial=None) -> torch.Tensor:
        return self.out_proj(self.rnn(x, None if initial is None else initial[None].contiguous())[0])

    def fast_segment(self, x, inputs, initial=None):
        """nn.RNN from `initial` and its final state [B, H] (declared state patches)."""
        out, final = self.rnn(x, None if initial is None else initial[None].contiguous())
        return self.out_proj(out), final[0]

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)
