"""The complex-transition scans of AUSSM and Mamba-3 as plain-C loops on the CPU (float32 and
float64 inputs, complex state; their fast and instrumented paths):

    AUSSM    a_t = exp(i dt_t omega),            h_t = a_t h_{t-1} + (dt_t x_t) Bm_t^T
    Mamba-3  a_t = exp(dt_t (A + i theta_t)),   h_t = a_t h_{t-1} + lam_t dt_t x_t Bm_t^T
                                                      + (1 - lam_t) dt_t a_t x_prev_t B_prev_t^T
    y_t = Re(h_t) C_t

in real arithmetic on (re, im) planes (complex_body.h), a formed per step inside the loop
(float32 sin and cos a vectorisable polynomial, sincos_f32 in kernels.c, libm's for
|angle| > 8192). `rotation_scan` / `trapezoid_scan` -> y, with the checkpointed backward of the
diagonal scan's scheme giving the gradient of every input (the initial state's complex);
`rotation_states` / `trapezoid_states` -> every state, complex in torch's layout (hook_state's),
with pins (forward only) or without (differentiable: the C backward reads h_{t-1} from the saved
states).

Memory (library.py's model; S = 2 E N element bytes, one step's complex state): the scans keep
from forward to backward their inputs (nothing [B, T, E, N]) and B ceil(T / k) S bytes of
checkpoints, k = complex_spacing (chunk_size where the span's 2 k S of states and transitions
fits SPAN_BYTES, else about sqrt(B T / 2)): at most (sqrt(2 B T) + B) S; the backward adds a
(2 k + 1/2) S span buffer. The *_states kernels return every state by definition (inherent);
their backward reads h_{t-1} from those states and adds 5 E N reals of work.
"""

from __future__ import annotations

import torch

from models.kernels.native.library import SUFFIX, I, P, available, empty, function, ptr, span_spacing, \
    unavailable_reason
from models.kernels.native.selective import SELECTIVE_DTYPES, check_pins, needs_grad, selective_supported

_FWD = [I, I, I, I, I, I, *[P] * 11, I, P, P, P]
_BWD = [I, I, I, I, I, *[P] * 10, I, *[P] * 12]
_STATES_BWD = [I, I, I, I, I, *[P] * 21]


COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_ROTATION, _TRAPEZOID = 0, 1  # the C kernels' mode (complex_body.h)
# per mode: the inputs in the C argument order (None: unused) and their shapes
_CX_INPUTS = {
    _ROTATION: ("dt", "omega", None, None, "x", None, "Bm", None),
    _TRAPEZOID: ("dt", "theta", "A", "lam", "x", "x_prev", "Bm", "B_prev"),
}


def complex_supported(*tensors: torch.Tensor | None, initial_state: torch.Tensor | None = None) -> bool:
    """Whether rotation_scan / trapezoid_scan run on these real tensors (None entries ignored)
    and initial_state: selective_supported for the real ones, and initial_state None or a CPU
    tensor of their complex dtype (complex64 for float32)."""
    given = [x for x in tensors if x is not None]
    return selective_supported(*given) and (
        initial_state is None or (initial_state.device.type == "cpu"
                                  and initial_state.dtype == COMPLEX_OF[given[0].dtype]))


def complex_states_supported(*tensors: torch.Tensor | None, initial_state=None, pins=None) -> bool:
    """Whether rotation_states / trapezoid_states run here: complex_supported (the pin values,
    when given, of the complex dtype too) and, when a gradient is wanted, no pins (their
    backward takes none)."""
    values = None if pins is None else pins[1]
    return (complex_supported(*tensors, initial_state=initial_state)
            and (values is None or (values.device.type == "cpu" and values.dtype == COMPLEX_OF[tensors[0].dtype]))
            and (pins is None or not needs_grad(*tensors, initial_state, values)))


