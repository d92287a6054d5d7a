"""Mamba's selective scan with the discretisation fused in, as plain-C loops on the CPU (the fast
path and the every-state instrumented path of Mamba and negative Mamba; float32 and float64):

    a_t[e, n] = s exp(dt_t[e] A[e, n]) - (s - 1),  b_t[e, n] = dt_t[e] x_t[e] Bm_t[n],
    h_t = a_t h_{t-1} + b_t,                       y_t[e] = sum_n C_t[n] h_t[e, n]

with the scale s = 1 for Mamba (a = exp(dt A); the C code runs s = 1 as its own branch, so those
results are exactly the plain exp's) and s = 2 for negative Mamba (a = 2 exp(dt A) - 1).

`selective_scan` -> y: a and b are formed per step inside the loop (selective_body.h), so nothing
[B, T, E, N] is materialised, forward or backward (the unfused path builds both in torch and keeps
them for autograd). Its backward follows the diagonal scan's checkpointed scheme (diag.py): states
recomputed one span at a time from checkpoints, the gradients of dt, A, x, Bm, C and h0 reduced
from the adjoint inside the loop.

`selective_states` -> every state [B, T, E, N]: the same arithmetic, no read-out, no checkpoints,
with state pins applied between C calls split at the pinned steps. Without pins it is
differentiable (the C backward walks the adjoint back over the saved states,
g_t = dL/dh_t + a_{t+1} g_{t+1}, reducing the gradients of dt, A, x, Bm and h0 inside the loop);
with pins forward only.

`selective_states_shifted` -> (y, every state) of h_t = a_t h_{t-1} + b_t + shift_t, the read-out
fused: the forward of a hook_state gradient probe (models.hooks: shift is a zero leaf whose
gradient is d L / d h_t). Its C backward walks the adjoint back over the saved states,
g_t = dL/dh_t (given) + gy_t C_t + a_{t+1} g_{t+1}, and writes every g_t out as shift's gradient
beside the others, so the states' total cotangents come from one kernel forward and backward.

Memory (library.py's model; S = E N element bytes, one step's state): selective_scan keeps from
forward to backward its inputs (dt, x [B, T, E], Bm, C [B, T, N]: nothing [B, T, E, N]) and
B ceil(T / k) S bytes of checkpoints, k = selective_spacing (chunk_size where 2 k S fits
SPAN_BYTES, else about sqrt(B T / 2)): at most (sqrt(2 B T) + B) S, where the old cache-only
rule kept every state for S > SPAN_BYTES / 2 (Mamba-130m's 96 KiB, Mamba-2 130M's 768 KiB);
its backward adds a (2 k + 1) S span buffer. At B = 1, T = 2048: 64 checkpoints and a 65-state
span for Mamba-2 (50 + 51 MB a layer) instead of 2048 states (1.6 GB a layer).
selective_states and selective_states_shifted return every state [B, T, E, N] by definition, and
the shifted one's backward writes every state's adjoint (shift's gradient, [B, T, E, N]) by
definition: those, the shift input and the cotangent of the states are inherent. Their
backwards read h_{t-1} from the states they returned (saved, not copied) and add only
2 or 3 E N elements of work: no checkpoints, nothing recomputed but exp(dt A).

A with one decay per channel (every column equal: Mamba-2's per-head A expanded over N;
shared_decay) runs selective_scan's C loops with exp(dt_t A) formed once per channel and step
and kept as [E] a step in the backward's span: the same values, so the same bits, about 2.4x
faster forward + backward at Mamba-2 130M's E = 1536, N = 128 (7 + 35 ms against 32 + 72 ms at
T = 256, one thread).

float32 exp is a vectorisable polynomial (exp_f32 in kernels.c, under 1 ulp from exp; torch's
under 0.6), float64 exp is libm's.
"""

from __future__ import annotations

import torch

from models.kernels.native.library import SUFFIX, D, I, P, available, empty, function, ptr, span_spacing, \
    unavailable_reason

_FWD = [I, I, I, I, P, P, P, P, P, P, P, I, P, D, I, P]
_BWD = [I, I, I, I, P, P, P, P, P, P, I, P, P, P, P, P, P, P, P, D, I]
_STATES = [I, I, I, I, I, P, P, P, P, P, I, P, D]
_STATES_BWD = [I, I, I, I, *[P] * 13, D]
_SHIFTED = [I, I, I, I, *[P] * 9, D]
_SHIFTED_BWD = [I, I, I, I, *[P] * 17, D]


