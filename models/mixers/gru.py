"""GRU (PyTorch's exact formulation, one layer).

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)              reset gate
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)              update gate
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))          new gate (r applied after b_hn)
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}                               h_0 = 0,  h_t in R^{d_hidden}
    y_t = W_out h_t

State-dependent. hook_state [B, T, H]; hook_gate [B, T, 3, H] = (r, z, n) after their
nonlinearities (PyTorch's names). A patch on hook_gate replaces the gates used in the recurrence:
the scan re-runs with the patched gates pinned, before hook_state patches apply.

Fast path: torch.nn.GRU (cuDNN on GPU). Instrumented path: the step loop with the same weights.
No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks import HookPoint, apply_pin, scan_with_state_hook, state_pins
from models.mixers.base import RecurrentMixer, mixer_options, per_step, register_mixer


@register_mixer("gru", n_layers=1, residual=False, norm="none")
class GRU(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        self.hidden = cfg.hidden
        self.state_shape = (cfg.hidden,)
        self.gru = nn.GRU(cfg.d_model, cfg.hidden, batch_first=True)
        self.out_proj = nn.Linear(cfg.hidden, cfg.d_model)
        self.hook_gate = HookPoint()

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"drive": x @ self.gru.weight_ih_l0.T + self.gru.bias_ih_l0}  # [B, T, 3H]: r | z | n

    def gates(self, inputs_t, h: torch.Tensor) -> torch.Tensor:
        """h [B, H] -> (r, z, n) [B, 3, H]."""
        drive = inputs_t["drive"].unflatten(-1, (3, self.hidden))
        rec = (h @ self.gru.weight_hh_l0.T + self.gru.bias_hh_l0).unflatten(-1, (3, self.hidden))
        reset = torch.sigmoid(drive[:, 0] + rec[:, 0])
        update = torch.sigmoid(drive[:, 1] + rec[:, 1])
        new = torch.tanh(drive[:, 2] + reset * rec[:, 2])
        return torch.stack([reset, update, new], dim=1)

    def update(self, gates: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        _, z, n = gates.unbind(1)
        return (1 - z) * n + z * h  # [B, H]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return self.update(self.gates(inputs_t, h), h)

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.gru(x)[0])  # nn.GRU: [B, T, H]

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        if not self.use_instrumented(self.hook_state, self.hook_gate):
            return self.fast_forward(x)
        inputs = self.prepare(x)
        gate_pins = self.gate_pins(inputs)
        gates, states = scan_with_state_hook(
            self.hook_state, lambda pins: self.scan(inputs, pins, gate_pins), 1
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
        """Step loop honouring state and gate pins; returns (gates [B, T, 3, H], states [B, T, H])."""
        drive = inputs["drive"]
        h = self.initial_state(drive.shape[0], drive)
        gates, states = [], []
        for t, inputs_t in enumerate(per_step(inputs)):
            gate = apply_pin(self.gates(inputs_t, h), gate_pins, t)
            h = apply_pin(self.update(gate, h), pins, t)
            gates.append(gate)
            states.append(h)
        return torch.stack(gates, dim=1), torch.stack(states, dim=1)