def _check_complex(fn: str, mode: int, named: dict) -> None:
    """Argument checks of the complex-transition kernels (fn): named maps the mode's inputs (and
    optionally C, initial_state: None allowed) to the given values."""
    for name, value in named.items():
        if not (isinstance(value, torch.Tensor) or (value is None and name == "initial_state")):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor; got {type(value).__name__}")
    dt, square = named["dt"], named["omega" if mode == _ROTATION else "A"]
    for name, value, dims in (("dt", dt, "[B, T, E]"), ("omega" if mode == _ROTATION else "A", square, "[E, N]")):
        if value.dim() != dims.count(",") + 1 or value.shape[-1] < 1:
            raise ValueError(f"{fn}: {name} must be {dims} with a nonempty last dim; got shape {tuple(value.shape)}")
    (batch, length, inner), n = dt.shape, square.shape[1]
    per_channel, per_state = (batch, length, inner), (batch, length, n)
    expected = {"dt": per_channel, "omega": (inner, n), "A": (inner, n), "theta": per_state, "lam": per_channel,
                "x": per_channel, "x_prev": per_channel, "Bm": per_state, "B_prev": per_state,
                "C": per_state, "initial_state": (batch, inner, n)}
    for name, value in named.items():
        if value is not None and tuple(value.shape) != expected[name]:
            raise ValueError(f"{fn}: {name} must have shape {expected[name]} (dt [B, T, E] = "
                             f"{tuple(dt.shape)}, [E, N] = {tuple(square.shape)}); got {tuple(value.shape)}")
    if dt.dtype not in SELECTIVE_DTYPES:
        raise ValueError(f"{fn} supports {[str(d) for d in SELECTIVE_DTYPES]}; got {dt.dtype}")
    for name, value in named.items():
        want = COMPLEX_OF[dt.dtype] if name == "initial_state" else dt.dtype
        if value is not None and (value.dtype != want or value.device.type != "cpu"):
            raise ValueError(f"{fn}: every input must be a CPU tensor of dt's dtype {dt.dtype} (initial_state: "
                             f"{want}); {name} is {value.dtype} on {value.device}")
    if not available():
        raise ValueError(f"{fn} is not available here: {unavailable_reason()}")


def _to_planes(h: torch.Tensor) -> torch.Tensor:
    """complex [B, E, N] -> the C layout [B, 2, N, E] (re plane, im plane; a copy)."""
    planes = torch.view_as_real(h.resolve_conj()).permute(0, 3, 2, 1)
    return planes.new_empty(planes.shape).copy_(planes)  # never a view of h: the C code writes into it


def _from_planes(h: torch.Tensor) -> torch.Tensor:
    """[B, 2, N, E] -> complex [B, E, N]."""
    return torch.view_as_complex(h.permute(0, 3, 2, 1).contiguous())


def _c_inputs(mode: int, tensors: dict) -> list:
    """The C kernels' (dt, W, At, lam, x, xp, Bm, Bp) from the named inputs: W = omega^T [N, E]
    (rotation) or theta [B, T, N] (trapezoid), At = A^T [N, E]."""
    out = []
    for name in _CX_INPUTS[mode]:
        value = None if name is None else tensors[name]
        out.append(None if value is None else (value.t() if name in ("omega", "A") else value).contiguous())
    return out


def complex_spacing(chunk: int, inner: int, n: int, element_size: int, batch: int, length: int) -> int:
    """Steps between checkpoints (library.span_spacing with one step's complex state, 2 E N reals,
    and the backward's 2 of them a step: h_t and a_t): chunk where that span fits SPAN_BYTES, else
    the fewest steps that keep the checkpoints within (sqrt(2 B T) + B) 2 E N reals, the span
    within (4 k + 1) E N."""
    return span_spacing(chunk, 2 * inner * n * element_size, 2, batch, length)


