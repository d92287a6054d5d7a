"""The LSTM's gates and cell states from its h sequence as a plain-C loop on the CPU (no autograd).

    z_t = drive_t + W_hh h_{t-1}                                   (i, f, g, o) blocks, h_{-1} = h0
    i, f, o = sigmoid(z_i, z_f, z_o),  g = tanh(z_g),  c_t = f_t c_{t-1} + i_t g_t

The products W_hh h_{t-1} of every step are one matmul before the call (zh = h W_hh^T, z0 =
h0 W_hh^T); the C code (lstm_body.h) adds them to the drive, applies the activations and runs the
cell scan in one pass, writing the gates [B, T, 4, H] and the states [B, T, 2, H] = (h_t, c_t)
(models.mixers.lstm's hook_state layout). float32 sigmoid / tanh through the vectorised exp_f32
(kernels.c), float64 through libm.
"""

from __future__ import annotations

import torch

from models.kernels.native.library import I, P, available, empty, function, ptr

DTYPES = (torch.float32, torch.float64)
_ARGS = [I, I, I, P, P, P, P, P, P, P]


def supported(*tensors: torch.Tensor) -> bool:
    """Whether lstm_cells runs here: the library built, every tensor on the CPU in one of DTYPES."""
    first = tensors[0]
    return (first.dtype in DTYPES and all(t.device.type == "cpu" and t.dtype == first.dtype for t in tensors)
            and available())


def lstm_cells(drive, h, h0, c0, w_hh) -> tuple[torch.Tensor, torch.Tensor]:
    """drive [B, T, 4H] (W_ih x_t + b_ih + b_hh), h [B, T, H], h0, c0 [B, H], w_hh [4H, H] (one
    dtype in DTYPES, CPU) -> (gates [B, T, 4, H] after their activations, states [B, T, 2, H]).
    A time-major h (nn.LSTM's batch_first output) is copied first: the loop reads it batch-major
    (measured faster than reading it, and W_hh h, across the batch stride)."""
    batch, length, hidden = h.shape
    drive, h, h0, c0 = (t.contiguous() for t in (drive, h, h0, c0))
    zh = torch.mm(h.view(-1, hidden), w_hh.T)  # [B T, 4H]
    z0 = (h0 @ w_hh.T).contiguous()  # [B, 4H]
    gates = empty((batch, length, 4, hidden), h)
    states = empty((batch, length, 2, hidden), h)
    suffix = "f32" if h.dtype == torch.float32 else "f64"
    function(f"lstm_cells_{suffix}", _ARGS)(batch, length, hidden, ptr(drive), ptr(zh), ptr(z0), ptr(h), ptr(c0),
                                            ptr(gates), ptr(states))
    return gates, states
