"""The diagonal scan (and the delta-rule forward) as small plain-C kernels on the CPU.

    h_t = a_t * h_{t-1} + b_t,   y_t[l] = sum_n c_t[l, n] h_t[l, n]     (see diag_scan.py)

The C code (native_scan.c, native_scan_body.h: no torch headers, no threads) walks each batch row
through time over contiguous [T, M] memory, updating the state in place in cache; with a read-out
it writes only y. When a gradient can flow the forward also keeps the state entering every
s-th step (checkpoints, [B, ceil(T / s), *S], 1/s of the inputs' size; s = chunk_size, or fewer
steps where s states and adjoints exceed SPAN_BYTES). The backward recomputes the states of one
checkpoint span at a time into that cache-sized buffer, walks the adjoint back over them
(g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}, kept in cache too), then forward again writing
grad a_t = g_t conj(h_{t-1}), grad b_t = g_t, grad c_t = gy_t conj(h_t) in ascending order;
grad h_{-1} = conj(a_0) g_0. Same association order as the naive loop
(results agree to rounding of the read-out sums). Dtypes: float32, float64, complex64, complex128
(complex as interleaved (re, im) pairs, torch's layout).

The same library holds the delta-rule forward (native_delta_body.h; `delta_forward`, used by
models.kernels.delta_rule with impl="native"; no backward): one pass over the [V, K] state per
step per head, kept transposed in cache so every product is an axpy.

And Mamba's selective scan with the discretisation fused in (native_selective_body.h;
`selective_scan`, used by Mamba's fast path; float32 and float64):

    a_t[e, n] = s exp(dt_t[e] A[e, n]) - (s - 1),  b_t[e, n] = dt_t[e] x_t[e] Bm_t[n],
    h_t = a_t h_{t-1} + b_t,                       y_t[e] = sum_n C_t[n] h_t[e, n]

with the scale s = 1 for Mamba (a = exp(dt A); the C code runs s = 1 as its own branch, so those
results are exactly the plain exp's) and s = 2 for negative Mamba (a = 2 exp(dt A) - 1).

a and b are formed per step inside the loop, so nothing [B, T, E, N] is materialised, forward or
backward (the unfused path builds both in torch and keeps them for autograd). Same checkpointed
backward as the diagonal scan; the gradients of dt, A, x, Bm, C and h0 are reduced from the
adjoint inside the loop. `selective_states` is its sibling for Mamba's instrumented path:
the same arithmetic, but every state [B, T, E, N] is written (no read-out, no checkpoints), with
state pins applied between C calls split at the pinned steps; without pins it is differentiable
(the C backward walks the adjoint back over the saved states, g_t = dL/dh_t + a_{t+1} g_{t+1},
reducing the gradients of dt, A, x, Bm and h0 inside the loop), with pins forward only.
float32 exp is a vectorisable polynomial (exp_f32 in native_scan.c, under 1 ulp from exp; torch's
under 0.6), float64 exp is libm's.

And the complex-transition scans of AUSSM and Mamba-3 (native_complex_body.h; `rotation_scan`,
`trapezoid_scan`, used by their fast paths; float32 and float64 inputs, complex state):

    AUSSM    a_t = exp(i dt_t omega),            h_t = a_t h_{t-1} + (dt_t x_t) Bm_t^T
    Mamba-3  a_t = exp(dt_t (A + i theta_t)),   h_t = a_t h_{t-1} + lam_t dt_t x_t Bm_t^T
                                                      + (1 - lam_t) dt_t a_t x_prev_t B_prev_t^T
    y_t = Re(h_t) C_t

in real arithmetic on (re, im) planes, a formed per step inside the loop (float32 sin and cos a
vectorisable polynomial, sincos_f32 in native_scan.c, libm's for |angle| > 8192), the same
checkpointed backward giving the gradient of every input (the initial state's complex), and
`rotation_states` / `trapezoid_states`: every state, complex in torch's layout (hook_state's),
with pins (forward only) or without (differentiable: the C backward reads h_{t-1} from the saved
states), for the instrumented path.

Build: compiled once per machine with the system C compiler ($CC, else cc, gcc or clang;
-O3 -fopenmp-simd -fno-trapping-math, no -ffast-math, no -march; libm linked) into a cache directory
($INTERP_SEQ_CACHE, else $XDG_CACHE_HOME/interp-seq, else ~/.cache/interp-seq), the file name
keyed by a hash of the sources, flags and machine type; built under a temporary name and renamed
into place atomically, so parallel processes do not race. Loaded with ctypes and called on
contiguous CPU tensors through data_ptr(). Large outputs are advised as transparent huge pages
(`empty`): on the shared VM this was measured on, first-touch page faults of fresh gradient
tensors cost about as much as the backward itself. `available()` says whether it built;
`unavailable_reason()` says why not (diag_scan's impl="auto" then falls back to chunked, and
impl="native" raises).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "native_scan.c", HERE / "native_scan_body.h", HERE / "native_delta_body.h",
           HERE / "native_selective_body.h", HERE / "native_complex_body.h")
# -fno-trapping-math lets selects (exp_f32's clamps) vectorise; it changes no value
FLAGS = ["-O3", "-std=c99", "-fPIC", "-shared", "-fopenmp-simd", "-fno-trapping-math"]
LIBS = ["-lm"]
SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.complex64: "c64", torch.complex128: "c128"}
DTYPES = tuple(SUFFIX)

_P, _I = ctypes.c_void_p, ctypes.c_int64
_FWD_ARGS = [_I, _I, _I, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P, _I, _I, _P]
_BWD_ARGS = [_I, _I, _I, _I, _P, _P, _P, _I, _P, _I, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P]
_DELTA_ARGS = [_I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _P]
_D = ctypes.c_double  # the selective kernels' scale s
_SEL_FWD_ARGS = [_I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _I, _P, _D]
_SEL_BWD_ARGS = [_I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _D]
_SEL_STATES_ARGS = [_I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P, _D]
_SEL_STATES_BWD_ARGS = [_I, _I, _I, _I, *[_P] * 13, _D]
_CX_FWD_ARGS = [_I, _I, _I, _I, _I, _I, *[_P] * 11, _I, _P, _P, _P]
_CX_BWD_ARGS = [_I, _I, _I, _I, _I, *[_P] * 10, _I, *[_P] * 12]
_CX_STATES_BWD_ARGS = [_I, _I, _I, _I, _I, *[_P] * 21]


def _cache_dir() -> Path:
    if os.environ.get("INTERP_SEQ_CACHE"):
        return Path(os.environ["INTERP_SEQ_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "interp-seq"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(compiler: str, target: Path) -> str:
    """Compile into a temporary file next to target and rename it into place (atomic, so a
    concurrent build of the same source wins either way). Returns "" or what went wrong."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        cmd = [compiler, *FLAGS, f"-I{HERE}", str(SOURCES[0]), "-o", tmp, *LIBS]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return f"compiling {SOURCES[0].name} with {compiler} took over 300 s"
        if done.returncode != 0:
            return f"compiling {SOURCES[0].name} with {compiler} failed: {done.stderr.strip()[-2000:]}"
        os.replace(tmp, target)
        return ""
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=None)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, "") or (None, why it is not available). Built at most once per source hash."""
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found ($CC, cc, gcc, clang)"
    try:
        key = hashlib.sha256()
        for path in SOURCES:
            key.update(path.read_bytes())
        key.update(" ".join(FLAGS + LIBS + [platform.machine(), platform.system()]).encode())
        target = _cache_dir() / f"native_scan-{key.hexdigest()[:16]}.so"
        if not target.exists():
            error = _build(compiler, target)
            if error:
                return None, error
        lib = ctypes.CDLL(str(target))
    except OSError as err:
        return None, f"building or loading the native scan failed: {err}"
    for suffix in SUFFIX.values():
        getattr(lib, f"scan_fwd_{suffix}").argtypes = _FWD_ARGS
        getattr(lib, f"scan_bwd_{suffix}").argtypes = _BWD_ARGS
    for suffix in ("f32", "f64"):
        getattr(lib, f"delta_fwd_{suffix}").argtypes = _DELTA_ARGS
        getattr(lib, f"selective_fwd_{suffix}").argtypes = _SEL_FWD_ARGS
        getattr(lib, f"selective_bwd_{suffix}").argtypes = _SEL_BWD_ARGS
        getattr(lib, f"selective_states_{suffix}").argtypes = _SEL_STATES_ARGS
        getattr(lib, f"selective_states_bwd_{suffix}").argtypes = _SEL_STATES_BWD_ARGS
        getattr(lib, f"complex_fwd_{suffix}").argtypes = _CX_FWD_ARGS
        getattr(lib, f"complex_bwd_{suffix}").argtypes = _CX_BWD_ARGS
        getattr(lib, f"complex_states_bwd_{suffix}").argtypes = _CX_STATES_BWD_ARGS
    lib.vexp_f32.argtypes = [_I, _P, _P]
    lib.vsincos_f32.argtypes = [_I, _P, _P, _P]
    return lib, ""


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str:
    return _load()[1]


HUGE = 2 << 20  # transparent huge page size on x86-64 / most arm64 Linux
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=None)
def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def empty(shape, like: torch.Tensor) -> torch.Tensor:
    """torch.empty for a large output the kernel is about to write: on Linux, the whole 2 MiB
    pages inside it are advised as huge pages (madvise; a no-op where THP is off), so writing a
    freshly mapped tensor takes one page fault per 2 MiB instead of per 4 KiB."""
    out = like.new_empty(shape)
    nbytes = out.numel() * out.element_size()
    libc = _libc() if platform.system() == "Linux" and nbytes >= 2 * HUGE else None
    if libc is not None:
        start = -(-out.data_ptr() // HUGE) * HUGE
        end = (out.data_ptr() + nbytes) // HUGE * HUGE
        if end > start:
            libc.madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return out


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


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


def forward(a, b, c, h0, export_idx, chunk, store_all: bool = False, checkpoints: bool = True):
    """a, b [B, T, *S], c None | [B, T, N] | [B, T, *S], h0 [B, *S] (one dtype in DTYPES, CPU)
    -> (y [B, T, *lead] | None, hs [B, T, *S] | None, final [B, *S], exported [B, K, *S] | None,
    checkpoints [B, ceil(T / chunk), *S] | None)."""
    lib, _ = _load()
    a, b, c = a.contiguous(), b.contiguous(), None if c is None else c.contiguous()
    batch, length, lead, n, c_stride = _geometry(a, c)
    state = a.shape[2:]
    final = h0.contiguous().clone()
    y = None if c is None else a.new_empty(batch, length, *state[:-1])
    hs = empty(a.shape, a) if store_all else None
    slot, steps, where = _slots(export_idx, length)
    unique = None if slot is None else empty((batch, len(steps), *state), a)
    ckpt = a.new_empty(batch, -(-length // chunk), *state) if checkpoints else None
    getattr(lib, f"scan_fwd_{SUFFIX[a.dtype]}")(
        batch, length, lead, n, _ptr(a), _ptr(b), _ptr(c), c_stride, _ptr(final), _ptr(y), _ptr(hs),
        _ptr(slot), _ptr(unique), 0 if steps is None else len(steps), chunk, _ptr(ckpt),
    )
    exported = unique if where is None else unique.index_select(1, where)
    return y, hs, final, exported, ckpt


def backward(a, b, c, ckpt, chunk, g_out, g_final, g_exported, export_idx, need_c: bool):
    """Gradients (a, b, c | None, h0) of forward's outputs given their cotangents (None: zero)."""
    lib, _ = _load()
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
    work = a.new_empty(2 * min(chunk, length) + 1, *a.shape[2:])  # see scan_bwd in the C code
    getattr(lib, f"scan_bwd_{SUFFIX[a.dtype]}")(
        batch, length, lead, n, _ptr(a), _ptr(b), _ptr(c), c_stride, _ptr(ckpt), chunk,
        _ptr(g_out), _ptr(g_final), _ptr(slot), _ptr(g_unique), 0 if steps is None else len(steps),
        _ptr(grad_a), _ptr(grad_b), _ptr(grad_c), _ptr(grad_h0), _ptr(work),
    )
    return grad_a, grad_b, grad_c, grad_h0