def complex_forward(mode: int, tensors: dict, C, h0, every: int, checkpoints: bool):
    """-> (y [B, T, E], checkpoints [B, ceil(T / every), 2, N, E] | None, h_{T-1} complex [B, E, N])
    of the mode's scan (see rotation_scan, trapezoid_scan); tensors: its named inputs; h0 complex
    [B, E, N] or None."""
    dt = tensors["dt"]
    args, C = _c_inputs(mode, tensors), C.contiguous()
    (batch, length, inner), n = dt.shape, C.shape[-1]
    h = dt.new_zeros(batch, 2, n, inner) if h0 is None else _to_planes(h0)
    y = dt.new_empty(batch, length, inner)
    ckpt = empty((batch, -(-length // every), 2, n, inner), dt) if checkpoints else None
    work = dt.new_empty(2 * n * inner + 2 * inner)
    function(f"complex_fwd_{SUFFIX[dt.dtype]}", _FWD)(
        mode, batch, length, length, inner, n, *map(ptr, args), ptr(C), ptr(h), ptr(y), every,
        ptr(ckpt), None, ptr(work),
    )
    return y, ckpt, _from_planes(h)


def complex_backward(mode: int, tensors: dict, C, ckpt, every: int, gy) -> dict:
    """Gradients {name: tensor} of complex_forward's y given gy [B, T, E] for the mode's inputs,
    "C" and "initial_state" (complex [B, E, N])."""
    dt = tensors["dt"]
    args, C, gy = _c_inputs(mode, tensors), C.contiguous(), gy.contiguous()
    (batch, length, inner), n = dt.shape, C.shape[-1]
    grads = [None if a is None else torch.empty_like(a) for a in args]  # dt, W, At, lam, x, xp, Bm, Bp
    grad_C, grad_h0 = torch.empty_like(C), dt.new_empty(batch, 2, n, inner)
    work = empty(((4 * min(every, length) + 1) * n * inner + 2 * inner,), dt)  # see cx_bwd in the C code
    g_dt, g_W, g_At, g_lam, g_x, g_xp, g_Bm, g_Bp = grads
    function(f"complex_bwd_{SUFFIX[dt.dtype]}", _BWD)(
        mode, batch, length, inner, n, *map(ptr, args), ptr(C), ptr(ckpt), every, ptr(gy),
        ptr(g_dt), ptr(g_W), ptr(g_At), ptr(g_lam), ptr(g_x), ptr(g_xp), ptr(g_Bm), ptr(g_Bp),
        ptr(grad_C), ptr(grad_h0), ptr(work),
    )
    out = {"C": grad_C, "initial_state": _from_planes(grad_h0)}
    for name, grad in zip(_CX_INPUTS[mode], grads):
        if name is not None:
            out[name] = grad.t().contiguous() if name in ("omega", "A") else grad
    return out


class ComplexScan(torch.autograd.Function):
    """rotation_scan / trapezoid_scan with the checkpointed C backward: inputs (mode, chunk,
    *the mode's named inputs in _CX_INPUTS order, C, initial_state or None)."""

    @staticmethod
    def forward(ctx, mode, chunk, *inputs):
        names = [name for name in _CX_INPUTS[mode] if name is not None]
        tensors = dict(zip(names, inputs))
        C, h0 = inputs[len(names):]
        dt = tensors["dt"]
        every = complex_spacing(chunk, dt.shape[-1], C.shape[-1], dt.element_size(), *dt.shape[:2])
        y, ckpt, _ = complex_forward(mode, tensors, C, h0, every, checkpoints=True)
        ctx.save_for_backward(*inputs[:len(names)], C, ckpt)
        ctx.mode, ctx.every, ctx.names = mode, every, names
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, gy):
        *saved, C, ckpt = ctx.saved_tensors
        grads = complex_backward(ctx.mode, dict(zip(ctx.names, saved)), C, ckpt, ctx.every, gy)
        ordered = [grads[name] for name in ctx.names] + [grads["C"], grads["initial_state"]]
        return (None, None, *(g if need else None for g, need in zip(ordered, ctx.needs_input_grad[2:])))


def _complex_scan(fn: str, mode: int, tensors: dict, C, initial_state, chunk_size, output_final_state):
    _check_complex(fn, mode, {**tensors, "C": C, "initial_state": initial_state})
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be a positive int; got {chunk_size!r}")
    names = [name for name in _CX_INPUTS[mode] if name is not None]
    inputs = [tensors[name] for name in names]
    grad = needs_grad(*inputs, C, initial_state)
    if output_final_state and grad:
        raise ValueError(f"{fn} has no backward through its final state, but an input requires grad with grad "
                         "mode on: run it under torch.no_grad() or without output_final_state")
    if grad:
        return ComplexScan.apply(mode, chunk_size, *inputs, C, initial_state)
    dt = tensors["dt"]
    every = complex_spacing(chunk_size, dt.shape[-1], C.shape[-1], dt.element_size(), *dt.shape[:2])
    y, _, final = complex_forward(mode, tensors, C, initial_state, every, checkpoints=False)
    return (y, final) if output_final_state else y


def rotation_scan(dt, omega, x, Bm, C, initial_state=None, chunk_size: int = 64, output_final_state: bool = False):
    """AUSSM's scan with the rotation formed in the C loop and the read-out fused:
    a_t = exp(i dt_t omega), h_t = a_t h_{t-1} + (dt_t x_t) Bm_t^T (complex), y_t = Re(h_t) C_t.
    dt [B, T, E] (> 0), omega [E, N], x [B, T, E], Bm, C [B, T, N] (one dtype in SELECTIVE_DTYPES,
    CPU), initial_state complex [B, E, N] of the matching complex dtype or None (zeros)
    -> y [B, T, E]. Differentiable in every input; chunk_size bounds the backward's checkpoint
    spacing (no effect on results). output_final_state: (y, h_{T-1} complex [B, E, N]), forward
    only (ValueError when a gradient is wanted)."""
    return _complex_scan("rotation_scan", _ROTATION, {"dt": dt, "omega": omega, "x": x, "Bm": Bm},
                         C, initial_state, chunk_size, output_final_state)


def trapezoid_scan(dt, A, theta, lam, x, Bm, x_prev, B_prev, C, initial_state=None,
                   chunk_size: int = 64, output_final_state: bool = False):
    """Mamba-3's scan with the transition and the trapezoid formed in the C loop and the read-out
    fused: a_t = exp(dt_t (A + i theta_t)), h_t = a_t h_{t-1} + lam_t dt_t x_t Bm_t^T
    + (1 - lam_t) dt_t a_t x_prev_t B_prev_t^T (complex), y_t = Re(h_t) C_t.
    dt, lam, x, x_prev [B, T, E], A [E, N], theta, Bm, B_prev, C [B, T, N] (one dtype in
    SELECTIVE_DTYPES, CPU), initial_state as in rotation_scan -> y [B, T, E]. Differentiable in
    every input; output_final_state as in rotation_scan."""
    tensors = {"dt": dt, "A": A, "theta": theta, "lam": lam, "x": x, "Bm": Bm, "x_prev": x_prev, "B_prev": B_prev}
    return _complex_scan("trapezoid_scan", _TRAPEZOID, tensors, C, initial_state, chunk_size, output_final_state)


def _complex_states(fn: str, mode: int, tensors: dict, initial_state, pins) -> torch.Tensor:
    """Every state (complex [B, T, E, N]) of the mode's scan, honouring pins (as
    selective_states: the C loop runs up to each pinned step, the pin is written into the
    output and the next call starts from it); differentiable without pins (ComplexStates)."""
    _check_complex(fn, mode, {**tensors, "initial_state": initial_state})
    dt = tensors["dt"]
    (batch, length, inner), n = dt.shape, tensors["Bm"].shape[-1]
    if pins is not None:
        check_pins(fn, pins, batch, length, (inner, n), COMPLEX_OF[dt.dtype])
    if needs_grad(*tensors.values(), initial_state, None if pins is None else pins[1]):
        if pins is not None:
            raise ValueError(f"{fn} has no backward with pins, but an input requires grad with grad mode on; run "
                             f"it under torch.no_grad(), without pins, or use diag_scan for gradients")
        names = [name for name in _CX_INPUTS[mode] if name is not None]
        return ComplexStates.apply(mode, *(tensors[name] for name in names), initial_state)
    return complex_states_forward(mode, tensors, initial_state, pins)


def complex_states_forward(mode: int, tensors: dict, initial_state, pins) -> torch.Tensor:
    """_complex_states' C loop (no autograd; inputs and pins checked): complex [B, T, E, N]."""
    dt = tensors["dt"]
    (batch, length, inner), n = dt.shape, tensors["Bm"].shape[-1]
    args = _c_inputs(mode, tensors)  # dt, W, At, lam, x, xp, Bm, Bp
    per_step = [a is not None and a.dim() == 3 for a in args]  # sliced at each segment's start
    states = empty((batch, length, inner, n), torch.empty(0, dtype=COMPLEX_OF[dt.dtype]))
    planes = torch.view_as_real(states)  # [B, T, E, N, 2]
    h = dt.new_zeros(batch, 2, n, inner) if initial_state is None else _to_planes(initial_state)
    work = dt.new_empty(2 * n * inner + 2 * inner)
    pinned = [] if pins is None else torch.nonzero(pins[0].any(0)).flatten().tolist()
    stops = [t + 1 for t in pinned] + ([] if pinned and pinned[-1] == length - 1 else [length])
    pinned = set(pinned)
    start = 0
    for stop in stops if length else []:  # steps [start, stop) in one call, then the pin at stop - 1
        at = [ptr(a[:, start]) if step else ptr(a) for a, step in zip(args, per_step)]
        function(f"complex_fwd_{SUFFIX[dt.dtype]}", _FWD)(
            mode, batch, stop - start, length, inner, n, *at, None, ptr(h), None, 1, None,
            ptr(planes[:, start]), ptr(work),
        )
        if stop - 1 in pinned:
            rows = pins[0][:, stop - 1]  # [B] bool
            states[rows, stop - 1] = pins[1][rows, stop - 1]
            h[rows] = _to_planes(pins[1][rows, stop - 1])
        start = stop
    return states


def complex_states_backward(mode: int, tensors: dict, initial_state, states, G) -> dict:
    """Gradients {name: tensor} of complex_states_forward's states (no pins) given their
    complex cotangent G [B, T, E, N] for the mode's inputs and "initial_state" (complex
    [B, E, N]); see complex_states_bwd in the C code."""
    dt = tensors["dt"]
    (batch, length, inner), n = dt.shape, tensors["Bm"].shape[-1]
    args = _c_inputs(mode, tensors)  # dt, W, At, lam, x, xp, Bm, Bp
    h0 = dt.new_zeros(batch, 2, n, inner) if initial_state is None else _to_planes(initial_state)
    G = torch.view_as_real(G.resolve_conj().contiguous())  # [B, T, E, N, 2]
    grads = [None if a is None else torch.empty_like(a) for a in args]
    grad_h0 = dt.new_empty(batch, 2, n, inner)
    work = dt.new_empty(5 * n * inner + 3 * inner + 2 * n)
    function(f"complex_states_bwd_{SUFFIX[dt.dtype]}", _STATES_BWD)(
        mode, batch, length, inner, n, *map(ptr, args), ptr(h0), ptr(torch.view_as_real(states)), ptr(G),
        *map(ptr, grads), ptr(grad_h0), ptr(work),
    )
    out = {"initial_state": _from_planes(grad_h0)}
    for name, grad in zip(_CX_INPUTS[mode], grads):
        if name is not None:
            out[name] = grad.t().contiguous() if name in ("omega", "A") else grad
    return out


class ComplexStates(torch.autograd.Function):
    """rotation_states / trapezoid_states without pins, with the C backward reading h_{t-1}
    from the saved states: inputs (mode, *the mode's named inputs in _CX_INPUTS order,
    initial_state or None)."""

    @staticmethod
    def forward(ctx, mode, *inputs):
        names = [name for name in _CX_INPUTS[mode] if name is not None]
        states = complex_states_forward(mode, dict(zip(names, inputs)), inputs[-1], None)
        ctx.save_for_backward(*inputs, states)
        ctx.mode, ctx.names = mode, names
        return states

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, G):
        *inputs, h0, states = ctx.saved_tensors
        grads = complex_states_backward(ctx.mode, dict(zip(ctx.names, inputs)), h0, states, G)
        ordered = [grads[name] for name in ctx.names] + [grads["initial_state"]]
        return (None, *(g if need else None for g, need in zip(ordered, ctx.needs_input_grad[1:])))


def rotation_states(dt, omega, x, Bm, initial_state=None, pins=None) -> torch.Tensor:
    """Every state of rotation_scan's recurrence: complex [B, T, E, N] (complex64 for float32
    inputs, torch's layout: hook_state's), a and b formed in the C loop. pins (mask [B, T] bool,
    values complex [B, T, E, N]): where mask[b, t] the state after step t becomes values[b, t]
    and the scan continues from it. Differentiable in every input without pins (ComplexStates:
    the C backward reads h_{t-1} from the states); with pins forward only: raises ValueError when
    a gradient is wanted (use diag_scan there)."""
    return _complex_states("rotation_states", _ROTATION, {"dt": dt, "omega": omega, "x": x, "Bm": Bm},
                           initial_state, pins)


def trapezoid_states(dt, A, theta, lam, x, Bm, x_prev, B_prev, initial_state=None, pins=None) -> torch.Tensor:
    """Every state of trapezoid_scan's recurrence (as rotation_states: differentiable without pins)."""
    tensors = {"dt": dt, "A": A, "theta": theta, "lam": lam, "x": x, "Bm": Bm, "x_prev": x_prev, "B_prev": B_prev}
    return _complex_states("trapezoid_states", _TRAPEZOID, tensors, initial_state, pins)


def sincos_f32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The complex scans' float32 (sin, cos) (sincos_f32 in kernels.c; no large-angle
    fix-up: accurate for |x| <= 8192) over a float32 CPU tensor (for its accuracy test)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"sincos_f32 takes a float32 CPU tensor; got {getattr(x, 'dtype', type(x).__name__)} "
                         f"on {getattr(x, 'device', '-')}")
    x = x.contiguous()
    s, c = torch.empty_like(x), torch.empty_like(x)
    function("vsincos_f32", [I, P, P, P])(x.numel(), ptr(x), ptr(s), ptr(c))
    return s, c
