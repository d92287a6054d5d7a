"""The LSTM recurrence as a plain-C loop on the CPU, forward and backward, with every gate and
state kept (the LSTM mixer's instrumented path).

    z_t = drive_t + W_hh h_{t-1},   drive_t = W_ih x_t + b_ih + b_hh        (i, f, g, o) blocks
    i, f, o = sigmoid(z_i, z_f, z_o),  g = tanh(z_g),  c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)

lstm_scan(drive, h0, c0, w_hh) -> (gates [B, T, 4, H], states [B, T, 2, H] = (h_t, c_t)), an
autograd Function. The C code (lstm_body.h) runs the batch rows through time ROWS at a time, the
W_hh products of a step one register-blocked product for those rows (each load of W_hh, in cache,
serves all of them; multiply-adds fused where the CPU has FMA) and the activations vectorised
(float32 sigmoid / tanh through exp_f32 of kernels.c, float64 through libm). Its backward walks
the adjoint back over the stored gates and states, from the cotangents of h, c and the gates
(those of c and the gates only when nonzero: the readout reads h alone), and returns the drive's
gradient dz [B, T, 4H] (autograd takes it on to x, W_ih and the biases), W_hh's as one matmul
sum_t dz_t h_{t-1}^T, and h0's and c0's.
"""

from __future__ import annotations

import torch

from models.kernels.native.library import I, P, available, empty, function, ptr

DTYPES = (torch.float32, torch.float64)
_FWD = [I, I, I, P, P, P, P, P, P, P]
_BWD = [I, I, I, P, P, P, P, P, P, P, I, P, P, P, P]
ROWS = 4  # batch rows the C code advances together (LSTM_ROWS in lstm_body.h): its work buffers


def supported(*tensors: torch.Tensor) -> bool:
    """Whether lstm_scan runs here: the library built, every tensor on the CPU in one of DTYPES."""
    first = tensors[0]
    return (first.dtype in DTYPES and all(t.device.type == "cpu" and t.dtype == first.dtype for t in tensors)
            and available())


def _suffix(x: torch.Tensor) -> str:
    return "f32" if x.dtype == torch.float32 else "f64"


def nonzero(g: torch.Tensor | None) -> bool:
    return g is not None and bool(g.any())


class LSTMScan(torch.autograd.Function):
    """drive [B, T, 4H], h0, c0 [B, H], w_hh [4H, H] -> (gates [B, T, 4, H], states [B, T, 2, H])."""

    @staticmethod
    def forward(ctx, drive, h0, c0, w_hh):
        drive, h0, c0 = drive.contiguous(), h0.contiguous(), c0.contiguous()
        batch, length, hidden = drive.shape[0], drive.shape[1], h0.shape[-1]
        gates = empty((batch, length, 4, hidden), drive)
        states = empty((batch, length, 2, hidden), drive)
        w_t, work = w_hh.T.contiguous(), drive.new_empty(ROWS * 4 * hidden)  # held: the C code reads them
        function(f"lstm_fwd_{_suffix(drive)}", _FWD)(
            batch, length, hidden, ptr(drive), ptr(w_t), ptr(h0), ptr(c0), ptr(gates), ptr(states), ptr(work))
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h0, c0, w_hh, gates, states)
        return gates, states

    @staticmethod
    def backward(ctx, g_gates, g_states):
        h0, c0, w_hh, gates, states = ctx.saved_tensors
        batch, length, _, hidden = gates.shape
        if g_states is None and not nonzero(g_gates):
            return None, None, None, None
        g_h = states.new_zeros(batch, length, hidden) if g_states is None else g_states[:, :, 0].contiguous()
        g_c = None if g_states is None else g_states[:, :, 1]
        extra = nonzero(g_gates) or nonzero(g_c)
        if extra:
            g_gates = gates.new_zeros(gates.shape) if g_gates is None else g_gates.contiguous()
            g_c = g_h.new_zeros(g_h.shape) if g_c is None else g_c.contiguous()
        dz = empty((batch, length, 4 * hidden), gates)
        dh0, dc0 = h0.new_empty(h0.shape), c0.new_empty(c0.shape)
        w, work = w_hh.contiguous(), gates.new_empty(ROWS * 2 * hidden)  # held: the C code reads them
        function(f"lstm_bwd_{_suffix(gates)}", _BWD)(
            batch, length, hidden, ptr(w), ptr(c0), ptr(gates), ptr(states), ptr(g_h),
            ptr(g_gates) if extra else None, ptr(g_c) if extra else None, int(extra), ptr(dz), ptr(dh0), ptr(dc0),
            ptr(work))
        grad_w = None
        if ctx.needs_input_grad[3]:
            h_prev = torch.cat([h0[:, None], states[:, :-1, 0]], dim=1)  # [B, T, H]
            grad_w = dz.view(-1, 4 * hidden).T @ h_prev.reshape(-1, hidden)  # [4H, H]
        return dz, dh0, dc0, grad_w


def lstm_scan(drive, h0, c0, w_hh) -> tuple[torch.Tensor, torch.Tensor]:
    """drive [B, T, 4H] (W_ih x_t + b_ih + b_hh), h0, c0 [B, H], w_hh [4H, H] (one dtype in DTYPES,
    CPU) -> (gates [B, T, 4, H] after their activations, states [B, T, 2, H] = (h_t, c_t));
    differentiable in drive, h0, c0 and w_hh."""
    return LSTMScan.apply(drive, h0, c0, w_hh)
