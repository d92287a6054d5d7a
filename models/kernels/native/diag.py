"""The diagonal scan as a plain-C loop on the CPU: diag_scan's impl="native" segment function.

    h_t = a_t * h_{t-1} + b_t,   y_t[l] = sum_n c_t[l, n] h_t[l, n]     (see diag_scan.py)

The C code (diag_body.h: no torch headers) walks each batch row through time over contiguous
[T, M] memory, updating the state in place in cache; with a read-out it writes only y. The rows
(or, where the thread count does not divide them, blocks of channels; not in a backward that
sums grad c over the lead rows) are shared among library.threads_for(...) threads:
torch.get_num_threads() for inputs of a few MiB and more. The results are bit-equal for any count.
When a gradient can flow the forward also keeps the state entering every s-th step (checkpoints,
[B, ceil(T / s), *S], 1/s of the inputs' size; s = checkpoint_spacing: chunk_size where s states
and adjoints fit SPAN_BYTES, else about sqrt(B T / (2 threads)) steps). The backward recomputes
the states of one checkpoint span at a time into a span buffer per thread, walks the adjoint back over them
(g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}, kept in cache too, grad c_t = gy_t conj(h_t) beside it,
while the next span's a and c are prefetched), then copies grad b_t = g_t, grad a_t =
g_t conj(h_{t-1}) and grad c_t out in ascending order with streaming stores (the fresh gradient
tensors are not read for ownership) while the next span's b is prefetched; grad h_{-1} = conj(a_0) g_0. Its memory traffic is one read
of a, b, c, gy and the checkpoints and one write of the gradients (benchmarks/bandwidth.py). Same association order as the naive loop (results agree to rounding
of the read-out sums). Dtypes: float32, float64, complex64, complex128 (complex as interleaved
(re, im) pairs, torch's layout).

Memory (library.py's model, span factor 2, one step's state S = prod(*S) element bytes): the
checkpoints kept from forward to backward take at most (sqrt(2 B T threads) + B) S bytes (the old
cache-only spacing kept all B T states once S passed SPAN_BYTES / 2), the backward's span buffers
threads 3 k S, at most about threads SPAN_BYTES + 1.5 sqrt(2 B T threads) S. What is inherent:
a, b (and c) are [B, T, *S] inputs and the backward writes grad a and grad b of their size.
"""

from __future__ import annotations

import math

import torch

from models.kernels.native.library import SUFFIX, I, P, empty, function, ptr, span_spacing, threads_for

DTYPES = tuple(SUFFIX)
_FWD = [I, I, I, I, P, P, P, I, P, P, P, P, P, I, I, P, I]
_BWD = [I, I, I, I, P, P, P, I, P, I, P, P, P, P, I, P, P, P, P, P, I]


def _geometry(a: torch.Tensor, c: torch.Tensor | None) -> tuple[int, int, int, int, int]:
    """(B, T, L, N, c_lead_stride): S = (*lead, N) flattened to L x N; c shared (0) or full (N)."""
    batch, length, n = a.shape[0], a.shape[1], a.shape[-1]
    lead = math.prod(a.shape[2:-1])
    return batch, length, lead, n, (0 if c is None or c.dim() != a.dim() else n)


def _slots(export_idx: torch.Tensor | None, length: int):
    """Step -> export slot ([T] int64, -1 where none), the unique sorted steps, and for each asked
    index its slot (so repeats and any order come from one stored state per step; None when the
    asked indices are already sorted and unique)."""
    if export_idx is None:
        return None, None, None
    steps, where = torch.unique(export_idx.cpu(), sorted=True, return_inverse=True)
    slot = torch.full((length,), -1, dtype=torch.int64)
    slot[steps] = torch.arange(len(steps))
    return slot, steps, None if torch.equal(where, torch.arange(len(where))) else where


def _threads(threads: int | None, a: torch.Tensor) -> int:
    """The thread count for a call on inputs like a (a and b: the bulk of the traffic)."""
    return threads_for(2 * a.numel() * a.element_size()) if threads is None else threads


