"""The RWKV-7 recurrence as plain-C loops on the CPU, forward and checkpointed backward:
models.kernels.rwkv7's impl="native".

Per batch row and head, with the state S_t [V, K] (values x keys; see models/kernels/rwkv7.py):

    S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T (+ shift_t; or the pin),   o_t = S_t r_t

`rwkv7_forward` runs the loop (rwkv7_body.h: one pass over the state per step, kept transposed
[K, V] so every product is an axpy), exporting every state, adding a shift and applying pins
where asked. `RWKV7Scan` differentiates it in r, w, k, v, a, b, the initial state, the shift and
the pin values, through the outputs, the final state and the exported states: the forward keeps
the state entering every k-th step (checkpoints); the backward recomputes one span of k states at
a time from them, with the same shift and pins, bit for bit the forward's (the same C loop), and
walks the adjoint G_t = dL/dS_t back over them (the reverse recurrence and every gradient in
rwkv7_body.h), one (batch row, head) pair at a time, those pairs shared among
library.threads_for(...) threads. The results are the same bits for any spacing and thread count.

Memory (library.py's model with one head of one batch row as its row: S = V K element bytes, w = 1,
the span holds the states S_{t0-1} .. S_{t1-1}; the removed values S_{t-1} a_t [V] a step beside
them): the forward keeps B H ceil(T / k) S bytes of checkpoints until the backward, k =
rwkv7_spacing (CHUNK where k + 1 states fit SPAN_BYTES, else about sqrt(B H T / threads)), at most
(sqrt(B H T threads) + B H) S; the backward adds threads (k + 3) S bytes of span buffers. At
B 1, T 512, H 12, K V 64 float32 (S 16 KiB), one thread: k = 79, 84 checkpoints (1.3 MiB) and an
82-state span (1.3 MiB), against the 512 x 12 states (96 MiB) autograd keeps through the torch
loop. What is inherent: the inputs and their gradients, and with export_at="all" the exported
states and their cotangent; shift's and the pin values' gradients [B, T, H, V, K] only where asked.
"""

from __future__ import annotations

import torch

from models.kernels.native.library import SUFFIX, I, P, empty, function, ptr, span_spacing, threads_for

CHUNK = 64  # the longest cache-sized span (library.span_spacing's chunk)
_FWD = [I, I, I, I, I] + [P] * 12 + [I, P, P]
_BWD = [I, I, I, I, I] + [P] * 9 + [I] + [P] * 14 + [I]


def rwkv7_threads(batch: int, length: int, heads: int, d_k: int, d_v: int, itemsize: int) -> int:
    """The backward's threads: library.threads_for the bytes of every state it walks."""
    return threads_for(batch * length * heads * d_k * d_v * itemsize)


def rwkv7_spacing(batch: int, length: int, heads: int, d_k: int, d_v: int, itemsize: int, threads: int) -> int:
    """Steps between checkpoints: library.span_spacing with one head's state (V K elements) as a
    step and the B H (batch row, head) pairs as rows, one state a recomputed step."""
    return span_spacing(CHUNK, d_k * d_v * itemsize, 1, batch * heads, length, threads)


