"""GRU (PyTorch's exact formulation, one layer).

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)              reset gate
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)              update gate
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))          new gate (r applied after b_hn)
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}                               h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

State-dependent. hook_state [B, T, H]; hook_gate [B, T, 3, H] = (r, z, n) after their
nonlinearities (PyTorch's names). A patch on hook_gate replaces the gates used in the recurrence:
the scan re-runs with the patched gates pinned, before hook_state patches apply.

Fast path: torch.nn.GRU (cuDNN on GPU). Instrumented path without patches (unpinned_scan): the
same nn.GRU call for the states, then every gate at once from h_{t-1} (one batched product); with
state or gate patches, the step loop with the same weights. No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn

from models.mixers.base import GatedRecurrentMixer, linear_size, mixer_options, register_mixer


@register_mixer("gru", n_layers=1, residual=False, norm="none")
class GRU(GatedRecurrentMixer):
    gate_dims = 2  # hook_gate [B, T, 3, H]

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.hidden = cfg.hidden
        self.state_shape = (cfg.hidden,)
        self.gru = nn.GRU(cfg.d_model, cfg.hidden, batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        h, d = cfg.hidden, cfg.d_model
        return 3 * (linear_size(d, h) + linear_size(h, h)) + linear_size(h, d), 0  # nn.GRU: 3 gates, two biases

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"drive": x @ self.gru.weight_ih_l0.T + self.gru.bias_ih_l0}  # [B, T, 3H]: r | z | n

    def gate_step(self, inputs_t, h: torch.Tensor) -> tuple[torch.Tensor, None]:
        """h [B, H] -> ((r, z, n) [B, 3, H], None)."""
        drive = inputs_t["drive"].unflatten(-1, (3, self.hidden))
        rec = (h @ self.gru.weight_hh_l0.T + self.gru.bias_hh_l0).unflatten(-1, (3, self.hidden))
        reset = torch.sigmoid(drive[:, 0] + rec[:, 0])
        update = torch.sigmoid(drive[:, 1] + rec[:, 1])
        new = torch.tanh(drive[:, 2] + reset * rec[:, 2])
        return torch.stack([reset, update, new], dim=1), None

    def state_step(self, inputs_t, gates: torch.Tensor, aux, h: torch.Tensor) -> torch.Tensor:
        _, z, n = gates.unbind(1)
        return (1 - z) * n + z * h  # [B, H]

    def unpinned_scan(self, x, inputs, initial=None):
        """(gates [B, T, 3, H], states [B, T, H]): nn.GRU's h sequence, and the gates of every
        step at once from h_{t-1} (gate_step's arithmetic over [B, T])."""
        if x.shape[1] == 0:
            return None
        h0 = x.new_zeros(x.shape[0], self.hidden) if initial is None else initial
        h = self.gru(x, h0[None].contiguous())[0]  # [B, T, H]
        h_prev = torch.cat([h0[:, None], h[:, :-1]], dim=1)
        drive = inputs["drive"].unflatten(-1, (3, self.hidden))  # [B, T, 3, H]
        rec = (h_prev @ self.gru.weight_hh_l0.T + self.gru.bias_hh_l0).unflatten(-1, (3, self.hidden))
        rz = torch.sigmoid(drive[:, :, :2] + rec[:, :, :2])  # reset, update [B, T, 2, H]
        new = torch.tanh(drive[:, :, 2] + rz[:, :, 0] * rec[:, :, 2])
        return torch.cat([rz, new[:, :, None]], dim=2), h

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.gru(x)[0])  # nn.GRU: [B, T, H]