def forward(a, b, c, h0, export_idx, chunk, store_all: bool = False, checkpoints: bool = True,
            threads: int | None = None):
    """a, b [B, T, *S], c None | [B, T, N] | [B, T, *S], h0 [B, *S] (one dtype in DTYPES, CPU)
    -> (y [B, T, *lead] | None, hs [B, T, *S] | None, final [B, *S], exported [B, K, *S] | None,
    checkpoints [B, ceil(T / chunk), *S] | None). threads: None = threads_for(the inputs' bytes)."""
    a, b, c = a.contiguous(), b.contiguous(), None if c is None else c.contiguous()
    batch, length, lead, n, c_stride = _geometry(a, c)
    state = a.shape[2:]
    final = h0.contiguous().clone()
    y = None if c is None else a.new_empty(batch, length, *state[:-1])
    hs = empty(a.shape, a) if store_all else None
    slot, steps, where = _slots(export_idx, length)
    unique = None if slot is None else empty((batch, len(steps), *state), a)
    ckpt = empty((batch, -(-length // chunk), *state), a) if checkpoints else None
    function(f"scan_fwd_{SUFFIX[a.dtype]}", _FWD)(
        batch, length, lead, n, ptr(a), ptr(b), ptr(c), c_stride, ptr(final), ptr(y), ptr(hs),
        ptr(slot), ptr(unique), 0 if steps is None else len(steps), chunk, ptr(ckpt),
        _threads(threads, a),
    )
    exported = unique if where is None else unique.index_select(1, where)
    return y, hs, final, exported, ckpt


def backward(a, b, c, ckpt, chunk, g_out, g_final, g_exported, export_idx, need_c: bool,
             threads: int | None = None):
    """Gradients (a, b, c | None, h0) of forward's outputs given their cotangents (None: zero);
    threads as in forward."""
    a, b, c = a.contiguous(), b.contiguous(), None if c is None else c.contiguous()
    batch, length, lead, n, c_stride = _geometry(a, c)
    grad_a, grad_b = empty(a.shape, a), empty(a.shape, a)
    grad_h0 = a.new_empty(batch, *a.shape[2:])
    grad_c = empty(c.shape, c) if (need_c and c is not None and g_out is not None) else None
    slot, steps, where = _slots(export_idx if g_exported is not None else None, length)
    g_unique = None
    if slot is not None:  # cotangents of repeated indices add up on one stored step
        g_unique = g_exported.contiguous() if where is None else (
            a.new_zeros(batch, len(steps), *a.shape[2:]).index_add_(1, where, g_exported))
    g_out = None if g_out is None else g_out.contiguous()
    g_final = None if g_final is None else g_final.contiguous()
    threads = _threads(threads, a)
    work = empty((threads, 3 * min(chunk, length), *a.shape[2:]), a)  # see scan_bwd in the C code
    function(f"scan_bwd_{SUFFIX[a.dtype]}", _BWD)(
        batch, length, lead, n, ptr(a), ptr(b), ptr(c), c_stride, ptr(ckpt), chunk,
        ptr(g_out), ptr(g_final), ptr(slot), ptr(g_unique), 0 if steps is None else len(steps),
        ptr(grad_a), ptr(grad_b), ptr(grad_c), ptr(grad_h0), ptr(work), threads,
    )
    return grad_a, grad_b, grad_c, grad_h0


def checkpoint_spacing(chunk: int, a: torch.Tensor, threads: int | None = None) -> int:
    """Steps between checkpoints (library.span_spacing with one step's state *S and the backward's
    states and adjoints, 2 a step per thread; the work buffer holds a third, grad c's rows): chunk
    where that span fits SPAN_BYTES, else the fewest steps that keep the checkpoints within
    (sqrt(2 B T threads) + B) states and the span buffers within threads (3 k) states.
    threads: the backward's (None: as backward picks them for a)."""
    step = math.prod(a.shape[2:]) * a.element_size()
    return span_spacing(chunk, max(1, step), 2, a.shape[0], a.shape[1], _threads(threads, a))


def segment(a, b, c, h0, export_idx, chunk):
    """diag_scan's segment function (the signature of its chunked one): NativeScan when a
    gradient can flow, else the forward alone (no checkpoints kept)."""
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (a, b, c, h0)):
        return NativeScan.apply(a, b, c, h0, export_idx, chunk)
    y, hs, final, exported, _ = forward(a, b, c, h0, export_idx, chunk, store_all=c is None, checkpoints=False)
    return (hs if c is None else y), final, exported


class NativeScan(torch.autograd.Function):
    """The segment function of diag_scan (the signature of its chunked one); chunk bounds the
    checkpoint spacing of the backward (checkpoint_spacing)."""

    @staticmethod
    def forward(ctx, a, b, c, h0, export_idx, chunk):
        spacing = checkpoint_spacing(chunk, a)
        y, hs, final, exported, ckpt = forward(a, b, c, h0, export_idx, spacing, store_all=c is None)
        ctx.save_for_backward(a, b, c, ckpt, export_idx)
        ctx.chunk = spacing
        return (hs if c is None else y), final, (a.new_zeros(0) if exported is None else exported)

    @staticmethod
    def backward(ctx, g_out, g_final, g_exported):
        a, b, c, ckpt, export_idx = ctx.saved_tensors
        grad_a, grad_b, grad_c, grad_h0 = backward(
            a, b, c, ckpt, ctx.chunk, g_out, g_final, g_exported if export_idx is not None else None,
            export_idx, ctx.needs_input_grad[2],
        )
        return grad_a, grad_b, grad_c, grad_h0, None, None