SELECTIVE_DTYPES = (torch.float32, torch.float64)


def selective_supported(*tensors: torch.Tensor | None) -> bool:
    """Whether selective_scan runs on these tensors (None entries ignored): the library is built
    and they are CPU tensors of one dtype in SELECTIVE_DTYPES."""
    given = [x for x in tensors if x is not None]
    return (all(x.device.type == "cpu" and x.dtype == given[0].dtype for x in given)
            and given[0].dtype in SELECTIVE_DTYPES and available())


def _check_selective(fn: str, named: dict) -> None:
    """Argument checks of selective_scan / selective_states / selective_states_shifted (fn): named
    maps dt, A, x, Bm and optionally C, shift, initial_state (None allowed) to the given values."""
    dt, A = named["dt"], named["A"]
    for name, value in named.items():
        if not (isinstance(value, torch.Tensor) or (value is None and name == "initial_state")):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor; got {type(value).__name__}")
    for name, dims in (("dt", "[B, T, E]"), ("A", "[E, N]")):
        if named[name].dim() != dims.count(",") + 1 or named[name].shape[-1] < 1:
            raise ValueError(f"{fn}: {name} must be {dims} with a nonempty last dim; "
                             f"got shape {tuple(named[name].shape)}")
    (batch, length, inner), n = dt.shape, A.shape[1]
    expected = {"A": (inner, n), "x": (batch, length, inner), "Bm": (batch, length, n),
                "C": (batch, length, n), "initial_state": (batch, inner, n), "shift": (batch, length, inner, n)}
    for name, value in named.items():
        if value is not None and tuple(value.shape) != expected.get(name, tuple(value.shape)):
            raise ValueError(f"{fn}: {name} must have shape {expected[name]} (dt [B, T, E] = "
                             f"{tuple(dt.shape)}, A [E, N] = {tuple(A.shape)}); got {tuple(value.shape)}")
    for name, value in named.items():
        if value is not None and (value.dtype != dt.dtype or value.device.type != "cpu"):
            raise ValueError(f"{fn}: every input must be a CPU tensor of dt's dtype {dt.dtype}; "
                             f"{name} is {value.dtype} on {value.device}")
    if dt.dtype not in SELECTIVE_DTYPES:
        raise ValueError(f"{fn} supports {[str(d) for d in SELECTIVE_DTYPES]}; got {dt.dtype}")
    if not available():
        raise ValueError(f"{fn} is not available here: {unavailable_reason()}")