SPAN_BYTES = 256 * 1024  # the backward's span of states and adjoints stays within this (L2-sized)


def checkpoint_spacing(chunk: int, a: torch.Tensor) -> int:
    """Steps between checkpoints: chunk, or fewer where chunk steps of state and of adjoint
    exceed SPAN_BYTES."""
    return max(1, min(chunk, SPAN_BYTES // max(1, 2 * math.prod(a.shape[2:]) * a.element_size())))


def segment(a, b, c, h0, export_idx, chunk):
    """diag_scan's segment function (the signature of its chunked one): NativeScan when a
    gradient can flow, else the forward alone (no checkpoints kept)."""
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (a, b, c, h0)):
        return NativeScan.apply(a, b, c, h0, export_idx, chunk)
    y, hs, final, exported, _ = forward(a, b, c, h0, export_idx, chunk, store_all=c is None, checkpoints=False)
    return (hs if c is None else y), final, exported


def delta_forward(q, k, v, beta, state, steps: list[int]):
    """The delta-rule forward (no autograd): q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H],
    state [B, H, V, K], one dtype in (float32, float64), CPU -> (o [B, T, H, V], final state
    [B, H, V, K], {step: state [B, H, V, K]} for the given steps)."""
    lib, _ = _load()
    q, k, v, beta = (x.contiguous() for x in (q, k, v, beta))
    batch, length, heads, d_k = k.shape
    d_v = v.shape[-1]
    final = state.contiguous().clone()
    o = empty((batch, length, heads, d_v), v)
    steps = sorted(set(steps))
    slot = torch.full((length,), -1, dtype=torch.int64)
    slot[steps] = torch.arange(len(steps))
    exported = empty((batch, len(steps), heads, d_v, d_k), v)
    work = v.new_empty(heads * (d_k * d_v + 2 * d_v))
    getattr(lib, f"delta_fwd_{SUFFIX[v.dtype]}")(
        batch, length, heads, d_k, d_v, _ptr(q), _ptr(k), _ptr(v), _ptr(beta), _ptr(final), _ptr(o),
        _ptr(slot), _ptr(exported), len(steps), _ptr(work),
    )
    return o, final, {t: exported[:, i] for i, t in enumerate(steps)}


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


# ----------------------------------------------------------------------------- selective scan

SELECTIVE_DTYPES = (torch.float32, torch.float64)


def selective_supported(*tensors: torch.Tensor | None) -> bool:
    """Whether selective_scan runs on these tensors (None entries ignored): the library is built
    and they are CPU tensors of one dtype in SELECTIVE_DTYPES."""
    given = [x for x in tensors if x is not None]
    return (all(x.device.type == "cpu" and x.dtype == given[0].dtype for x in given)
            and given[0].dtype in SELECTIVE_DTYPES and available())


def _check_selective(fn: str, named: dict) -> None:
    """Argument checks of selective_scan / selective_states (fn): named maps dt, A, x, Bm and
    optionally C, initial_state (None allowed) to the given values."""
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
                "C": (batch, length, n), "initial_state": (batch, inner, n)}
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