def rwkv7_forward(r, w, k, v, a, b, state, export: bool, shift, mask, values, every: int = 1,
                  checkpoints: bool = False):
    """The C forward (no autograd): r, w, k, a, b [B, T, H, K], v [B, T, H, V], state [B, H, V, K],
    shift and values [B, T, H, V, K] or None, mask [B, T] bool or None, all contiguous, one dtype in
    (float32, float64), CPU -> (o [B, T, H, V], final state [B, H, V, K], states [B, T, H, V, K]
    or None, checkpoints [B, H, ceil(T / every), K, V] or None)."""
    batch, length, heads, d_k = r.shape
    d_v = v.shape[-1]
    final = state.clone()
    output = empty((batch, length, heads, d_v), v)
    states = empty((batch, length, heads, d_v, d_k), v) if export else None
    ckpt = empty((batch, heads, -(-length // every), d_k, d_v), v) if checkpoints else None
    work = v.new_empty(heads * (d_k * d_v + 2 * d_v + d_k))
    function(f"rwkv7_fwd_{SUFFIX[v.dtype]}", _FWD)(
        batch, length, heads, d_k, d_v, ptr(r), ptr(w), ptr(k), ptr(v), ptr(a), ptr(b), ptr(final), ptr(output),
        ptr(states), ptr(shift), ptr(mask), ptr(values), every, ptr(ckpt), ptr(work))
    return output, final, states, ckpt


def rwkv7_backward(r, w, k, v, a, b, shift, mask, values, ckpt, every: int, threads: int, g_out, g_states,
                   g_final, need_shift: bool, need_values: bool):
    """Gradients (r, w, k, v, a, b, initial state, shift | None, values | None) of rwkv7_forward's
    outputs from its checkpoints, given the cotangents of o, the exported states and the final
    state (each None: zero)."""
    batch, length, heads, d_k = r.shape
    d_v = v.shape[-1]
    g_out, g_states, g_final = (None if g is None else g.to(v.dtype).contiguous() for g in (g_out, g_states, g_final))
    grads = [empty(x.shape, x) for x in (r, w, k, v, a, b)]
    grad_h0 = v.new_empty(batch, heads, d_v, d_k)
    grad_shift = empty((batch, length, heads, d_v, d_k), v) if need_shift else None
    grad_values = torch.zeros(batch, length, heads, d_v, d_k, dtype=v.dtype) if need_values else None
    span = min(every, length)
    work = empty((threads, (span + 3) * d_k * d_v + (span + 8) * d_v + d_k), v)
    dr, dw, dk, dv, da, db = grads
    function(f"rwkv7_bwd_{SUFFIX[v.dtype]}", _BWD)(
        batch, length, heads, d_k, d_v, ptr(r), ptr(w), ptr(k), ptr(v), ptr(a), ptr(b), ptr(shift), ptr(mask),
        ptr(values), every, ptr(ckpt), ptr(g_out), ptr(g_states), ptr(g_final), ptr(dr), ptr(dw), ptr(dk), ptr(dv),
        ptr(da), ptr(db), ptr(grad_h0), ptr(grad_shift), ptr(grad_values), ptr(work), threads)
    return (*grads, grad_h0, grad_shift, grad_values)


class RWKV7Scan(torch.autograd.Function):
    """rwkv7_forward with the checkpointed C backward: (r, w, k, v, a, b, h0, shift | None,
    values | None, mask | None, export) -> (o, final state, states or an empty tensor)."""

    @staticmethod
    def forward(ctx, r, w, k, v, a, b, h0, shift, values, mask, export):
        batch, length, heads, d_k = r.shape
        d_v, itemsize = v.shape[-1], v.element_size()
        threads = rwkv7_threads(batch, length, heads, d_k, d_v, itemsize)
        every = rwkv7_spacing(batch, length, heads, d_k, d_v, itemsize, threads)
        o, final, states, ckpt = rwkv7_forward(r, w, k, v, a, b, h0, export, shift, mask, values, every, True)
        ctx.save_for_backward(r, w, k, v, a, b, shift, mask, values, ckpt)
        ctx.every, ctx.threads = every, threads
        ctx.set_materialize_grads(False)  # an unused output's cotangent stays None (NULL in C)
        return o, final, (states if export else v.new_zeros(0))

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, g_out, g_final, g_states):
        r, w, k, v, a, b, shift, mask, values, ckpt = ctx.saved_tensors
        need = ctx.needs_input_grad
        if g_states is not None and g_states.numel() == 0:
            g_states = None
        grads = rwkv7_backward(r, w, k, v, a, b, shift, mask, values, ckpt, ctx.every, ctx.threads, g_out, g_states,
                               g_final, need[7], need[8])
        return (*(g if wanted else None for g, wanted in zip(grads, need)), None, None)
