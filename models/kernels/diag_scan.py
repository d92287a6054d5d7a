"""Diagonal affine scan with state export and state patches (pins).

    h_t = a_t * h_{t-1} + b_t          h_{-1} = initial_state (zeros when None)
    y_t = sum_n c_t[..., n] h_t[..., n]    (optional read-out; `D x` is added by the caller)

Shapes (batch-first): a, b [B, T, *S] (real or complex, S = (*lead, N)); c None, [B, T, N]
(shared across the lead dims, Mamba's C) or [B, T, *S]; initial_state [B, *S]. a, b, c,
initial_state and pin values are promoted to one dtype (complex when any of a, b, c is), which is
the dtype of every result.

    diag_scan(a, b, c=None, *, initial_state=None, output_final_state=False, export_at=None,
              pins=None, patches=None, impl="auto", chunk_size=64)
      -> ScanOutput(output, final_state, states_at)

  output       c is None: the states h [B, T, *S]; else the read-out y [B, T, *lead]
  final_state  h_{T-1} [B, *S] when output_final_state, else None
  states_at    h at the steps `export_at` [B, K, *S], else None; export_at is None, "all" (every
               step), "chunks" (every chunk end: chunk_size - 1, 2 chunk_size - 1, ...) or step
               indices in [-T, T) (a sequence or 1-D integer tensor; any order, repeats allowed)
  pins         (mask [B, T] bool, values [B, T, *S]): where mask[b, t], the state after step t is
               replaced by values[b, t]; the read-out at t and every later step use the new state
  patches      {t: new_state [B, *S] or [*S] (every row the same)}: the state after step t is
               replaced in every batch row (converted to pins; give pins or patches, not both)
  impl         "naive"   the sequential loop, the definition (autograd through the loop)
               "chunked" pure torch, parallel across chunks (below), custom backward
               "native"  a plain-C loop on the CPU, one pass over the inputs, custom backward
                         (models/kernels/native/diag.py: float32/64, complex64/128; compiled
                         once per machine with the system C compiler; raises ValueError when
                         there is none)
               "triton"  GPU kernel (models/kernels/triton_diag_scan.py), real dtypes
               "auto"    triton for CUDA tensors of a real dtype; on the CPU native when it
                         is built and supports the dtype, else chunked (also when every state
                         is requested; see benchmarks/RESULTS.md)
  chunk_size   chunked: the chunk length; native: the backward's checkpoint spacing (the
               state entering every chunk_size-th step is kept; no effect on results)

Chunked algorithm (choice and numeric limits). Mamba's transition is diagonal per (channel,
state) pair, so the segment-sum ("attention") form used for scalar decays would need an
[L, L] decay matrix per state element, L times the state memory; and the cumulative log-decay
form exp(L_t - L_s) leaves the float32 range for |a| near 0 (log 0 = -inf) and needs a sign or
phase for negative and complex a. We therefore use exact products only: the sequence is cut into
chunks of length L; pass 1 runs the within-chunk recurrence from a zero start as L vectorised
steps over all chunks at once, keeping only each chunk's end state; the chunk transitions
prod_k a_k and these end states form a diagonal scan of length T/L, solved recursively (so the
depth is about L log_L T instead of T); pass 2 reruns the L vectorised steps from the true chunk
starts and writes every state. (So the parallelism is across chunks, not inside them; the
work is about twice the loop's.) No logarithm, division or exponent appears, so a = 0, negative
and complex a are exact up to float rounding (the association order differs from the loop, so
results agree to a few ulps times the growth of the recurrence; |a| > 1 over long spans overflows
like the loop does). The backward pass recomputes the states (nothing [B, T, *S] is kept for
autograd when a read-out c is given) and runs the same scan in reverse for the adjoint:
g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}, grad a_t = g_t conj(h_{t-1}), grad b_t = g_t.
Backward memory of `chunked`: a, b are [B, T, *S] inputs and grad a, grad b outputs of their
size (inherent); autograd keeps only the inputs, and the backward holds about five [B, T, *S]
tensors at its peak (the recomputed states, the direct and total adjoints, the shifted a, grad a).
`native` keeps sqrt(B T)-spaced checkpoints instead (models/kernels/native/diag.py, library.py).
Pins split the sequence: the chunked scan runs up to the pinned step, the pinned step itself is
one explicit step with the replacement, and the scan resumes from the pinned state.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import torch

from models.kernels.scan_grads import direct_state_grad, readout_grad_c

IMPLS = ("auto", "naive", "chunked", "native", "triton")


class ScanOutput(NamedTuple):
    output: torch.Tensor  # states [B, T, *S] or read-out [B, T, *lead]
    final_state: torch.Tensor | None  # [B, *S]
    states_at: torch.Tensor | None  # [B, K, *S]


# ----------------------------------------------------------------------------- argument checks


def _shape(x) -> object:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def _check_inputs(a, b, c, initial_state, impl, chunk_size) -> None:
    if not isinstance(a, torch.Tensor) or a.dim() < 3:
        raise ValueError(f"a must be a [B, T, *S] tensor with at least one state dim; got {_shape(a)}")
    if not isinstance(b, torch.Tensor) or b.shape != a.shape:
        raise ValueError(f"b must be a tensor of a's shape {tuple(a.shape)}; got {_shape(b)}")
    if a.shape[1] < 1:
        raise ValueError(f"a must have at least one time step; got shape {tuple(a.shape)}")
    batch, length, n = a.shape[0], a.shape[1], a.shape[-1]
    if c is not None and (
        not isinstance(c, torch.Tensor)
        or (tuple(c.shape) != (batch, length, n) and c.shape != a.shape)
    ):
        raise ValueError(
            f"c must be None, a [B, T, N]={batch, length, n} or a [B, T, *S]={tuple(a.shape)} "
            f"tensor; got {_shape(c)}"
        )
    state = (batch, *a.shape[2:])
    if initial_state is not None and (
        not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != state
    ):
        raise ValueError(f"initial_state must be None or a [B, *S]={state} tensor; got {_shape(initial_state)}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 2:
        raise ValueError(f"chunk_size must be an int >= 2; got {chunk_size!r}")


def _export_index(export_at, length: int, chunk: int, device) -> torch.Tensor | None:
    """export_at (None, "all", "chunks", ints or a 1-D integer tensor in [-T, T)) -> LongTensor [K]."""
    if export_at is None:
        return None
    if isinstance(export_at, str):
        if export_at not in ("all", "chunks"):
            raise ValueError(f"export_at must be None, 'all', 'chunks' or step indices; got {export_at!r}")
        start = 0 if export_at == "all" else chunk - 1  # no chunk ends (empty) when T < chunk
        return torch.arange(start, max(start, length), 1 if export_at == "all" else chunk, device=device)
    if isinstance(export_at, torch.Tensor):
        if export_at.dim() != 1 or export_at.dtype.is_floating_point or export_at.is_complex():
            raise ValueError(f"export_at must be a 1-D integer tensor or a sequence of ints; got {export_at!r}")
        idx = export_at.to(device=device, dtype=torch.long)
    else:
        if isinstance(export_at, int) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in export_at
        ):
            raise ValueError(f"export_at must be None, 'all', 'chunks' or a sequence of ints; got {export_at!r}")
        idx = torch.tensor(list(export_at), dtype=torch.long, device=device)
    if idx.numel() and (int(idx.min()) < -length or int(idx.max()) >= length):
        raise ValueError(f"export_at indices must lie in [-T, T) = [{-length}, {length}); got {export_at!r}")
    return idx % length


def _as_pins(pins, patches, a: torch.Tensor):
    """pins or patches -> (mask [B, T] bool, values [B, T, *S]) or None."""
    batch, length = a.shape[:2]
    state = tuple(a.shape[2:])
    if pins is not None and patches is not None:
        raise ValueError("give pins or patches, not both")
    if patches is not None:
        if not isinstance(patches, dict):
            raise TypeError(f"patches must be a dict {{t: state [B, *S]}}; got {type(patches).__name__}")
        mask = torch.zeros(batch, length, dtype=torch.bool, device=a.device)
        rows = [torch.zeros(batch, *state, dtype=a.dtype, device=a.device)] * length
        for t, value in patches.items():
            if not isinstance(t, int) or not -length <= t < length:
                raise ValueError(f"patches keys must be ints in [-T, T) = [{-length}, {length}); got {t!r}")
            if not isinstance(value, torch.Tensor) or tuple(value.shape) not in ((batch, *state), state):
                raise ValueError(f"patches[{t}] must be a [B, *S]={(batch, *state)} or [*S]={state} tensor; "
                                 f"got {_shape(value)}")
            mask[:, t % length] = True
            rows[t % length] = value.expand(batch, *state)
        return mask, torch.stack(rows, dim=1)
    if pins is None:
        return None
    if not isinstance(pins, (tuple, list)) or len(pins) != 2:
        raise ValueError(f"pins must be a (mask [B, T], values [B, T, *S]) pair; got {type(pins).__name__}")
    mask, values = pins
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (batch, length):
        raise ValueError(f"pins mask must be a bool [B, T]={(batch, length)} tensor; got {_shape(mask)}")
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != tuple(a.shape):
        raise ValueError(f"pins values must be a [B, T, *S]={tuple(a.shape)} tensor; got {_shape(values)}")
    return mask, values


# ----------------------------------------------------------------------------- read-out


def _readout(h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """h [B, T, *S], c [B, T, N] or [B, T, *S] -> y [B, T, *lead]."""
    if c.dim() != h.dim():  # shared over the lead dims: a batched mat-vec, no [B, T, *S] temporary
        flat = h.reshape(*h.shape[:2], -1, h.shape[-1])  # [B, T, lead, N]
        return (flat @ c[..., None]).reshape(h.shape[:-1])
    return (h * c).sum(-1)


# ----------------------------------------------------------------------------- naive


def _naive(a, b, c, h0, export_idx, pins):
    h = h0
    states = []
    steps = zip(a.unbind(1), b.unbind(1))  # views whose backward is one stack, not T scatters
    pin_steps = zip(pins[0].unbind(1), pins[1].unbind(1)) if pins is not None else None
    for a_t, b_t in steps:
        h = a_t * h + b_t  # [B, *S]
        if pin_steps is not None:
            mask, value = next(pin_steps)
            h = torch.where(mask.reshape(-1, *([1] * (h.dim() - 1))), value, h)
        states.append(h)
    hs = torch.stack(states, dim=1)  # [B, T, *S]
    out = hs if c is None else _readout(hs, c)
    exported = None if export_idx is None else hs.index_select(1, export_idx)
    return out, hs[:, -1], exported


# ----------------------------------------------------------------------------- chunked core


def scan_states(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int, reverse: bool = False) -> torch.Tensor:
    """All states of h_t = a_t h_{t-1} + b_t without autograd: a, b [B, T, M], h0 [B, M] -> [B, T, M].

    reverse: h_t = a_t h_{t+1} + b_t from h_T = h0 (the adjoint direction).
    """
    batch, length, width = a.shape
    out = torch.empty_like(b)
    n_chunks = length // chunk
    if n_chunks < 2:  # short: the loop
        _loop(a, b, h0, out, range(length - 1, -1, -1) if reverse else range(length))
        return out
    main = n_chunks * chunk  # full chunks; the remaining tail steps run as a loop
    lo = length - main if reverse else 0
    a4 = a[:, lo : lo + main].reshape(batch, n_chunks, chunk, width)
    b4 = b[:, lo : lo + main].reshape(batch, n_chunks, chunk, width)
    out4 = out[:, lo : lo + main].view(batch, n_chunks, chunk, width)
    order = range(chunk - 1, -1, -1) if reverse else range(chunk)
    end = b4[:, :, order[0]]  # pass 1: every chunk's end state from a zero start, all chunks at once
    for k in order[1:]:
        end = torch.addcmul(b4[:, :, k], a4[:, :, k], end)  # [B, nC, M]
    ends = scan_states(a4.prod(dim=2), end, h0, chunk, reverse)  # [B, nC, M] true chunk-end states
    if reverse:  # the state entering each chunk
        h = torch.cat([ends[:, 1:], h0[:, None]], dim=1)
    else:
        h = torch.cat([h0[:, None], ends[:, :-1]], dim=1)
    for k in order:  # pass 2: every state, from the true chunk starts
        h = torch.addcmul(b4[:, :, k], a4[:, :, k], h)
        out4[:, :, k] = h
    if reverse:
        _loop(a, b, ends[:, 0], out, range(lo - 1, -1, -1))
    else:
        _loop(a, b, ends[:, -1], out, range(main, length))
    return out


def _loop(a, b, h, out, steps) -> None:
    for t in steps:
        h = torch.addcmul(b[:, t], a[:, t], h)
        out[:, t] = h


def _reverse_adjoint(a, g_direct, chunk):
    """g_t = g_direct_t + conj(a_{t+1}) g_{t+1}, all [B, T, M]."""
    a_next = torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], dim=1).conj()
    zero = g_direct.new_zeros(g_direct.shape[0], g_direct.shape[2])
    return scan_states(a_next, g_direct, zero, chunk, reverse=True)


class _ChunkedScan(torch.autograd.Function):
    """(a, b [B,T,*S], c [B,T,N] | [B,T,*S] | None, h0 [B,*S], export [K] | None)
    -> (output, final state [B,*S], exported [B,K,*S] (empty when none))."""

    @staticmethod
    def forward(ctx, a, b, c, h0, export_idx, chunk):
        shape = a.shape
        flat = lambda x: x.reshape(shape[0], shape[1], -1)  # noqa: E731
        hs = scan_states(flat(a), flat(b), h0.reshape(shape[0], -1), chunk).reshape(shape)
        out = hs if c is None else _readout(hs, c)
        exported = hs.index_select(1, export_idx) if export_idx is not None else hs.new_zeros(0)
        ctx.save_for_backward(a, b, c, h0, export_idx)
        ctx.chunk = chunk
        return out, hs[:, -1].clone(), exported

    @staticmethod
    def backward(ctx, g_out, g_final, g_exported):
        a, b, c, h0, export_idx = ctx.saved_tensors
        shape = a.shape
        flat = lambda x: x.reshape(shape[0], shape[1], -1)  # noqa: E731
        hs = scan_states(flat(a), flat(b), h0.reshape(shape[0], -1), ctx.chunk).reshape(shape)
        g_direct = direct_state_grad(g_out, g_final, g_exported, c, hs, export_idx)
        g = _reverse_adjoint(flat(a), flat(g_direct), ctx.chunk).reshape(shape)  # dL/dh_t (total)
        grad_a = torch.empty_like(g)  # g_t conj(h_{t-1})
        torch.mul(g[:, 1:], hs[:, :-1].conj(), out=grad_a[:, 1:])
        grad_a[:, 0] = g[:, 0] * h0.conj()
        grad_c = readout_grad_c(g_out, c, hs) if ctx.needs_input_grad[2] else None
        return grad_a, g, grad_c, a[:, 0].conj() * g[:, 0], None, None


def segmented(segment_fn, a, b, c, h0, export_idx, pins, chunk):
    """Split at pinned steps: segment_fn (an autograd Function's apply, the signature of
    _ChunkedScan) up to the pin, one explicit pinned step, resume from the pinned state."""
    length = a.shape[1]
    pinned = [] if pins is None else torch.nonzero(pins[0].any(0)).flatten().tolist()
    wanted = None if export_idx is None else export_idx.tolist()
    # the steps cut once into the segments and pinned steps (split, whose backward is one cat:
    # indexing a step at a time would form a [B, T, *S] gradient per pinned step, O(T^2))
    bounds = sorted({0, length, *pinned, *(t + 1 for t in pinned)})
    sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:])]
    cut = lambda x: dict(zip(bounds, x.split(sizes, dim=1)))  # noqa: E731  first step -> [B, n, ...]
    a_at, b_at = cut(a), cut(b)
    c_at = None if c is None else cut(c)
    values_at = None if pins is None else cut(pins[1])
    outs, pieces, times = [], [], []  # exported states [B, k, *S] and the steps they belong to
    h, start = h0, 0
    for stop in pinned + [length]:
        if stop > start:  # steps [start, stop) in one kernel call
            local = [] if wanted is None else sorted({t - start for t in wanted if start <= t < stop})
            idx = torch.tensor(local, dtype=torch.long, device=a.device) if local else None
            c_seg = None if c is None else c_at[start]
            out, h, exported = segment_fn(a_at[start], b_at[start], c_seg, h, idx, chunk)
            outs.append(out)
            if local:
                pieces.append(exported)
                times += [start + t for t in local]
        if stop < length:  # the pinned step itself
            h = a_at[stop][:, 0] * h + b_at[stop][:, 0]
            mask = pins[0][:, stop].reshape(-1, *([1] * (h.dim() - 1)))
            h = torch.where(mask, values_at[stop][:, 0], h)
            outs.append(h[:, None] if c is None else _readout(h[:, None], c_at[stop]))
            pieces.append(h[:, None])
            times.append(stop)
            start = stop + 1
    out = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    exported = None
    if wanted == []:  # export_at="chunks" with T < chunk: no step to export
        exported = h.new_zeros(h.shape[0], 0, *h.shape[1:])
    elif wanted is not None:
        position = {t: i for i, t in enumerate(times)}
        order = torch.tensor([position[t] for t in wanted], dtype=torch.long, device=a.device)
        exported = (torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]).index_select(1, order)
    return out, h, exported


# ----------------------------------------------------------------------------- entry point


def diag_scan(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    export_at: Sequence[int] | torch.Tensor | None = None,
    pins: tuple[torch.Tensor, torch.Tensor] | None = None,
    patches: dict[int, torch.Tensor] | None = None,
    impl: str = "auto",
    chunk_size: int = 64,
) -> ScanOutput:
    """h_t = a_t * h_{t-1} + b_t (and y_t = sum_n c_t h_t): see the module docstring."""
    _check_inputs(a, b, c, initial_state, impl, chunk_size)
    dtype = torch.promote_types(a.dtype, b.dtype)
    if c is not None:
        dtype = torch.promote_types(dtype, c.dtype)
    a, b = a.to(dtype), b.to(dtype)
    c = None if c is None else c.to(dtype)
    h0 = a.new_zeros(a.shape[0], *a.shape[2:]) if initial_state is None else initial_state.to(dtype)
    export_idx = _export_index(export_at, a.shape[1], chunk_size, a.device)
    pins = _as_pins(pins, patches, a)
    if pins is not None:
        pins = (pins[0].to(a.device), pins[1].to(dtype))
    if impl == "auto":
        impl = _auto_impl(a)
    if impl == "naive":
        out, final, exported = _naive(a, b, c, h0, export_idx, pins)
    elif impl == "chunked":
        out, final, exported = segmented(_ChunkedScan.apply, a, b, c, h0, export_idx, pins, chunk_size)
    elif impl == "native":
        out, final, exported = segmented(_native_diag(a).segment, a, b, c, h0, export_idx, pins, chunk_size)
    else:
        if a.is_complex():
            raise ValueError(f"impl='triton' supports real dtypes only; got {a.dtype} (use 'chunked')")
        if not a.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"impl='triton' needs CUDA tensors or TRITON_INTERPRET=1; got a on {a.device}")
        from models.kernels.triton_diag_scan import TritonScan

        out, final, exported = segmented(TritonScan.apply, a, b, c, h0, export_idx, pins, chunk_size)
    return ScanOutput(out, final if output_final_state else None, exported)


def _auto_impl(a: torch.Tensor) -> str:
    if a.is_cuda:
        return "triton" if not a.is_complex() and _triton_ok() else "chunked"
    if a.device.type == "cpu":
        from models.kernels.native import diag, library

        if a.dtype in diag.DTYPES and library.available():
            return "native"
    return "chunked"


def _native_diag(a: torch.Tensor):
    """models.kernels.native.diag, after checking that it can run on a."""
    from models.kernels.native import diag, library

    if a.device.type != "cpu":
        raise ValueError(f"impl='native' runs on CPU tensors; got a on {a.device}")
    if a.dtype not in diag.DTYPES:
        raise ValueError(f"impl='native' supports {[str(d) for d in diag.DTYPES]}; got {a.dtype}")
    if not library.available():
        raise ValueError(f"impl='native' is not available here: {library.unavailable_reason()} "
                         "(use 'chunked', or impl='auto', which falls back to it)")
    return diag


def _triton_ok() -> bool:
    try:
        import models.kernels.triton_diag_scan  # noqa: F401
    except ImportError:
        return False
    return True
