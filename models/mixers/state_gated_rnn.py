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

from models.hooks import HookPoint, apply_pin, scan_with_state_hook, state_pins
from models.mixers.base import RecurrentMixer, mixer_options, per_step, register_mixer


@register_mixer("state_gated_rnn", n_layers=1, residual=False, norm="none")
class StateGatedRNN(RecurrentMixer):
    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        mixer_options(cfg, {})
        hidden = cfg.hidden
        self.state_shape = (hidden,)
        self.in_proj = nn.Linear(cfg.d_model, 2 * hidden)  # [U; U_g] x + [b; b_g]
        bound = 1.0 / math.sqrt(hidden)
        self.recurrent = nn.Parameter(torch.empty(2 * hidden, hidden).uniform_(-bound, bound))  # [W; W_g]
        self.out_proj = nn.Linear(hidden, cfg.d_model)
        self.hook_gate = HookPoint()

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        drive, drive_gate = self.in_proj(x).chunk(2, dim=-1)
        return {"drive": drive, "drive_gate": drive_gate}  # U x + b, U_g x + b_g: [B, T, H] each

    def gate_and_recurrent(self, inputs_t, h):
        """(g_t [B, H], W h_{t-1} [B, H]) from one matmul."""
        rec, rec_gate = (h @ self.recurrent.T).chunk(2, dim=-1)
        return torch.sigmoid(rec_gate + inputs_t["drive_gate"]), rec

    def update(self, inputs_t, gate: torch.Tensor, rec: torch.Tensor) -> torch.Tensor:
        return torch.tanh(gate * rec + inputs_t["drive"])  # [B, H]

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return self.update(inputs_t, *self.gate_and_recurrent(inputs_t, h))

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states)

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
        return state_pins(gates, self.hook_gate(gates.clone(), defer_readers=True), 1)

    def scan(self, inputs, pins=None, gate_pins=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Step loop honouring state and gate pins; returns (gates, states), each [B, T, H]."""
        drive = inputs["drive"]
        h = self.initial_state(drive.shape[0], drive)
        gates, states = [], []
        for t, inputs_t in enumerate(per_step(inputs)):
            gate, rec = self.gate_and_recurrent(inputs_t, h)
            gate = apply_pin(gate, gate_pins, t)
            h = apply_pin(self.update(inputs_t, gate, rec), pins, t)
            gates.append(gate)
            states.append(h)
        return torch.stack(gates, dim=1), torch.stack(states, dim=1)

    def fast_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The step loop without pins or gate collection: [B, T, H]."""
        return super().scan(inputs)[1]
