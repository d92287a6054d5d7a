"""Triton kernels for the diagonal affine scan h_t = a_t * h_{t-1} + b_t (real dtypes).

Forward: one program per (batch row, tile of BL lead rows x all N state entries); the state stays
in registers (float32) while the program walks t = 0..T-1. With a read-out c the program reduces
y_t[l] = sum_n c_t[l, n] h_t[l, n] on chip and writes no state unless exports are requested, so
the fast path never writes [B, T, *S]. Backward recomputes the states with the forward kernel
(STORE=True), forms dL/dh_t from the output / final state / exports (torch, diag_scan's helpers)
and runs the adjoint g_t = dL/dh_t + a_{t+1} g_{t+1} backwards in time in a second kernel, giving
grad a_t = g_t h_{t-1}, grad b_t = g_t, grad h_{-1} = a_0 g_0.

Pins are handled by diag_scan's segmentation (one kernel call per unpinned stretch). Runs on CUDA,
or on the CPU under TRITON_INTERPRET=1 (tests: small shapes, float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from models.kernels.scan_grads import direct_state_grad, readout_grad_c


@triton.jit
def _scan_fwd(a_ptr, b_ptr, c_ptr, h0_ptr, y_ptr, hs_ptr, hT_ptr, T, L, N, c_stride_bt, c_stride_l,
              HAS_C: tl.constexpr, STORE: tl.constexpr, BL: tl.constexpr, BN: tl.constexpr):
    pid_b = tl.program_id(0)
    offs_l = tl.program_id(1) * BL + tl.arange(0, BL)
    offs_n = tl.arange(0, BN)
    mask = (offs_l[:, None] < L) & (offs_n[None, :] < N)
    M = L * N
    offs = offs_l[:, None] * N + offs_n[None, :]  # [BL, BN] within one [*S] state
    h = tl.load(h0_ptr + pid_b * M + offs, mask=mask, other=0.0).to(tl.float32)
    for t in range(T):
        base = (pid_b * T + t) * M
        a = tl.load(a_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        h = a * h + b
        if STORE:
            tl.store(hs_ptr + base + offs, h, mask=mask)
        if HAS_C:
            c_offs = (pid_b * T + t) * c_stride_bt + offs_l[:, None] * c_stride_l + offs_n[None, :]
            c = tl.load(c_ptr + c_offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + (pid_b * T + t) * L + offs_l, tl.sum(h * c, axis=1), mask=offs_l < L)
    tl.store(hT_ptr + pid_b * M + offs, h, mask=mask)


@triton.jit
def _scan_bwd(a_ptr, hprev_ptr, gd_ptr, ga_ptr, gb_ptr, gh0_ptr, T, M, BLOCK: tl.constexpr):
    pid_b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    g = tl.zeros([BLOCK], dtype=tl.float32)
    a_next = tl.zeros([BLOCK], dtype=tl.float32)  # a_{t+1}; 0 past the end
    for i in range(T):
        base = (pid_b * T + (T - 1 - i)) * M
        g = tl.load(gd_ptr + base + offs, mask=mask, other=0.0).to(tl.float32) + a_next * g
        h_prev = tl.load(hprev_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(ga_ptr + base + offs, g * h_prev, mask=mask)
        tl.store(gb_ptr + base + offs, g, mask=mask)
        a_next = tl.load(a_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(gh0_ptr + pid_b * M + offs, a_next * g, mask=mask)


def _forward(a, b, c, h0, store: bool):
    """a, b [B, T, *S], c None | [B, T, N] | [B, T, *S], h0 [B, *S] -> (y | None, hs | None, hT)."""
    a, b, h0 = a.contiguous(), b.contiguous(), h0.contiguous()
    batch, length, n = a.shape[0], a.shape[1], a.shape[-1]
    lead = a[0, 0].numel() // n
    block_n = triton.next_power_of_2(n)
    block_l = max(1, min(triton.next_power_of_2(lead), 4096 // block_n))
    hs = torch.empty_like(a) if store else a.new_empty(1)
    h_final = torch.empty_like(h0)
    y = None
    if c is not None:
        c = c.contiguous()
        y = a.new_empty(batch, length, *a.shape[2:-1])
        c_stride_l = n if c.dim() == a.dim() else 0
        c_stride_bt = c[0, 0].numel()
    grid = (batch, triton.cdiv(lead, block_l))
    _scan_fwd[grid](
        a, b, c if c is not None else a, h0, y if y is not None else a, hs, h_final, length, lead, n,
        c_stride_bt if c is not None else 0, c_stride_l if c is not None else 0,
        HAS_C=c is not None, STORE=store, BL=block_l, BN=block_n,
    )
    return y, (hs if store else None), h_final


class TritonScan(torch.autograd.Function):
    """The segment function of diag_scan (same signature as its chunked one); chunk is unused."""

    @staticmethod
    def forward(ctx, a, b, c, h0, export_idx, chunk):
        store = c is None or export_idx is not None
        y, hs, h_final = _forward(a, b, c, h0, store)
        exported = hs.index_select(1, export_idx) if export_idx is not None else a.new_zeros(0)
        ctx.save_for_backward(a, b, c, h0, export_idx)
        return (hs if c is None else y), h_final, exported

    @staticmethod
    def backward(ctx, g_out, g_final, g_exported):
        a, b, c, h0, export_idx = ctx.saved_tensors
        a, h0 = a.contiguous(), h0.contiguous()  # the kernels index flat [B, T, M] / [B, M] memory
        _, hs, _ = _forward(a, b, None, h0, store=True)
        g_direct = direct_state_grad(g_out, g_final, g_exported, c, hs, export_idx).contiguous()
        h_prev = torch.cat([h0[:, None], hs[:, :-1]], dim=1).contiguous()
        batch, length = a.shape[:2]
        width = a[0, 0].numel()
        grad_a, grad_b, grad_h0 = torch.empty_like(a), torch.empty_like(a), torch.empty_like(h0)
        block = min(1024, triton.next_power_of_2(width))
        _scan_bwd[(batch, triton.cdiv(width, block))](
            a, h_prev, g_direct, grad_a, grad_b, grad_h0, length, width, BLOCK=block
        )
        grad_c = readout_grad_c(g_out, c, hs) if ctx.needs_input_grad[2] else None
        return grad_a, grad_b, grad_c, grad_h0, None, None