def _check_scale(fn: str, scale) -> float:
    """The transition's scale s as a float: a real number with 0 < s <= 2 (so a = s exp(dt A) - (s - 1)
    stays in (-1, 1] for dt A <= 0)."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale <= 2:
        raise ValueError(f"{fn}: scale must be a real number in (0, 2] (1: Mamba's exp(dt A), "
                         f"2: negative Mamba's 2 exp(dt A) - 1); got {scale!r}")
    return float(scale)


def selective_scan(dt, A, x, Bm, C, initial_state=None, chunk_size: int = 64, scale: float = 1.0,
                   output_final_state: bool = False):
    """Mamba's selective scan (see the module docstring; no D x term): dt [B, T, E] (> 0, after
    softplus), A [E, N] (negative), x [B, T, E], Bm, C [B, T, N], initial_state [B, E, N] or
    None (zeros); one dtype in SELECTIVE_DTYPES, CPU -> y [B, T, E]. Differentiable in every
    input; chunk_size is the backward's checkpoint spacing for small states (selective_spacing;
    no effect on results); scale is
    the transition's s, a_t = s exp(dt_t A) - (s - 1) (1: Mamba, 2: negative Mamba; 0 < s <= 2).
    output_final_state: return (y, h_{T-1} [B, E, N]) instead, forward only (ValueError when a
    gradient is wanted)."""
    _check_selective("selective_scan", {"dt": dt, "A": A, "x": x, "Bm": Bm, "C": C, "initial_state": initial_state})
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"selective_scan: chunk_size must be a positive int; got {chunk_size!r}")
    scale = _check_scale("selective_scan", scale)
    h0 = dt.new_zeros(dt.shape[0], *A.shape) if initial_state is None else initial_state
    inputs = (dt, A, x, Bm, C, h0)
    grad = needs_grad(*inputs)
    if output_final_state and grad:
        raise ValueError("selective_scan has no backward through its final state, but an input requires grad "
                         "with grad mode on: run it under torch.no_grad() or without output_final_state")
    if grad:
        return SelectiveScan.apply(*inputs, chunk_size, scale)
    y, _, final = selective_forward(*inputs, chunk_size, checkpoints=False, scale=scale)
    return (y, final) if output_final_state else y


def selective_spacing(chunk: int, A: torch.Tensor, batch: int, length: int) -> int:
    """Steps between checkpoints (library.span_spacing with the backward's 2 states a step: h_t and
    exp(dt_t A), [E, N] each): chunk where that span fits SPAN_BYTES, else the fewest steps that
    keep the checkpoints within (sqrt(2 B T) + B) E N elements, the span within (2 k + 1) E N."""
    return span_spacing(chunk, A.numel() * A.element_size(), 2, batch, length)


def shared_decay(A: torch.Tensor) -> bool:
    """Whether A [E, N] has one decay per channel (every column equal, as Mamba-2's A expanded over
    N): the C loops then form exp(dt_t A) once per channel and step instead of N times (the
    same values, so the same bits). An A expanded from one column (stride 0 over N) is shared by
    construction and is not compared: a decoding step would otherwise read [E, N] twice per call."""
    if A.shape[1] > 1 and A.stride(1) == 0:
        return True
    return A.shape[1] > 1 and torch.equal(A, A[:, :1].expand_as(A))


def _c_transposed(A: torch.Tensor, shared: bool) -> torch.Tensor:
    """The C code's A: transposed [N, E] (its inner loops run over E), or the [E] column when shared."""
    return (A[:, 0] if shared else A.t()).contiguous()


