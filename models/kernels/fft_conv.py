"""Causal long convolution by FFT (the fast path of BaseConv, H3 and Hyena).

    y[b, t, c] = sum_{s=0}^{t} k[c, t - s] * u[b, s, c]

u [B, T, C], filter k [C, L] with L >= T (only k[:, :T] can reach the outputs). Both are
zero-padded to 2T so the circular convolution of the FFT equals the linear (causal) one.
"""

from __future__ import annotations

import torch


def fft_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """u [B, T, C], k [C, L >= T] -> y [B, T, C] (causal convolution along time)."""
    if not isinstance(u, torch.Tensor) or u.dim() != 3:
        raise ValueError(f"u must be a [B, T, C] tensor; got {getattr(u, 'shape', type(u))}")
    _, length, channels = u.shape
    if not isinstance(k, torch.Tensor) or k.dim() != 2 or k.shape[0] != channels or k.shape[1] < length:
        raise ValueError(
            f"k must be a [C={channels}, L>={length}] filter; got {getattr(k, 'shape', type(k))}"
        )
    n = 2 * length
    dtype = torch.float64 if u.dtype == torch.float64 else torch.float32  # FFT precision
    u_f = torch.fft.rfft(u.transpose(1, 2).to(dtype), n=n)  # [B, C, n//2+1]
    k_f = torch.fft.rfft(k[:, :length].to(dtype), n=n)  # [C, n//2+1]
    y = torch.fft.irfft(u_f * k_f, n=n)[..., :length]  # [B, C, T]
    return y.transpose(1, 2).to(u.dtype)
