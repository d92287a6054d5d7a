"""The RWKV-7 recurrence (a generalized delta rule with a vector decay), with state export, state
patches and a state shift.

Per batch element and head, with the state S_t [V, K] (values x keys; fla's kernels store the
transpose [K, V]):

    S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T        S_{-1} = initial_state (zeros)
    o_t = S_t r_t                                                  (no scale)

RWKV-7 (Peng et al. 2025) calls it with a_t = -kappa_t and b_t = kappa_t * alpha_t (kappa the
L2-normalised removal key, alpha the in-context learning rate), so the transition is
diag(w_t) - kappa_t (alpha_t * kappa_t)^T: fla's chunk_rwkv7 / fused_mul_recurrent_rwkv7 (its
diagonal-plus-low-rank generalized delta rule with gk = w, scale 1; fla.ops.generalized_delta_rule
.dplr.naive.dplr_recurrence is the same loop in fla's layout).

r, w, k, a, b [B, T, H, K], v [B, T, H, V]; w the log decay (any real; RWKV-7's lies in
[-exp(-1/2), 0)). Arguments shared with the other scan kernels (models.kernels.delta_rule):
  initial_state       [B, H, V, K] or None (zeros)
  output_final_state  also return S_{T-1} [B, H, V, K]
  export_at           None or "all": every state S_t, [B, T, H, V, K]
  pins                (mask [B, T] bool, values [B, T, H, V, K]): after step t, where mask[b, t],
                      the state becomes values[b, t] and the scan continues from it; o_t reads
                      the pinned state (models.hooks.state.scan_with_state_hook's form)
  shift               None or [B, T, H, V, K], added to each step's state before its pin (the
                      gradient contract of scan_with_state_hook)
  impl                "naive": the definition, a loop over t in torch ops (differentiable;
                      autograd keeps one state per step).
                      "native": plain-C loops on the CPU (models/kernels/native/rwkv7.py and
                      rwkv7_body.h; float32 / float64 states, every argument above): the forward
                      makes one pass over the state per step, the next step's S_t a_{t+1}
                      accumulated in it. Differentiable in r, w, k, v, a, b, initial_state, shift
                      and the pin values, through the output, the final state and the exported
                      states: the forward keeps a checkpoint every k steps (k from the memory
                      model of models/kernels/native/library.py: B H ceil(T / k) checkpoints of
                      one head's state, O(sqrt(B H T)), and a span of k + 1 in the backward); the
                      backward recomputes the states between checkpoints bit for bit and runs the
                      reverse recurrence, G_{t-1} = G_t diag(e^{w_t}) + (G_t b_t) a_t^T + the
                      read-out's gO_{t-1} r_{t-1}^T (zero through a pinned step, whose pin value
                      gets G_t). At B 1, T 512, H 12, K V 64, float32, one thread, forward +
                      backward took 38 CPU ms against the naive loop's 684 under autograd, at a
                      peak of 13.5 MB against 498 MB (benchmarks/RESULTS.md, benchmarks/rwkv7.py).
                      "auto": native on CPU tensors where the library built, with or without a
                      gradient; else naive. Every CPU run is then the same C loop, so a pinned,
                      shifted or split run equals an unpatched one bit for bit up to the pin
                      (what "nothing before a patch changes" needs). (A chunked torch form, the
                      removed values S_{t-1} a_t of a chunk by one triangular solve with pair
                      decays e^{G_t - G_s} [C, C, K], was measured 11x slower than the naive loop
                      on the CPU: 2.2 s against 0.2 s for T 512, H 12, K V 64, one thread; not kept.)

Returns ScanOutput(output [B, T, H, V], final_state [B, H, V, K] | None, states_at
[B, T, H, V, K] | None). States are float32 (float64 for float64 inputs); output has v's dtype.
"""

from __future__ import annotations

import torch

from models.kernels.diag_scan import ScanOutput

IMPLS = ("auto", "naive", "native")