def selective_forward(dt, A, x, Bm, C, h0, every: int, checkpoints: bool, scale: float = 1.0):
    """-> (y [B, T, E], checkpoints [B, ceil(T / every), N, E] | None, h_{T-1} [B, E, N]); see
    selective_scan. The C code keeps A and the states transposed ([N, E]: its inner loops run over E)."""
    shared = shared_decay(A)
    dt, x, Bm, C = (t.contiguous() for t in (dt, x, Bm, C))
    At = _c_transposed(A, shared)
    (batch, length, inner), n = dt.shape, A.shape[1]
    h = h0.new_empty(batch, n, inner).copy_(h0.transpose(1, 2))  # [B, N, E] (a copy), the final state on return
    y = dt.new_empty(batch, length, inner)
    ckpt = empty((batch, -(-length // every), n, inner), dt) if checkpoints else None
    scratch = dt.new_empty(inner)  # the shared transitions of one step
    function(f"selective_fwd_{SUFFIX[dt.dtype]}", _FWD)(
        batch, length, inner, n, ptr(dt), ptr(At), ptr(x), ptr(Bm), ptr(C),
        ptr(h), ptr(y), every, ptr(ckpt), scale, int(shared), ptr(scratch),
    )
    return y, ckpt, h.transpose(1, 2)


def selective_backward(dt, A, x, Bm, C, ckpt, every: int, gy, scale: float = 1.0):
    """Gradients (dt, A, x, Bm, C, h0) of selective_forward's y given its cotangent gy [B, T, E]."""
    shared = shared_decay(A)
    dt, x, Bm, C, gy = (t.contiguous() for t in (dt, x, Bm, C, gy))
    At = _c_transposed(A, shared)
    (batch, length, inner), n = dt.shape, A.shape[1]
    grad_dt, grad_x, grad_Bm, grad_C = (torch.empty_like(t) for t in (dt, x, Bm, C))
    grad_At, grad_h0t = dt.new_empty(n, inner), dt.new_empty(batch, n, inner)  # transposed
    span = min(every, length)  # the span's states and exp(dt A) ([E] a step when shared); see selective_bwd
    work = empty(((span + 1) * n * inner + span * (inner if shared else n * inner),), dt)
    function(f"selective_bwd_{SUFFIX[dt.dtype]}", _BWD)(
        batch, length, inner, n, ptr(dt), ptr(At), ptr(x), ptr(Bm), ptr(C),
        ptr(ckpt), every, ptr(gy), ptr(grad_dt), ptr(grad_At), ptr(grad_x), ptr(grad_Bm),
        ptr(grad_C), ptr(grad_h0t), ptr(work), scale, int(shared),
    )
    return grad_dt, grad_At.t().contiguous(), grad_x, grad_Bm, grad_C, grad_h0t.transpose(1, 2).contiguous()


class SelectiveScan(torch.autograd.Function):
    """selective_scan with the checkpointed C backward."""

    @staticmethod
    def forward(ctx, dt, A, x, Bm, C, h0, chunk, scale):
        every = selective_spacing(chunk, A, dt.shape[0], dt.shape[1])
        y, ckpt, _ = selective_forward(dt, A, x, Bm, C, h0, every, checkpoints=True, scale=scale)
        ctx.save_for_backward(dt, A, x, Bm, C, ckpt)
        ctx.every, ctx.scale = every, scale
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, gy):
        grads = selective_backward(*ctx.saved_tensors, ctx.every, gy, ctx.scale)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None, None)


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def selective_states_supported(dt, A, x, Bm, initial_state=None, pins=None) -> bool:
    """Whether selective_states runs here: selective_supported for these tensors (and the pin
    values), and, when a gradient is wanted, no pins (its backward takes none)."""
    values = None if pins is None else pins[1]
    tensors = (dt, A, x, Bm, initial_state, values)
    return selective_supported(*tensors) and (pins is None or not needs_grad(*tensors))


def check_pins(fn: str, pins, batch: int, length: int, state: tuple, dtype: torch.dtype) -> None:
    """Argument checks of the every-state kernels' pins (fn: the function named in the errors)."""
    if not isinstance(pins, (tuple, list)) or len(pins) != 2:
        raise ValueError(f"{fn}: pins must be a (mask [B, T], values [B, T, E, N]) pair; "
                         f"got {type(pins).__name__}")
    mask, values = pins
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (batch, length):
        raise ValueError(f"{fn}: pins mask must be a bool [B, T]={(batch, length)} tensor; "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    if (not isinstance(values, torch.Tensor) or tuple(values.shape) != (batch, length, *state)
            or values.dtype != dtype or values.device.type != "cpu"):
        raise ValueError(f"{fn}: pins values must be a [B, T, E, N]={(batch, length, *state)} "
                         f"CPU tensor of dt's dtype {dtype}; got {getattr(values, 'dtype', type(values).__name__)} "
                         f"{tuple(getattr(values, 'shape', ()))}")


def selective_states(dt, A, x, Bm, initial_state=None, pins=None, scale: float = 1.0) -> torch.Tensor:
    """Every state of Mamba's selective scan: dt [B, T, E] (> 0), A [E, N], x [B, T, E],
    Bm [B, T, N], initial_state [B, E, N] or None (zeros); one dtype in SELECTIVE_DTYPES, CPU
    -> states [B, T, E, N], h_t = a_t h_{t-1} + (dt_t x_t) Bm_t^T with a_t = s exp(dt_t A) - (s - 1)
    (s = scale, as in selective_scan), a and b formed inside the C loop (the arithmetic of
    selective_scan's forward).

    pins (mask [B, T] bool, values [B, T, E, N]): where mask[b, t], the state after step t becomes
    values[b, t] and the scan continues from it (diag_scan's pins). The C loop runs up to each
    pinned step, the pin is written into the output, and the next call starts from that row.
    Differentiable in dt, A, x, Bm and initial_state without pins (SelectiveStates: the C
    backward reads h_{t-1} from the states); with pins forward only: raises ValueError when grad
    mode is on and an input requires grad (use diag_scan over torch-formed a and b there)."""
    _check_selective("selective_states", {"dt": dt, "A": A, "x": x, "Bm": Bm, "initial_state": initial_state})
    scale = _check_scale("selective_states", scale)
    (batch, length, inner), n = dt.shape, A.shape[1]
    if pins is not None:
        check_pins("selective_states", pins, batch, length, (inner, n), dt.dtype)
    if needs_grad(dt, A, x, Bm, initial_state, None if pins is None else pins[1]):
        if pins is not None:
            raise ValueError("selective_states has no backward with pins, but an input requires grad with grad "
                             "mode on; run it under torch.no_grad(), without pins, or use diag_scan for gradients")
        return SelectiveStates.apply(dt, A, x, Bm, initial_state, scale)
    return selective_states_forward(dt, A, x, Bm, initial_state, pins, scale)


def selective_states_forward(dt, A, x, Bm, initial_state, pins, scale: float) -> torch.Tensor:
    """selective_states' C loop (no autograd; pins checked): states [B, T, E, N]."""
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm = (t.contiguous() for t in (dt, A, x, Bm))
    # not huge-page advised (library.empty): every state is a one-shot export for hooks and
    # caches, and a fresh 805 MB advised export inside a forward cost 1.3-2.1 CPU-s of faults on
    # this VM against about 0.5 s of 4 KiB faults (benchmarks/RESULTS.md, real size, state patch)
    states = dt.new_empty(batch, length, inner, n)
    h = dt.new_zeros(batch, inner, n) if initial_state is None else initial_state.contiguous()
    h_stride = inner * n  # elements between batch rows of the state entering the next call
    pinned = [] if pins is None else torch.nonzero(pins[0].any(0)).flatten().tolist()
    stops = [t + 1 for t in pinned] + ([] if pinned and pinned[-1] == length - 1 else [length])
    pinned = set(pinned)
    start = 0
    for stop in stops if length else []:  # steps [start, stop) in one call, then the pin at stop - 1
        function(f"selective_states_{SUFFIX[dt.dtype]}", _STATES)(
            batch, stop - start, length, inner, n, ptr(dt[:, start]), ptr(A), ptr(x[:, start]),
            ptr(Bm[:, start]), ptr(h), h_stride, ptr(states[:, start]), scale,
        )
        if stop - 1 in pinned:
            rows = pins[0][:, stop - 1]  # [B] bool
            states[rows, stop - 1] = pins[1][rows, stop - 1]
        h, h_stride, start = states[:, stop - 1], length * inner * n, stop
    return states


def selective_states_backward(dt, A, x, Bm, initial_state, states, G, scale: float):
    """Gradients (dt, A, x, Bm, h0) of selective_states_forward's states (no pins) given their
    cotangent G [B, T, E, N] (the C adjoint walk; see selective_states_bwd)."""
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm, states, G = (t.contiguous() for t in (dt, A, x, Bm, states, G))
    h0 = dt.new_zeros(batch, inner, n) if initial_state is None else initial_state.contiguous()
    grad_dt, grad_A, grad_x, grad_Bm = (torch.empty_like(t) for t in (dt, A, x, Bm))
    grad_h0, work = dt.new_empty(batch, inner, n), dt.new_empty(2, inner, n)
    function(f"selective_states_bwd_{SUFFIX[dt.dtype]}", _STATES_BWD)(
        batch, length, inner, n, ptr(dt), ptr(A), ptr(x), ptr(Bm), ptr(h0), ptr(states), ptr(G),
        ptr(grad_dt), ptr(grad_A), ptr(grad_x), ptr(grad_Bm), ptr(grad_h0), ptr(work), scale,
    )
    return grad_dt, grad_A, grad_x, grad_Bm, grad_h0


class SelectiveStates(torch.autograd.Function):
    """selective_states without pins, with the C backward (every state is the output, so
    nothing is recomputed but exp(dt A); no checkpoints)."""

    @staticmethod
    def forward(ctx, dt, A, x, Bm, h0, scale):
        states = selective_states_forward(dt, A, x, Bm, h0, None, scale)
        ctx.save_for_backward(dt, A, x, Bm, h0, states)
        ctx.scale = scale
        return states

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, G):
        grads = selective_states_backward(*ctx.saved_tensors, G, ctx.scale)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None)


