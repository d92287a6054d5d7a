"""Causal depthwise short convolution with a carried state.

    y[b, t, c] = bias[c] + sum_{k=0}^{W-1} weight[c, k] * xp[b, t + k, c]

where xp = concat(initial_state^T, x) along time: the W-1 inputs before t = 0 come from
`initial_state` [B, C, W-1] (oldest first; zeros when None). The convention matches
`torch.nn.Conv1d(C, C, W, groups=C, padding=W-1)` truncated to the first T outputs (and the
reference Mamba / causal-conv1d layers): weight[:, -1] multiplies the current input x_t.

The final state is the last W-1 entries of xp, [B, C, W-1], so running two halves of a sequence
with the first half's final state as the second's initial state equals one run.

Implementations (impl=):
  "naive"  the definition: a loop over the W taps (W is small), shifting the padded input
  "torch"  F.conv1d with groups=C on the state-prepended input (the default for every device)
  "auto"   "torch"
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IMPLS = ("auto", "naive", "torch")


def _check(x, weight, bias, initial_state, impl) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a [B, T, C] tensor; got {getattr(x, 'shape', type(x))}")
    batch, _, channels = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] != channels:
        raise ValueError(
            f"weight must be a [C={channels}, W] tensor; got {getattr(weight, 'shape', type(weight))}"
        )
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (channels,)):
        raise ValueError(f"bias must be None or a [C={channels}] tensor; got {getattr(bias, 'shape', bias)}")
    width = weight.shape[1]
    if initial_state is not None and (
        not isinstance(initial_state, torch.Tensor)
        or tuple(initial_state.shape) != (batch, channels, width - 1)
    ):
        raise ValueError(
            f"initial_state must be None or a [B={batch}, C={channels}, W-1={width - 1}] tensor; "
            f"got {getattr(initial_state, 'shape', initial_state)}"
        )
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")


def _padded(x: torch.Tensor, width: int, initial_state: torch.Tensor | None) -> torch.Tensor:
    """x [B, T, C] -> xp [B, C, W-1+T], the carried inputs prepended (oldest first)."""
    xt = x.transpose(1, 2)  # [B, C, T]
    if initial_state is None:
        return F.pad(xt, (width - 1, 0))
    return torch.cat([initial_state.to(x.dtype), xt], dim=2)


def short_conv_naive(x, weight, bias=None, initial_state=None):
    """The definition, tap by tap. Returns (y [B, T, C], xp [B, C, W-1+T])."""
    length, width = x.shape[1], weight.shape[1]
    xp = _padded(x, width, initial_state)  # [B, C, W-1+T]
    y = sum(weight[:, k, None] * xp[:, :, k : k + length] for k in range(width))  # [B, C, T]
    if bias is not None:
        y = y + bias[:, None]
    return y.transpose(1, 2), xp


def short_conv_torch(x, weight, bias=None, initial_state=None):
    """F.conv1d on the state-prepended input. Returns (y [B, T, C], xp [B, C, W-1+T])."""
    channels, width = weight.shape
    xp = _padded(x, width, initial_state)  # [B, C, W-1+T]
    y = F.conv1d(xp, weight[:, None, :], bias, groups=channels)  # [B, C, T]
    return y.transpose(1, 2), xp


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    impl: str = "auto",
):
    """Causal depthwise conv: x [B, T, C], weight [C, W], bias [C] | None,
    initial_state [B, C, W-1] | None -> y [B, T, C], or (y, final_state [B, C, W-1])."""
    _check(x, weight, bias, initial_state, impl)
    fn = short_conv_naive if impl == "naive" else short_conv_torch
    y, xp = fn(x, weight, bias, initial_state)
    if not output_final_state:
        return y
    width = weight.shape[1]
    final = xp[:, :, xp.shape[2] - (width - 1) :]  # [B, C, W-1]
    return y, final