def selective_scan(dt, A, x, Bm, C, initial_state=None, chunk_size: int = 64, scale: float = 1.0) -> torch.Tensor:
    """Mamba's selective scan (see the module docstring; no D x term): dt [B, T, E] (> 0, after
    softplus), A [E, N] (negative), x [B, T, E], Bm, C [B, T, N], initial_state [B, E, N] or
    None (zeros); one dtype in SELECTIVE_DTYPES, CPU -> y [B, T, E]. Differentiable in every
    input; chunk_size bounds the backward's checkpoint spacing (no effect on results); scale is
    the transition's s, a_t = s exp(dt_t A) - (s - 1) (1: Mamba, 2: negative Mamba; 0 < s <= 2)."""
    _check_selective("selective_scan", {"dt": dt, "A": A, "x": x, "Bm": Bm, "C": C, "initial_state": initial_state})
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"selective_scan: chunk_size must be a positive int; got {chunk_size!r}")
    scale = _check_scale("selective_scan", scale)
    h0 = dt.new_zeros(dt.shape[0], *A.shape) if initial_state is None else initial_state
    inputs = (dt, A, x, Bm, C, h0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return SelectiveScan.apply(*inputs, chunk_size, scale)
    return selective_forward(*inputs, chunk_size, checkpoints=False, scale=scale)[0]


def selective_spacing(chunk: int, A: torch.Tensor) -> int:
    """Steps between checkpoints: chunk, or fewer where chunk steps of states and transitions
    (the backward's recomputed span) exceed SPAN_BYTES."""
    return max(1, min(chunk, SPAN_BYTES // max(1, 2 * A.numel() * A.element_size())))


def selective_forward(dt, A, x, Bm, C, h0, every: int, checkpoints: bool, scale: float = 1.0):
    """-> (y [B, T, E], checkpoints [B, ceil(T / every), N, E] | None); see selective_scan. The
    C code keeps A and the states transposed ([N, E]: its inner loops run over E)."""
    lib, _ = _load()
    dt, x, Bm, C, At = (t.contiguous() for t in (dt, x, Bm, C, A.t()))  # At [N, E]
    (batch, length, inner), n = dt.shape, A.shape[1]
    h = h0.transpose(1, 2).contiguous()  # [B, N, E] (a copy), the final state on return
    y = dt.new_empty(batch, length, inner)
    ckpt = dt.new_empty(batch, -(-length // every), n, inner) if checkpoints else None
    getattr(lib, f"selective_fwd_{SUFFIX[dt.dtype]}")(
        batch, length, inner, n, _ptr(dt), _ptr(At), _ptr(x), _ptr(Bm), _ptr(C),
        _ptr(h), _ptr(y), every, _ptr(ckpt), scale,
    )
    return y, ckpt


def selective_backward(dt, A, x, Bm, C, ckpt, every: int, gy, scale: float = 1.0):
    """Gradients (dt, A, x, Bm, C, h0) of selective_forward's y given its cotangent gy [B, T, E]."""
    lib, _ = _load()
    dt, x, Bm, C, gy, At = (t.contiguous() for t in (dt, x, Bm, C, gy, A.t()))  # At [N, E]
    (batch, length, inner), n = dt.shape, A.shape[1]
    grad_dt, grad_x, grad_Bm, grad_C = (torch.empty_like(t) for t in (dt, x, Bm, C))
    grad_At, grad_h0t = dt.new_empty(n, inner), dt.new_empty(batch, n, inner)  # transposed
    work = dt.new_empty(2 * min(every, length) + 1, n, inner)  # see selective_bwd in the C code
    getattr(lib, f"selective_bwd_{SUFFIX[dt.dtype]}")(
        batch, length, inner, n, _ptr(dt), _ptr(At), _ptr(x), _ptr(Bm), _ptr(C),
        _ptr(ckpt), every, _ptr(gy), _ptr(grad_dt), _ptr(grad_At), _ptr(grad_x), _ptr(grad_Bm),
        _ptr(grad_C), _ptr(grad_h0t), _ptr(work), scale,
    )
    return grad_dt, grad_At.t().contiguous(), grad_x, grad_Bm, grad_C, grad_h0t.transpose(1, 2).contiguous()


class SelectiveScan(torch.autograd.Function):
    """selective_scan with the checkpointed C backward."""

    @staticmethod
    def forward(ctx, dt, A, x, Bm, C, h0, chunk, scale):
        every = selective_spacing(chunk, A)
        y, ckpt = selective_forward(dt, A, x, Bm, C, h0, every, checkpoints=True, scale=scale)
        ctx.save_for_backward(dt, A, x, Bm, C, ckpt)
        ctx.every, ctx.scale = every, scale
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not itself differentiable
    def backward(ctx, gy):
        grads = selective_backward(*ctx.saved_tensors, ctx.every, gy, ctx.scale)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad)), None, None)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def selective_states_supported(dt, A, x, Bm, initial_state=None, pins=None) -> bool:
    """Whether selective_states runs here: selective_supported for these tensors (and the pin
    values), and, when a gradient is wanted, no pins (its backward takes none)."""
    values = None if pins is None else pins[1]
    tensors = (dt, A, x, Bm, initial_state, values)
    return selective_supported(*tensors) and (pins is None or not _needs_grad(*tensors))


def _check_pins(pins, batch: int, length: int, state: tuple, dtype: torch.dtype) -> None:
    if not isinstance(pins, (tuple, list)) or len(pins) != 2:
        raise ValueError(f"selective_states: pins must be a (mask [B, T], values [B, T, E, N]) pair; "
                         f"got {type(pins).__name__}")
    mask, values = pins
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (batch, length):
        raise ValueError(f"selective_states: pins mask must be a bool [B, T]={(batch, length)} tensor; "
                         f"got {getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
    if (not isinstance(values, torch.Tensor) or tuple(values.shape) != (batch, length, *state)
            or values.dtype != dtype or values.device.type != "cpu"):
        raise ValueError(f"selective_states: pins values must be a [B, T, E, N]={(batch, length, *state)} "
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
        _check_pins(pins, batch, length, (inner, n), dt.dtype)
    if _needs_grad(dt, A, x, Bm, initial_state, None if pins is None else pins[1]):
        if pins is not None:
            raise ValueError("selective_states has no backward with pins, but an input requires grad with grad "
                             "mode on; run it under torch.no_grad(), without pins, or use diag_scan for gradients")
        return SelectiveStates.apply(dt, A, x, Bm, initial_state, scale)
    return selective_states_forward(dt, A, x, Bm, initial_state, pins, scale)


def selective_states_forward(dt, A, x, Bm, initial_state, pins, scale: float) -> torch.Tensor:
    """selective_states' C loop (no autograd; pins checked): states [B, T, E, N]."""
    lib, _ = _load()
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm = (t.contiguous() for t in (dt, A, x, Bm))
    states = empty((batch, length, inner, n), dt)
    h = dt.new_zeros(batch, inner, n) if initial_state is None else initial_state.contiguous()
    h_stride = inner * n  # elements between batch rows of the state entering the next call
    pinned = [] if pins is None else torch.nonzero(pins[0].any(0)).flatten().tolist()
    stops = [t + 1 for t in pinned] + ([] if pinned and pinned[-1] == length - 1 else [length])
    pinned = set(pinned)
    start = 0
    for stop in stops if length else []:  # steps [start, stop) in one call, then the pin at stop - 1
        getattr(lib, f"selective_states_{SUFFIX[dt.dtype]}")(
            batch, stop - start, length, inner, n, _ptr(dt[:, start]), _ptr(A), _ptr(x[:, start]),
            _ptr(Bm[:, start]), _ptr(h), h_stride, _ptr(states[:, start]), scale,
        )
        if stop - 1 in pinned:
            rows = pins[0][:, stop - 1]  # [B] bool
            states[rows, stop - 1] = pins[1][rows, stop - 1]
        h, h_stride, start = states[:, stop - 1], length * inner * n, stop
    return states


def selective_states_backward(dt, A, x, Bm, initial_state, states, G, scale: float):
    """Gradients (dt, A, x, Bm, h0) of selective_states_forward's states (no pins) given their
    cotangent G [B, T, E, N] (the C adjoint walk; see selective_states_bwd)."""
    lib, _ = _load()
    (batch, length, inner), n = dt.shape, A.shape[1]
    dt, A, x, Bm, states, G = (t.contiguous() for t in (dt, A, x, Bm, states, G))
    h0 = dt.new_zeros(batch, inner, n) if initial_state is None else initial_state.contiguous()
    grad_dt, grad_A, grad_x, grad_Bm = (torch.empty_like(t) for t in (dt, A, x, Bm))
    grad_h0, work = dt.new_empty(batch, inner, n), dt.new_empty(2, inner, n)
    getattr(lib, f"selective_states_bwd_{SUFFIX[dt.dtype]}")(
        batch, length, inner, n, _ptr(dt), _ptr(A), _ptr(x), _ptr(Bm), _ptr(h0), _ptr(states), _ptr(G),
        _ptr(grad_dt), _ptr(grad_A), _ptr(grad_x), _ptr(grad_Bm), _ptr(grad_h0), _ptr(work), scale,
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


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """The selective scan's float32 exponential (exp_f32 in native_scan.c) over a float32 CPU
    tensor (for its accuracy test)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"exp_f32 takes a float32 CPU tensor; got {getattr(x, 'dtype', type(x).__name__)} "
                         f"on {getattr(x, 'device', '-')}")
    lib, _ = _load()
    x = x.contiguous()
    y = torch.empty_like(x)
    lib.vexp_f32(x.numel(), _ptr(x), _ptr(y))
    return y


# ----------------------------------------------------------------------------- complex transitions

COMPLEX_OF = {torch.float32: torch.complex64, torch.float64: torch.complex128}
_ROTATION, _TRAPEZOID = 0, 1  # the C kernels' mode (native_complex_body.h)
# per mode: the inputs in the C argument order (None: unused) and their shapes
_CX_INPUTS = {
    _ROTATION: ("dt", "omega", None, None, "x", None, "Bm", None),
    _TRAPEZOID: ("dt", "theta", "A", "lam", "x", "x_prev", "Bm", "B_prev"),
}
_CX_FN = {_ROTATION: "rotation", _TRAPEZOID: "trapezoid"}


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
            and (pins is None or not _needs_grad(*tensors, initial_state, values)))


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
    return torch.view_as_real(h.resolve_conj()).permute(0, 3, 2, 1).contiguous()


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


def complex_spacing(chunk: int, inner: int, n: int, element_size: int) -> int:
    """Steps between checkpoints: chunk, or fewer where chunk steps of complex states and
    transitions (the backward's recomputed span, 4 E N reals a step) exceed SPAN_BYTES."""
    return max(1, min(chunk, SPAN_BYTES // max(1, 4 * inner * n * element_size)))


def complex_forward(mode: int, tensors: dict, C, h0, every: int, checkpoints: bool):
    """-> (y [B, T, E], checkpoints [B, ceil(T / every), 2, N, E] | None) of the mode's scan
    (see rotation_scan, trapezoid_scan); tensors: its named inputs; h0 complex [B, E, N] or None."""
    lib, _ = _load()
    dt = tensors["dt"]
    args, C = _c_inputs(mode, tensors), C.contiguous()
    (batch, length, inner), n = dt.shape, C.shape[-1]
    h = dt.new_zeros(batch, 2, n, inner) if h0 is None else _to_planes(h0)
    y = dt.new_empty(batch, length, inner)
    ckpt = dt.new_empty(batch, -(-length // every), 2, n, inner) if checkpoints else None
    work = dt.new_empty(2 * n * inner + 2 * inner)
    getattr(lib, f"complex_fwd_{SUFFIX[dt.dtype]}")(
        mode, batch, length, length, inner, n, *map(_ptr, args), _ptr(C), _ptr(h), _ptr(y), every,
        _ptr(ckpt), None, _ptr(work),
    )
    return y, ckpt


def complex_backward(mode: int, tensors: dict, C, ckpt, every: int, gy) -> dict:
    """Gradients {name: tensor} of complex_forward's y given gy [B, T, E] for the mode's inputs,
    "C" and "initial_state" (complex [B, E, N])."""
    lib, _ = _load()
    dt = tensors["dt"]
    args, C, gy = _c_inputs(mode, tensors), C.contiguous(), gy.contiguous()
    (batch, length, inner), n = dt.shape, C.shape[-1]
    grads = [None if a is None else torch.empty_like(a) for a in args]  # dt, W, At, lam, x, xp, Bm, Bp
    grad_C, grad_h0 = torch.empty_like(C), dt.new_empty(batch, 2, n, inner)
    work = dt.new_empty((4 * min(every, length) + 1) * n * inner + 2 * inner)  # see cx_bwd in the C code
    g_dt, g_W, g_At, g_lam, g_x, g_xp, g_Bm, g_Bp = grads
    getattr(lib, f"complex_bwd_{SUFFIX[dt.dtype]}")(
        mode, batch, length, inner, n, *map(_ptr, args), _ptr(C), _ptr(ckpt), every, _ptr(gy),
        _ptr(g_dt), _ptr(g_W), _ptr(g_At), _ptr(g_lam), _ptr(g_x), _ptr(g_xp), _ptr(g_Bm), _ptr(g_Bp),
        _ptr(grad_C), _ptr(grad_h0), _ptr(work),
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
        every = complex_spacing(chunk, dt.shape[-1], C.shape[-1], dt.element_size())
        y, ckpt = complex_forward(mode, tensors, C, h0, every, checkpoints=True)
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


def _complex_scan(fn: str, mode: int, tensors: dict, C, initial_state, chunk_size) -> torch.Tensor:
    _check_complex(fn, mode, {**tensors, "C": C, "initial_state": initial_state})
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{fn}: chunk_size must be a positive int; got {chunk_size!r}")
    names = [name for name in _CX_INPUTS[mode] if name is not None]
    inputs = [tensors[name] for name in names]
    if _needs_grad(*inputs, C, initial_state):
        return ComplexScan.apply(mode, chunk_size, *inputs, C, initial_state)
    dt = tensors["dt"]
    every = complex_spacing(chunk_size, dt.shape[-1], C.shape[-1], dt.element_size())
    return complex_forward(mode, tensors, C, initial_state, every, checkpoints=False)[0]


def rotation_scan(dt, omega, x, Bm, C, initial_state=None, chunk_size: int = 64) -> torch.Tensor:
    """AUSSM's scan with the rotation formed in the C loop and the read-out fused:
    a_t = exp(i dt_t omega), h_t = a_t h_{t-1} + (dt_t x_t) Bm_t^T (complex), y_t = Re(h_t) C_t.
    dt [B, T, E] (> 0), omega [E, N], x [B, T, E], Bm, C [B, T, N] (one dtype in SELECTIVE_DTYPES,
    CPU), initial_state complex [B, E, N] of the matching complex dtype or None (zeros)
    -> y [B, T, E]. Differentiable in every input; chunk_size bounds the backward's checkpoint
    spacing (no effect on results)."""
    return _complex_scan("rotation_scan", _ROTATION, {"dt": dt, "omega": omega, "x": x, "Bm": Bm},
                         C, initial_state, chunk_size)


def trapezoid_scan(dt, A, theta, lam, x, Bm, x_prev, B_prev, C, initial_state=None,
                   chunk_size: int = 64) -> torch.Tensor:
    """Mamba-3's scan with the transition and the trapezoid formed in the C loop and the read-out
    fused: a_t = exp(dt_t (A + i theta_t)), h_t = a_t h_{t-1} + lam_t dt_t x_t Bm_t^T
    + (1 - lam_t) dt_t a_t x_prev_t B_prev_t^T (complex), y_t = Re(h_t) C_t.
    dt, lam, x, x_prev [B, T, E], A [E, N], theta, Bm, B_prev, C [B, T, N] (one dtype in
    SELECTIVE_DTYPES, CPU), initial_state as in rotation_scan -> y [B, T, E]. Differentiable in
    every input."""
    tensors = {"dt": dt, "A": A, "theta": theta, "lam": lam, "x": x, "Bm": Bm, "x_prev": x_prev, "B_prev": B_prev}
    return _complex_scan("trapezoid_scan", _TRAPEZOID, tensors, C, initial_state, chunk_size)


def _complex_states(fn: str, mode: int, tensors: dict, initial_state, pins) -> torch.Tensor:
    """Every state (complex [B, T, E, N]) of the mode's scan, honouring pins (as
    selective_states: the C loop runs up to each pinned step, the pin is written into the
    output and the next call starts from it); differentiable without pins (ComplexStates)."""
    _check_complex(fn, mode, {**tensors, "initial_state": initial_state})
    dt = tensors["dt"]
    (batch, length, inner), n = dt.shape, tensors["Bm"].shape[-1]
    if pins is not None:
        try:
            _check_pins(pins, batch, length, (inner, n), COMPLEX_OF[dt.dtype])
        except ValueError as err:  # its messages name selective_states
            raise ValueError(str(err).replace("selective_states", fn)) from None
    if _needs_grad(*tensors.values(), initial_state, None if pins is None else pins[1]):
        if pins is not None:
            raise ValueError(f"{fn} has no backward with pins, but an input requires grad with grad mode on; run "
                             f"it under torch.no_grad(), without pins, or use diag_scan for gradients")
        names = [name for name in _CX_INPUTS[mode] if name is not None]
        return ComplexStates.apply(mode, *(tensors[name] for name in names), initial_state)
    return complex_states_forward(mode, tensors, initial_state, pins)


def complex_states_forward(mode: int, tensors: dict, initial_state, pins) -> torch.Tensor:
    """_complex_states' C loop (no autograd; inputs and pins checked): complex [B, T, E, N]."""
    lib, _ = _load()
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
        at = [_ptr(a[:, start]) if step else _ptr(a) for a, step in zip(args, per_step)]
        getattr(lib, f"complex_fwd_{SUFFIX[dt.dtype]}")(
            mode, batch, stop - start, length, inner, n, *at, None, _ptr(h), None, 1, None,
            _ptr(planes[:, start]), _ptr(work),
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
    lib, _ = _load()
    dt = tensors["dt"]
    (batch, length, inner), n = dt.shape, tensors["Bm"].shape[-1]
    args = _c_inputs(mode, tensors)  # dt, W, At, lam, x, xp, Bm, Bp
    h0 = dt.new_zeros(batch, 2, n, inner) if initial_state is None else _to_planes(initial_state)
    G = torch.view_as_real(G.resolve_conj().contiguous())  # [B, T, E, N, 2]
    grads = [None if a is None else torch.empty_like(a) for a in args]
    grad_h0 = dt.new_empty(batch, 2, n, inner)
    work = dt.new_empty(5 * n * inner + 3 * inner + 2 * n)
    getattr(lib, f"complex_states_bwd_{SUFFIX[dt.dtype]}")(
        mode, batch, length, inner, n, *map(_ptr, args), _ptr(h0), _ptr(torch.view_as_real(states)), _ptr(G),
        *map(_ptr, grads), _ptr(grad_h0), _ptr(work),
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
    """The complex scans' float32 (sin, cos) (sincos_f32 in native_scan.c; no large-angle
    fix-up: accurate for |x| <= 8192) over a float32 CPU tensor (for its accuracy test)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"sincos_f32 takes a float32 CPU tensor; got {getattr(x, 'dtype', type(x).__name__)} "
                         f"on {getattr(x, 'device', '-')}")
    lib, _ = _load()
    x = x.contiguous()
    s, c = torch.empty_like(x), torch.empty_like(x)
    lib.vsincos_f32(x.numel(), _ptr(x), _ptr(s), _ptr(c))
    return s, c