def selective_states_shifted(dt, A, x, Bm, C, shift, initial_state=None, scale: float = 1.0):
    """Every state and the read-out of Mamba's selective scan with a shift: dt [B, T, E] (> 0),
    A [E, N], x [B, T, E], Bm, C [B, T, N], shift [B, T, E, N], initial_state [B, E, N] or None
    (zeros); one dtype in SELECTIVE_DTYPES, CPU -> (y [B, T, E], states [B, T, E, N]) with
    h_t = a_t h_{t-1} + (b_t + shift_t), y_t = h_t C_t (a_t, b_t as in selective_states).
    Differentiable in every input and in both outputs (SelectiveShifted: one C backward reads
    h_{t-1} from the saved states; the gradient of shift_t is the adjoint dL/dh_t, the total
    derivative of the state through the read-out and every later step)."""
    _check_selective("selective_states_shifted", {"dt": dt, "A": A, "x": x, "Bm": Bm, "C": C,
                                                  "shift": shift, "initial_state": initial_state})
    scale = _check_scale("selective_states_shifted", scale)
    h0 = dt.new_zeros(dt.shape[0], *A.shape) if initial_state is None else initial_state
    if needs_grad(dt, A, x, Bm, C, shift, h0):
        return SelectiveShifted.apply(dt, A, x, Bm, C, h0, shift, scale)
    return selective_shifted_forward(dt, A, x, Bm, C, h0, shift, scale)


