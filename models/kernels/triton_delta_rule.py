"""Fused recurrent delta rule in Triton: forward and backward, the state kept on chip.

Recurrence (models/kernels/delta_rule.py), per (batch, head), state S [V, K]:

    D_t = alpha_t S_{t-1}              (alpha_t = exp(g_t); 1 without g)
    r_t = v_t - D_t k_t                (the residual the step writes)
    S_t = D_t + beta_t r_t k_t^T       then pinned: S_t = P_t where a pin is set
    o_t = S_t q_t

With a channel-wise decay (g [B, T, H, K]) D_t = S_{t-1} Diag(alpha_t) replaces alpha_t S_{t-1}.

Rows of S evolve independently given k_t and beta_t, so each program owns one (batch, head) and
a block of BV value rows: grid (cdiv(V, BV), B * H). Forward stores o, r (for the backward), the
exported states and the final state. Backward runs two passes:

  reverse:  dS += do_t q_t^T (+ d exported state); at a pin, dP_t = dS and dS = 0;
            du = dS k_t, dv_t = beta_t du, dbeta_t = du . r_t, dk_t = dS^T (beta_t r_t),
            dm_t = -beta_t du, dS <- alpha_t (dS + dm_t k_t^T) (the gradient of S_{t-1});
            finally dS_{-1}. With g: dg_t = <dD_t, D_t> runs backwards as a scalar recurrence,
            dg_t = [t unpinned] (<do_t, o_t> + <dE_t, E_t> + dg_{t+1} - beta_t <du, v_t>)
            (E_t: the exported state, d_final and the final state at t = T - 1), since
            <dS_t, S_t> = <do_t, o_t> + <dE_t, E_t> + dg_{t+1}; so no state is stored
  forward:  replays D_t from r: dk_t += D_t^T dm_t, dq_t = S_t^T do_t
With a channel-wise decay the reverse pass needs D_t itself: dg_t = sum over value rows of
dD_t * D_t, per key channel, with dD_t = dS_t - beta_t du k_t^T. The forward stores the state
entering every block of CK steps (checkpoints [B, H, ceil(T / CK), V, K]); the reverse pass
(_bwd_reverse_channel_kernel) takes the blocks last to first, replays each from its checkpoint
and r into a scratch of CK states D_t per program ([V blocks, B, H, CK, BV, BK]), then walks it
backwards. The forward replay pass is shared.
Sums over value rows (dk, dq, dbeta, dg) are written per V block and added in torch.

Pins are passed compactly: pin_slot [T] int32 (-1 or the index p of a pinned time),
pin_mask [P, B] int32, pin_val [P, B, H, V, K]; exports as export_slot [T] int32 (-1 or the slot
in states [B, n_export, H, V, K]). Runs on CUDA or on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel(
    q, k, v, beta, g, s0, pin_slot, pin_mask, pin_val, export_slot,
    o, r, states, s_final, ckpt,
    B, T, H, K, V, NE,
    HAS_G: tl.constexpr, HAS_S0: tl.constexpr, HAS_PINS: tl.constexpr, HAS_EXPORT: tl.constexpr,
    HAS_GK: tl.constexpr, CK: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // H
    h = i_bh % H
    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    m_s = mv[:, None] & mk[None, :]
    s_offs = offs_v[:, None] * K + offs_k[None, :]  # [BV, BK] inside one [V, K] state
    S = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_S0:
        S = tl.load(s0 + i_bh * V * K + s_offs, mask=m_s, other=0.0).to(tl.float32)
    for t in range(T):
        row = (b * T + t) * H + h
        k_t = tl.load(k + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        q_t = tl.load(q + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        v_t = tl.load(v + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        b_t = tl.load(beta + row).to(tl.float32)
        if HAS_GK:
            if t % CK == 0:  # the state entering block t // CK
                tl.store(ckpt + (i_bh * tl.cdiv(T, CK) + t // CK) * V * K + s_offs, S, mask=m_s)
            S = S * tl.exp(tl.load(g + row * K + offs_k, mask=mk, other=0.0).to(tl.float32))[None, :]
        if HAS_G:
            S = S * tl.exp(tl.load(g + row).to(tl.float32))
        r_t = v_t - tl.sum(S * k_t[None, :], axis=1)  # [BV]
        S = S + (b_t * r_t)[:, None] * k_t[None, :]
        if HAS_PINS:
            slot = tl.load(pin_slot + t)
            safe = tl.maximum(slot, 0)
            # conditions as [BV, BK] tensors (the interpreter rejects scalar masks)
            pinned = ((s_offs * 0 + slot) >= 0) & ((s_offs * 0 + tl.load(pin_mask + safe * B + b)) != 0)
            P = tl.load(pin_val + (safe * B + b) * H * V * K + h * V * K + s_offs,
                        mask=m_s & pinned, other=0.0)
            S = tl.where(pinned, P, S)
        tl.store(o + row * V + offs_v, tl.sum(S * q_t[None, :], axis=1).to(o.dtype.element_ty), mask=mv)
        tl.store(r + row * V + offs_v, r_t, mask=mv)
        if HAS_EXPORT:
            e = tl.load(export_slot + t)
            base = ((b * NE + tl.maximum(e, 0)) * H + h) * V * K
            tl.store(states + base + s_offs, S, mask=m_s & ((s_offs * 0 + e) >= 0))
    tl.store(s_final + i_bh * V * K + s_offs, S, mask=m_s)


@triton.jit
def _bwd_reverse_kernel(
    q, k, v, beta, g, r, o, states, s_final, do, d_final, d_states, pin_slot, pin_mask, export_slot,
    dv, dm, dk_part, dbeta_part, dg_part, d_pin_val, d_s0,
    B, T, H, K, V, NE,
    HAS_G: tl.constexpr, HAS_D_FINAL: tl.constexpr, HAS_PINS: tl.constexpr, HAS_EXPORT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // H
    h = i_bh % H
    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    m_s = mv[:, None] & mk[None, :]
    s_offs = offs_v[:, None] * K + offs_k[None, :]
    dS = tl.zeros([BV, BK], dtype=tl.float32)
    acc = tl.zeros([BV], dtype=tl.float32)  # dg_{t+1}, per value row of this block
    if HAS_D_FINAL:
        dS = tl.load(d_final + i_bh * V * K + s_offs, mask=m_s, other=0.0).to(tl.float32)
        if HAS_G:
            acc = tl.sum(dS * tl.load(s_final + i_bh * V * K + s_offs, mask=m_s, other=0.0), axis=1)
    for i in range(T):
        t = T - 1 - i
        row = (b * T + t) * H + h
        k_t = tl.load(k + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        q_t = tl.load(q + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        b_t = tl.load(beta + row).to(tl.float32)
        r_t = tl.load(r + row * V + offs_v, mask=mv, other=0.0)
        do_t = tl.load(do + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        dS = dS + do_t[:, None] * q_t[None, :]
        if HAS_G:
            acc = acc + do_t * tl.load(o + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        if HAS_EXPORT:
            e = tl.load(export_slot + t)
            base = ((b * NE + tl.maximum(e, 0)) * H + h) * V * K
            m_e = m_s & ((s_offs * 0 + e) >= 0)
            d_e = tl.load(d_states + base + s_offs, mask=m_e, other=0.0).to(tl.float32)
            dS = dS + d_e
            if HAS_G:
                acc = acc + tl.sum(d_e * tl.load(states + base + s_offs, mask=m_e, other=0.0), axis=1)
        if HAS_PINS:
            slot = tl.load(pin_slot + t)
            safe = tl.maximum(slot, 0)
            # conditions as [BV, BK] tensors (the interpreter rejects scalar masks)
            pinned = ((s_offs * 0 + slot) >= 0) & ((s_offs * 0 + tl.load(pin_mask + safe * B + b)) != 0)
            tl.store(d_pin_val + (safe * B + b) * H * V * K + h * V * K + s_offs, dS, mask=m_s & pinned)
            dS = tl.where(pinned, 0.0, dS)
            if HAS_G:
                pinned_row = ((offs_v * 0 + slot) >= 0) & ((offs_v * 0 + tl.load(pin_mask + safe * B + b)) != 0)
                acc = tl.where(pinned_row, 0.0, acc)
        du = tl.sum(dS * k_t[None, :], axis=1)  # [BV]
        tl.store(dv + row * V + offs_v, b_t * du, mask=mv)
        tl.store(dm + row * V + offs_v, -b_t * du, mask=mv)
        part = (i_v * B * T * H + row)
        tl.store(dbeta_part + part, tl.sum(du * r_t, axis=0))
        tl.store(dk_part + part * K + offs_k, tl.sum(dS * (b_t * r_t)[:, None], axis=0), mask=mk)
        dS = dS - (b_t * du)[:, None] * k_t[None, :]
        if HAS_G:
            v_t = tl.load(v + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
            acc = acc - b_t * du * v_t
            tl.store(dg_part + part, tl.sum(acc, axis=0))
            dS = dS * tl.exp(tl.load(g + row).to(tl.float32))
    tl.store(d_s0 + i_bh * V * K + s_offs, dS, mask=m_s)


@triton.jit
def _bwd_reverse_channel_kernel(
    q, k, beta, g, r, ckpt, do, d_final, d_states, pin_slot, pin_mask, pin_val, export_slot,
    dv, dm, dk_part, dbeta_part, dg_part, d_pin_val, d_s0, scratch,
    B, T, H, K, V, NE,
    HAS_D_FINAL: tl.constexpr, HAS_PINS: tl.constexpr, HAS_EXPORT: tl.constexpr,
    CK: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):
    """The reverse pass under a channel-wise decay g [B, T, H, K] (module docstring): per block of
    CK steps, last to first, replay D_t into scratch, then walk the block backwards."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // H
    h = i_bh % H
    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    m_s = mv[:, None] & mk[None, :]
    s_offs = offs_v[:, None] * K + offs_k[None, :]
    local = tl.arange(0, BV)[:, None] * BK + offs_k[None, :]  # inside one scratch state [BV, BK]
    mine = scratch + (i_v * B * H + i_bh) * CK * BV * BK
    n_blocks = tl.cdiv(T, CK)
    dS = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_D_FINAL:
        dS = tl.load(d_final + i_bh * V * K + s_offs, mask=m_s, other=0.0).to(tl.float32)
    for i_c in range(n_blocks):
        c = n_blocks - 1 - i_c
        t0 = c * CK
        n = tl.minimum(CK, T - t0)
        S = tl.load(ckpt + (i_bh * n_blocks + c) * V * K + s_offs, mask=m_s, other=0.0)
        for j in range(n):  # replay: D_t into scratch
            t = t0 + j
            row = (b * T + t) * H + h
            S = S * tl.exp(tl.load(g + row * K + offs_k, mask=mk, other=0.0).to(tl.float32))[None, :]
            tl.store(mine + j * BV * BK + local, S)
            k_t = tl.load(k + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
            S = S + (tl.load(beta + row).to(tl.float32) * tl.load(r + row * V + offs_v, mask=mv, other=0.0))[:, None] * k_t[None, :]
            if HAS_PINS:
                slot = tl.load(pin_slot + t)
                safe = tl.maximum(slot, 0)
                pinned = ((s_offs * 0 + slot) >= 0) & ((s_offs * 0 + tl.load(pin_mask + safe * B + b)) != 0)
                P = tl.load(pin_val + (safe * B + b) * H * V * K + h * V * K + s_offs, mask=m_s & pinned, other=0.0)
                S = tl.where(pinned, P, S)
        for jj in range(n):  # backwards through the block
            j = n - 1 - jj
            t = t0 + j
            row = (b * T + t) * H + h
            k_t = tl.load(k + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
            q_t = tl.load(q + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
            b_t = tl.load(beta + row).to(tl.float32)
            r_t = tl.load(r + row * V + offs_v, mask=mv, other=0.0)
            do_t = tl.load(do + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
            dS = dS + do_t[:, None] * q_t[None, :]
            if HAS_EXPORT:
                e = tl.load(export_slot + t)
                base = ((b * NE + tl.maximum(e, 0)) * H + h) * V * K
                dS = dS + tl.load(d_states + base + s_offs, mask=m_s & ((s_offs * 0 + e) >= 0), other=0.0).to(tl.float32)
            if HAS_PINS:
                slot = tl.load(pin_slot + t)
                safe = tl.maximum(slot, 0)
                pinned = ((s_offs * 0 + slot) >= 0) & ((s_offs * 0 + tl.load(pin_mask + safe * B + b)) != 0)
                tl.store(d_pin_val + (safe * B + b) * H * V * K + h * V * K + s_offs, dS, mask=m_s & pinned)
                dS = tl.where(pinned, 0.0, dS)
            du = tl.sum(dS * k_t[None, :], axis=1)  # [BV]
            tl.store(dv + row * V + offs_v, b_t * du, mask=mv)
            tl.store(dm + row * V + offs_v, -b_t * du, mask=mv)
            part = (i_v * B * T * H + row)
            tl.store(dbeta_part + part, tl.sum(du * r_t, axis=0))
            tl.store(dk_part + part * K + offs_k, tl.sum(dS * (b_t * r_t)[:, None], axis=0), mask=mk)
            dS = dS - (b_t * du)[:, None] * k_t[None, :]  # dD_t
            D = tl.load(mine + j * BV * BK + local)
            tl.store(dg_part + part * K + offs_k, tl.sum(dS * D, axis=0), mask=mk)
            dS = dS * tl.exp(tl.load(g + row * K + offs_k, mask=mk, other=0.0).to(tl.float32))[None, :]
    tl.store(d_s0 + i_bh * V * K + s_offs, dS, mask=m_s)


@triton.jit
def _bwd_forward_kernel(
    k, beta, g, r, do, dm, s0, pin_slot, pin_mask, pin_val,
    dk_part, dq_part,
    B, T, H, K, V,
    HAS_G: tl.constexpr, HAS_S0: tl.constexpr, HAS_PINS: tl.constexpr, HAS_GK: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // H
    h = i_bh % H
    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mk = offs_k < K
    mv = offs_v < V
    m_s = mv[:, None] & mk[None, :]
    s_offs = offs_v[:, None] * K + offs_k[None, :]
    S = tl.zeros([BV, BK], dtype=tl.float32)
    if HAS_S0:
        S = tl.load(s0 + i_bh * V * K + s_offs, mask=m_s, other=0.0).to(tl.float32)
    for t in range(T):
        row = (b * T + t) * H + h
        part = (i_v * B * T * H + row)
        k_t = tl.load(k + row * K + offs_k, mask=mk, other=0.0).to(tl.float32)
        b_t = tl.load(beta + row).to(tl.float32)
        r_t = tl.load(r + row * V + offs_v, mask=mv, other=0.0)
        dm_t = tl.load(dm + row * V + offs_v, mask=mv, other=0.0)
        do_t = tl.load(do + row * V + offs_v, mask=mv, other=0.0).to(tl.float32)
        dk_t = tl.load(dk_part + part * K + offs_k, mask=mk, other=0.0)
        if HAS_G:
            S = S * tl.exp(tl.load(g + row).to(tl.float32))
        if HAS_GK:
            S = S * tl.exp(tl.load(g + row * K + offs_k, mask=mk, other=0.0).to(tl.float32))[None, :]
        tl.store(dk_part + part * K + offs_k, dk_t + tl.sum(S * dm_t[:, None], axis=0), mask=mk)
        S = S + (b_t * r_t)[:, None] * k_t[None, :]
        if HAS_PINS:
            slot = tl.load(pin_slot + t)
            safe = tl.maximum(slot, 0)
            # conditions as [BV, BK] tensors (the interpreter rejects scalar masks)
            pinned = ((s_offs * 0 + slot) >= 0) & ((s_offs * 0 + tl.load(pin_mask + safe * B + b)) != 0)
            P = tl.load(pin_val + (safe * B + b) * H * V * K + h * V * K + s_offs,
                        mask=m_s & pinned, other=0.0)
            S = tl.where(pinned, P, S)
        tl.store(dq_part + part * K + offs_k, tl.sum(S * do_t[:, None], axis=0), mask=mk)


CK = 16  # steps per checkpoint block of the channel-wise decay's backward


def _blocks(d_k: int, d_v: int) -> tuple[int, int, int]:
    BK = triton.next_power_of_2(d_k)
    BV = min(triton.next_power_of_2(d_v), 32)
    return BK, BV, triton.cdiv(d_v, BV)


class _DeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, g, s0, pin_val, pin_slot, pin_mask, export_slot, n_export):
        B, T, H, K = k.shape
        V = v.shape[-1]
        BK, BV, NV = _blocks(K, V)
        dev = q.device
        f32 = dict(device=dev, dtype=torch.float32)
        o = torch.empty(B, T, H, V, device=dev, dtype=v.dtype)
        r = torch.empty(B, T, H, V, **f32)
        states = torch.empty(B, max(n_export, 1), H, V, K, **f32)
        s_final = torch.empty(B, H, V, K, **f32)
        dummy = torch.zeros(1, **f32)
        channels = g is not None and g.dim() == 4
        ckpt = torch.empty(B * H, triton.cdiv(T, CK), V, K, **f32) if channels else dummy
        _fwd_kernel[(NV, B * H)](
            q, k, v, beta, g if g is not None else dummy, s0 if s0 is not None else dummy, pin_slot, pin_mask,
            pin_val if pin_val is not None else dummy, export_slot,
            o, r, states, s_final, ckpt, B, T, H, K, V, max(n_export, 1),
            HAS_G=g is not None and not channels, HAS_S0=s0 is not None, HAS_PINS=pin_val is not None,
            HAS_EXPORT=n_export > 0, HAS_GK=channels, CK=CK, BK=BK, BV=BV,
        )
        # a scalar g: the backward's dg recurrence reads v, o, the exports and the final state;
        # a channel-wise g: the checkpoints (in the slot of v)
        decayed = ((ckpt, None, None, None) if channels else (v, o, states, s_final)) if g is not None else (None,) * 4
        ctx.save_for_backward(q, k, beta, g, r, s0, pin_val, pin_slot, pin_mask, export_slot, *decayed)
        ctx.n_export = n_export
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, beta.dtype, None if g is None else g.dtype)
        return o, s_final, states[:, :n_export]

    @staticmethod
    def backward(ctx, d_o, d_final, d_states):
        q, k, beta, g, r, s0, pin_val, pin_slot, pin_mask, export_slot, v, o, states, s_final = ctx.saved_tensors
        B, T, H, K = k.shape
        V = r.shape[-1]
        BK, BV, NV = _blocks(K, V)
        f32 = dict(device=q.device, dtype=torch.float32)
        dummy = torch.zeros(1, **f32)
        n_export = ctx.n_export
        d_o = torch.zeros(B, T, H, V, **f32) if d_o is None else d_o.contiguous()
        has_export = n_export > 0 and d_states is not None
        d_states = d_states.contiguous() if has_export else dummy
        dv = torch.empty(B, T, H, V, **f32)
        dm = torch.empty(B, T, H, V, **f32)
        dk = torch.empty(NV, B, T, H, K, **f32)
        dq = torch.empty(NV, B, T, H, K, **f32)
        dbeta = torch.empty(NV, B, T, H, **f32)
        dg = torch.empty(NV, B, T, H, **f32) if g is not None else dummy
        d_pin_val = torch.zeros_like(pin_val, dtype=torch.float32) if pin_val is not None else dummy
        d_s0 = torch.empty(B, H, V, K, **f32)
        channels = g is not None and g.dim() == 4
        if channels:
            dg = torch.empty(NV, B, T, H, K, **f32)
            scratch = torch.empty(NV * B * H * CK * BV * BK, **f32)
            _bwd_reverse_channel_kernel[(NV, B * H)](
                q, k, beta, g, r, v, d_o, d_final.contiguous() if d_final is not None else dummy, d_states,
                pin_slot, pin_mask, pin_val if pin_val is not None else dummy, export_slot,
                dv, dm, dk, dbeta, dg, d_pin_val, d_s0, scratch, B, T, H, K, V, max(n_export, 1),
                HAS_D_FINAL=d_final is not None, HAS_PINS=pin_val is not None, HAS_EXPORT=has_export,
                CK=CK, BK=BK, BV=BV,
            )
        with_g = [x if x is not None else dummy for x in (g, v, o, states, s_final)]
        if not channels:
            _bwd_reverse_kernel[(NV, B * H)](
                q, k, with_g[1], beta, with_g[0], r, *with_g[2:], d_o,
                d_final.contiguous() if d_final is not None else dummy, d_states, pin_slot, pin_mask, export_slot,
                dv, dm, dk, dbeta, dg, d_pin_val, d_s0, B, T, H, K, V, max(n_export, 1),
                HAS_G=g is not None, HAS_D_FINAL=d_final is not None, HAS_PINS=pin_val is not None,
                HAS_EXPORT=has_export, BK=BK, BV=BV,
            )
        _bwd_forward_kernel[(NV, B * H)](
            k, beta, with_g[0], r, d_o, dm, s0 if s0 is not None else dummy, pin_slot, pin_mask,
            pin_val if pin_val is not None else dummy, dk, dq, B, T, H, K, V,
            HAS_G=g is not None and not channels, HAS_S0=s0 is not None, HAS_PINS=pin_val is not None,
            HAS_GK=channels, BK=BK, BV=BV,
        )
        dq_t, dk_t, dv_t, dbeta_t, dg_t = ctx.dtypes
        return (
            dq.sum(0).to(dq_t), dk.sum(0).to(dk_t), dv.to(dv_t), dbeta.sum(0).to(dbeta_t),
            dg.sum(0).to(dg_t) if g is not None else None,
            d_s0 if s0 is not None else None,
            d_pin_val if pin_val is not None else None,
            None, None, None, None,
        )


def delta_rule_triton(q, k, v, beta, g, state, export, pin_list):
    """Entry from models.kernels.delta_rule (arguments already checked, beta already clamped).

    g [B, T, H] | [B, T, H, K] | None: the log decay; state [B, H, V, K] | None; export: list of step indices | None; pin_list: [(t, mask [B],
    values [B, H, V, K])]. Returns (o [B, T, H, V], final [B, H, V, K], states | None).
    """
    B, T, H, K = k.shape
    dev = q.device
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    g = None if g is None else g.contiguous()
    s0 = None if state is None else state.to(torch.float32).contiguous()
    pin_slot = torch.full((T,), -1, dtype=torch.int32, device=dev)
    if pin_list:
        for p, (t, _, _) in enumerate(pin_list):
            pin_slot[t] = p
        pin_mask = torch.stack([m.to(torch.int32) for _, m, _ in pin_list]).to(dev).contiguous()
        pin_val = torch.stack([x.to(torch.float32) for _, _, x in pin_list]).to(dev).contiguous()
    else:
        pin_mask, pin_val = torch.zeros(1, dtype=torch.int32, device=dev), None
    unique = sorted(set(export or ()))
    export_slot = torch.full((T,), -1, dtype=torch.int32, device=dev)
    for slot, t in enumerate(unique):
        export_slot[t] = slot
    o, final, states = _DeltaRuleFunction.apply(
        q, k, v, beta, g, s0, pin_val, pin_slot, pin_mask, export_slot, len(unique)
    )
    if export is None:
        return o, final, None
    order = torch.tensor([unique.index(t) for t in export], dtype=torch.long, device=dev)
    return o, final, states.index_select(1, order)