def rwkv7_scan(r: torch.Tensor, w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
               b: torch.Tensor, *, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               export_at: str | None = None, pins: tuple[torch.Tensor, torch.Tensor] | None = None,
               shift: torch.Tensor | None = None, impl: str = "auto") -> ScanOutput:
    """The RWKV-7 scan; see the module docstring for the recurrence and the arguments."""
    batch, length, heads, d_k = _check(r, w, k, v, a, b, impl, export_at)
    d_v = v.shape[-1]
    state_shape = (batch, heads, d_v, d_k)
    compute = torch.promote_types(v.dtype, torch.float32)
    _check_state("initial_state", initial_state, state_shape)
    if pins is not None:
        _check_state("pins values", pins[1], (batch, length, heads, d_v, d_k))
        if tuple(pins[0].shape) != (batch, length) or pins[0].dtype != torch.bool:
            raise ValueError(f"pins mask must be a [B={batch}, T={length}] bool tensor; got "
                             f"{tuple(pins[0].shape)} {pins[0].dtype}")
    _check_state("shift", shift, (batch, length, heads, d_v, d_k))
    if impl == "native" or (impl == "auto" and native_applies(r, w, k, v, a, b, initial_state, pins, shift)):
        return native_scan(r, w, k, v, a, b, initial_state, output_final_state, export_at, pins, shift)
    r, w, k, v, a, b = (x.to(compute) for x in (r, w, k, v, a, b))
    decay = torch.exp(w)
    h = r.new_zeros(state_shape) if initial_state is None else initial_state.to(compute)
    outputs, states = [], []
    for t in range(length):
        removed = torch.einsum("bhvk,bhk->bhv", h, a[:, t])  # S_{t-1} a_t [B, H, V]
        h = (h * decay[:, t, :, None, :] + removed[..., None] * b[:, t, :, None, :]
             + v[:, t, :, :, None] * k[:, t, :, None, :])  # [B, H, V, K]
        if shift is not None:
            h = h + shift[:, t].to(compute)
        if pins is not None:
            h = torch.where(pins[0][:, t, None, None, None], pins[1][:, t].to(compute), h)
        outputs.append(torch.einsum("bhvk,bhk->bhv", h, r[:, t]))
        if export_at is not None:
            states.append(h)
    output = torch.stack(outputs, dim=1).to(v.dtype)  # [B, T, H, V]
    return ScanOutput(output, h if output_final_state else None,
                      torch.stack(states, dim=1) if export_at is not None else None)


def native_applies(*tensors) -> bool:
    """Whether impl="auto" takes the native loops: CPU tensors (None skipped; pins a pair) and the
    library built (a gradient wanted or not: RWKV7Scan differentiates them)."""
    from models.kernels.native import library

    given = [x for t in tensors for x in (t if isinstance(t, tuple) else (t,)) if isinstance(x, torch.Tensor)]
    if any(x.device.type != "cpu" for x in given):
        return False
    return library.available()


def native_scan(r, w, k, v, a, b, initial_state, output_final_state, export_at, pins, shift) -> ScanOutput:
    """impl="native": the plain-C loop (float32 states for float32 and narrower inputs, float64
    for float64), differentiable through models.kernels.native.rwkv7.RWKV7Scan."""
    from models.kernels.native.rwkv7 import RWKV7Scan, rwkv7_forward

    given = (r, w, k, v, a, b, initial_state, shift) + (() if pins is None else tuple(pins))
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in given):
        raise ValueError(f"rwkv7_scan impl='native' runs on the CPU; got {v.device}")
    batch, _, heads, d_k = r.shape
    dtype, compute = v.dtype, torch.promote_types(v.dtype, torch.float32)
    r, w, k, v, a, b = (x.to(compute).contiguous() for x in (r, w, k, v, a, b))
    state = (r.new_zeros(batch, heads, v.shape[-1], d_k) if initial_state is None
             else initial_state.to(compute).contiguous())
    shift = None if shift is None else shift.to(compute).contiguous()
    mask, values = (None, None) if pins is None else (pins[0].contiguous(), pins[1].to(compute).contiguous())
    export = export_at is not None
    inputs = (r, w, k, v, a, b, state, shift, values)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs):
        output, final, states = RWKV7Scan.apply(*inputs, mask, export)
    else:
        output, final, states, _ = rwkv7_forward(r, w, k, v, a, b, state, export, shift, mask, values)
    return ScanOutput(output.to(dtype), final if output_final_state else None, states if export else None)


def _check(r, w, k, v, a, b, impl, export_at) -> tuple[int, int, int, int]:
    if not isinstance(r, torch.Tensor) or r.dim() != 4:
        raise ValueError(f"r must be a [B, T, H, K] tensor; got {getattr(r, 'shape', type(r))}")
    for name, x in (("w", w), ("k", k), ("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor) or x.shape != r.shape:
            raise ValueError(f"{name} must have r's shape {tuple(r.shape)} [B, T, H, K]; got "
                             f"{getattr(x, 'shape', type(x))}")
    if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.shape[:3] != r.shape[:3]:
        raise ValueError(f"v must be a [B, T, H, V] tensor with r's {tuple(r.shape[:3])} leading dims; got "
                         f"{getattr(v, 'shape', type(v))}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if export_at not in (None, "all"):
        raise ValueError(f"export_at must be None or 'all'; got {export_at!r}")
    return tuple(r.shape)


def _check_state(name: str, x, shape: tuple) -> None:
    if x is not None and (not isinstance(x, torch.Tensor) or tuple(x.shape) != shape):
        raise ValueError(f"{name} must be None or a {list(shape)} tensor; got {getattr(x, 'shape', type(x))}")