def selective_shifted_forward(dt, A, x, Bm, C, h0, shift, scale: float):
    """selective_states_shifted's C loop (no autograd; arguments checked) -> (y, states)."""
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm, C, h0, shift = (t.contiguous() for t in (dt, A, x, Bm, C, h0, shift))
    states, y = empty((batch, length, inner, n), dt), dt.new_empty(batch, length, inner)
    function(f"selective_shifted_{SUFFIX[dt.dtype]}", _SHIFTED)(
        batch, length, inner, n, ptr(dt), ptr(A), ptr(x), ptr(Bm), ptr(C), ptr(h0), ptr(shift),
        ptr(states), ptr(y), scale,
    )
    return y, states


def selective_shifted_backward(dt, A, x, Bm, C, h0, states, gy, G, scale: float):
    """Gradients (dt, A, x, Bm, C, h0, shift) of selective_shifted_forward given the cotangents
    gy [B, T, E] of y and G [B, T, E, N] of the states (either None: zero); see selective_shifted_bwd."""
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm, C, h0, states = (t.contiguous() for t in (dt, A, x, Bm, C, h0, states))
    gy, G = (None if g is None else g.contiguous() for g in (gy, G))
    grad_dt, grad_A, grad_x, grad_Bm, grad_C = (torch.empty_like(t) for t in (dt, A, x, Bm, C))
    grad_h0, grad_shift, work = dt.new_empty(batch, inner, n), empty(states.shape, dt), dt.new_empty(3, inner, n)
    function(f"selective_shifted_bwd_{SUFFIX[dt.dtype]}", _SHIFTED_BWD)(
        batch, length, inner, n, ptr(dt), ptr(A), ptr(x), ptr(Bm), ptr(C), ptr(h0), ptr(states),
        ptr(G), ptr(gy), ptr(grad_dt), ptr(grad_A), ptr(grad_x), ptr(grad_Bm), ptr(grad_C),
        ptr(grad_h0), ptr(grad_shift), ptr(work), scale,
    )
    return grad_dt, grad_A, grad_x, grad_Bm, grad_C, grad_h0, grad_shift


class SelectiveShifted(torch.autograd.Function):
    """selective_states_shifted with the C backward over the saved states (no checkpoints)."""

    @staticmethod
    def forward(ctx, dt, A, x, Bm, C, h0, shift, scale):
        y, states = selective_shifted_forward(dt, A, x, Bm, C, h0, shift, scale)
        ctx.save_for_backward(dt, A, x, Bm, C, h0, states)
        ctx.scale = scale
        ctx.set_materialize_grads(False)  # an unused output's cotangent stays None (NULL in C)
        return y, states

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, gy, G):
        if gy is None and G is None:
            return (None,) * 8
        grads = selective_shifted_backward(*ctx.saved_tensors, gy, G, ctx.scale)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """The selective scan's float32 exponential (exp_f32 in kernels.c) over a float32 CPU
    tensor (for its accuracy test)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"exp_f32 takes a float32 CPU tensor; got {getattr(x, 'dtype', type(x).__name__)} "
                         f"on {getattr(x, 'device', '-')}")
    x = x.contiguous()
    y = torch.empty_like(x)
    function("vexp_f32", [I, P, P])(x.numel(), ptr(x), ptr(y))
    return y
