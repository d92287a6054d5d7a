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
needs. Instrumented path without patches (unpinned_scan): on the CPU the recurrence in one C loop
with every gate and state kept and its own C backward (models.kernels.native.lstm: cheaper than
nn.LSTM plus recomputing the gates); elsewhere the same nn.LSTM call for h, then every gate at
once from h_{t-1} (one batched product W_hh h) and c by the diagonal scan (models.kernels.diag_scan),
the readout's gradient through nn.LSTM's backward (CellStates: the gates' and c's graph is walked
only when something reads them). With state or gate patches, and for fast_states, the step loop
with the same weights.
No mixer_options.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from models.kernels import diag_scan
from models.kernels.native import lstm as native_lstm
from models.mixers.base import GatedRecurrentMixer, linear_size, mixer_options, register_mixer


def cell_states(h, h0, c0, drive, w_hh):
    """Every gate and state from the h sequence h [B, T, H]: z_t = drive_t + W_hh h_{t-1} for all t
    at once (h_{-1} = h0) -> gates [B, T, 4, H] = (i, f, g, o) and states [B, T, 2, H] = (h, c), c
    by the diagonal scan of (f_t, i_t g_t) from c0 [B, H]. In torch (differentiable)."""
    batch, length, hidden = h.shape
    h_prev = torch.cat([h0[:, None], h[:, :-1]], dim=1)
    z = torch.addmm(drive.flatten(0, 1), h_prev.flatten(0, 1), w_hh.T).view(batch, length, 4, hidden)
    gates = torch.cat([torch.sigmoid(z[:, :, :2]), torch.tanh(z[:, :, 2:3]), torch.sigmoid(z[:, :, 3:])], dim=2)
    i, f, g, _ = gates.unbind(2)
    return gates, torch.stack([h, diag_scan(f, i * g, initial_state=c0).output], dim=2)


class CellStates(torch.autograd.Function):
    """(gates [B, T, 4, H], states [B, T, 2, H]) for the instrumented path off the CPU
    (cell_states' values from nn.LSTM's h). The backward passes the states' h cotangent straight to h and walks the gates' and c's graph
    (recomputed in torch) only when something read them (a nonzero cotangent): the readout reads
    h alone, and a zero cotangent is a zero gradient. Inputs x [B, T, D], h [B, T, H] (nn.LSTM's),
    h0, c0 [B, H], drive [B, T, 4H] (prepare's value, reused by the forward; recomputed from x in
    the backward), w_ih, w_hh, b (= b_ih + b_hh)."""

    @staticmethod
    def forward(ctx, x, h, h0, c0, drive, w_ih, w_hh, b):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, h, h0, c0, w_ih, w_hh, b)
        return cell_states(h, h0, c0, drive, w_hh)

    @staticmethod
    def backward(ctx, g_gates, g_states):
        read_c = g_states is not None and bool(g_states[:, :, 1].any())
        if not read_c and (g_gates is None or not bool(g_gates.any())):
            return None, (None if g_states is None else g_states[:, :, 0]), *(None,) * 6
        leaves = [t.detach().requires_grad_(need) for t, need in
                  zip(ctx.saved_tensors, [ctx.needs_input_grad[i] for i in (0, 1, 2, 3, 5, 6, 7)])]
        x, h, h0, c0, w_ih, w_hh, b = leaves
        with torch.enable_grad():
            outputs = cell_states(h, h0, c0, F.linear(x, w_ih, b), w_hh)
            pairs = [(out, g) for out, g in zip(outputs, (g_gates, g_states)) if g is not None]
            wanted = [t for t in leaves if t.requires_grad]
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
        x_g, h_g, h0_g, c0_g, wih_g, whh_g, b_g = (next(grads) if t.requires_grad else None for t in leaves)
        return x_g, h_g, h0_g, c0_g, None, wih_g, whh_g, b_g


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

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        mixer_options(cfg, {})  # refuses options, as the constructor does
        h, d = cfg.hidden, cfg.d_model
        return 4 * (linear_size(d, h) + linear_size(h, h)) + linear_size(h, d), 0  # nn.LSTM: 4 gates, two biases

    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        lstm = self.lstm
        return {"drive": F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0 + lstm.bias_hh_l0)}  # [B, T, 4H]

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

    def unpinned_scan(self, x, inputs, initial=None):
        """(gates [B, T, 4, H], states [B, T, 2, H]): on the CPU the C recurrence with its backward
        (models.kernels.native.lstm), elsewhere nn.LSTM's h sequence and CellStates (the gates of
        every step at once from h_{t-1} and the cell scan)."""
        if x.shape[1] == 0:
            return None
        lstm, batch = self.lstm, x.shape[0]
        h0 = x.new_zeros(batch, self.hidden) if initial is None else initial[:, 0]
        c0 = x.new_zeros(batch, self.hidden) if initial is None else initial[:, 1]
        if native_lstm.supported(inputs["drive"], h0, c0, lstm.weight_hh_l0):
            return native_lstm.lstm_scan(inputs["drive"], h0, c0, lstm.weight_hh_l0)
        h = lstm(x, (h0[None].contiguous(), c0[None].contiguous()))[0]  # [B, T, H]
        return CellStates.apply(x, h, h0, c0, inputs["drive"].detach(), lstm.weight_ih_l0, lstm.weight_hh_l0,
                                lstm.bias_ih_l0 + lstm.bias_hh_l0)

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.out_proj(states[:, :, 0])  # h_t

    def fast_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.lstm(x)[0])  # nn.LSTM: h sequence [B, T, H]
