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

from models.hooks import HookPoint, apply_pin, scan_with_state_hook, state_pins
from models.mixers.base import RecurrentMixer, mixer_options, per_step, register_mixer


@register_mixer("lstm", n_layers=1, residual=False, norm="none")
class LSTM(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.hidden = cfg.hidden
        self.state_shape = (2, cfg.hidden)
        self.lstm = nn.LSTM(cfg.d_model, cfg.hidden, batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)
        self.hook_gate = HookPoint()

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        lstm = self.lstm
        return {"drive": x @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + lstm.bias_hh_l0}  # [B, T, 4H]

    def gates(self, inputs_t, state: torch.Tensor) -> torch.Tensor:
        """state [B, 2, H] -> (i, f, g, o) [B, 4, H]."""
        z = (inputs_t["drive"] + state[:, 0] @ self.lstm.weight_hh_l0.T).unflatten(-1, (4, self.hidden))
        i, f, g, o = z.unbind(1)
        return torch.stack([torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)], dim=1)

    def update(self, gates: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """gates [B, 4, H], state [B, 2, H] -> next state [B, 2, H]."""
        i, f, g, o = gates.unbind(1)
        c = f * state[:, 1] + i * g
        return torch.stack([o * torch.tanh(c), c], dim=1)

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return self.update(self.gates(inputs_t, h), h)

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states[:, :, 0])  # h_t

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.lstm(x)[0])  # nn.LSTM: h sequence [B, T, H]

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        if not self.use_instrumented(self.hook_state, self.hook_gate):
            return self.fast_forward(x)
        inputs = self.prepare(x)
        gate_pins = self.gate_pins(inputs)
        gates, states = scan_with_state_hook(
            self.hook_state, lambda pins: self.scan(inputs, pins, gate_pins), 2
        )
        self.hook_gate.emit(gates)
        return self.readout(x, states, inputs)

    def gate_pins(self, inputs):
        """Where patches on hook_gate changed the gates of an unpatched scan (None if nowhere)."""
        if not self.hook_gate.has_patches:
            return None
        gates, _ = self.scan(inputs)
        return state_pins(gates, self.hook_gate(gates.clone(), defer_readers=True), 2)

    def scan(self, inputs, pins=None, gate_pins=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step loop honouring state and gate pins; returns (gates [B, T, 4, H], states [B, T, 2, H])."""
        drive = inputs["drive"]
        state = self.initial_state(drive.shape[0], drive)
        gates, states = [], []
        for t, inputs_t in enumerate(per_step(inputs)):
            gate = apply_pin(self.gates(inputs_t, state), gate_pins, t)
            state = apply_pin(self.update(gate, state), pins, t)
            gates.append(gate)
            states.append(state)
        return torch.stack(gates, dim=1), torch.stack(states, dim=1)
