"""The direct terms of a diagonal scan's backward, shared by its chunked / native path
(models.kernels.diag_scan) and its Triton path (models.kernels.triton_diag_scan): the gradient
reaching each state h_t from the output, the final state and the exports (not through later
states), and the read-out coefficients' gradient dL/dc of y_t = sum_n c_t h_t."""

from __future__ import annotations

import torch


def direct_state_grad(g_out, g_final, g_exported, c, hs, export_idx) -> torch.Tensor:
    """dL/dh_t through the output (states or read-out), the final state and the exports only
    (not through later states): [B, T, *S]."""
    if g_out is None:
        g_direct = torch.zeros_like(hs)
    elif c is None:
        g_direct = g_out.clone()
    else:
        if c.dim() != hs.dim():
            c = c.reshape(*c.shape[:2], *([1] * (hs.dim() - 3)), c.shape[-1])
        g_direct = g_out[..., None] * c.conj()  # broadcasts to [B, T, *S]
    if g_final is not None:
        g_direct[:, -1] += g_final
    if export_idx is not None and g_exported is not None:
        g_direct.index_add_(1, export_idx, g_exported)
    return g_direct


def readout_grad_c(g_out, c, hs) -> torch.Tensor | None:
    """dL/dc of y = sum_n c h, reduced to c's shape ([B, T, N] or [B, T, *S])."""
    if c is None or g_out is None:
        return None
    if c.dim() != hs.dim():  # sum over the lead dims as a batched vec-mat
        flat = hs.conj().reshape(*hs.shape[:2], -1, hs.shape[-1])  # [B, T, lead, N]
        grad_c = (g_out.reshape(*hs.shape[:2], 1, -1) @ flat)[:, :, 0]  # [B, T, N]
    else:
        grad_c = g_out[..., None] * hs.conj()  # [B, T, *S]
    return grad_c if c.is_complex() else grad_c.real
