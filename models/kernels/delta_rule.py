"""The delta rule with state export and state patches: naive, chunked (WY form) and Triton.

Per batch element and head, with the state S_t [V, K] (values x keys; fla's kernels store the
transpose unless called with state_v_first=True) and an optional decay alpha_t = exp(g_t):

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T      S_{-1} = initial_state (zeros)
        = alpha_t S_{t-1} + beta_t (v_t - alpha_t S_{t-1} k_t) k_t^T
    o_t = S_t q_t

(g None: alpha_t = 1, DeltaNet; g [B, T, H]: Gated DeltaNet, fla's gated_delta_rule with its g.)
With a channel-wise decay g [B, T, H, K] (Kimi Delta Attention, fla's kda with its g), alpha_t
[K] scales each key column of the state, D_t = S_{t-1} Diag(alpha_t):

    S_t = S_{t-1} Diag(alpha_t) (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
        = D_t + beta_t (v_t - D_t k_t) k_t^T                                 o_t = S_t q_t

(in fla's [K, V] layout S_t^T = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1}^T + beta_t k_t v_t^T,
o_t = (S_t^T)^T q_t); alpha_t = exp(g_t) c (c constant) is the scalar case.

q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H] (already scaled: beta = s * sigmoid(...), any
value; with unit-norm keys the transition I - beta k k^T has eigenvalues 1 (K-1 times) and
1 - beta). Keys are used as given: normalise them before the call. There is no query scale.

Arguments shared with the other scan kernels (`models.kernels.diag_scan`):
  initial_state       [B, H, V, K] or None (zeros)
  output_final_state  also return S_{T-1} [B, H, V, K]
  export_at           None, "all" (every step), "chunks" (every chunk end, cheap in `chunked`),
                      or a sequence / 1-D integer tensor of step indices in [-T, T) (any order,
                      repeats allowed): the states S_t after those steps, [B, n_export, H, V, K]
  pins                (mask [B, T] bool, values [B, T, H, V, K]): after step t, where mask[b, t],
                      the state becomes values[b, t] and the scan continues from it; o_t reads
                      the pinned state (the form `models.hooks.state.scan_with_state_hook` produces)
  patches             {t: new_state [B, H, V, K] or [H, V, K]}, t in [-T, T): every example's
                      state after step t is replaced (give pins or patches, not both)
  impl                "auto" | "naive" | "chunked" | "native" | "triton"
delta-specific:
  g                   None, [B, T, H] (one decay a head) or [B, T, H, K] (one a key channel): the
                      log decay, alpha_t = exp(g_t) (any real; the chunked form is exact in float
                      for g <= 0, where every exponent it forms is <= 0)
  beta_clamp          None or [H, 2] (min, max per head): beta is clamped per head before use
                      (ablations: clamp one head to [0, 1], others to (-inf, inf)); gradients
                      follow torch.clamp (zero where clamped)
  chunk_size          the chunk length of `chunked` (64)

Implementations:
  naive    the definition, a loop over t
  chunked  pure torch, parallel inside chunks of C steps (Yang et al. 2024, "Parallelizing Linear
           Transformers with the Delta Rule over Sequence Length"): with A = strictly lower
           triangular (beta_i k_i . k_j) and the UT transform T = (I + A)^{-1} diag(beta),
           W = T K, U = T V, the chunk's corrected values are U' = U - W S_0^T, its outputs
           O = Q S_0^T + tril(Q K^T) U' and its end state S_0 + U'^T K; states inside a chunk are
           S_0 + cumsum_i u'_i k_i^T; the decay enters as exp(G_i - G_j) factors of cumulative
           log decays G inside a chunk (Yang et al. 2025, Gated DeltaNet; _chunked_segment); a
           channel-wise decay enters per key channel, A_ij = beta_i sum_c k_ic k_jc
           exp(G_ic - G_jc) (and QK alike) from the [C, C, K] decay factors of a chunk (every
           exponent <= 0 for g <= 0: no exp(-G) that overflows under strong decay). After the
           first pin the sequence is split at each pin and the scan resumes from the pinned state.
  native   the recurrence as a plain-C loop on the CPU (models/kernels/native/delta.py, built once
           per machine with the system C compiler), forward only: raises ValueError when a
           gradient is wanted (grad mode on and an input requires grad); float32 / float64
  triton   fused recurrent kernels (models/kernels/triton_delta_rule.py), forward and backward,
           the state on chip; CUDA, or the CPU under TRITON_INTERPRET=1
  auto     triton for CUDA tensors; on the CPU native when no gradient is wanted and it is
           built, else chunked; also when every state is exported: neither's outputs depend on
           export_at, so a model's fast path (no export) and instrumented path (every state)
           agree bit for bit, and steps before a pin keep their bits (both measured faster than
           the loop, benchmarks/RESULTS.md)

Backward memory (S = H V K state elements a batch row): `chunked` differentiates through torch
ops, so autograd keeps each chunk's entering state (B ceil(T / C) S elements: checkpoints every
C = chunk_size steps, the states inside a chunk recomputed from them as partial sums) beside
per-chunk tensors of the inputs' order (A, QK [B, H, C, C] and W, U, the corrected values per
chunk: B T H (2 C + K + 2 V) elements), never a state per step; at C = 64 the chunk states are
as many as library.span_spacing's sqrt(B T / 2) checkpoints up to T = 2 C^2 = 8192 (B = 1), and
grow as T / C past it. A channel-wise decay adds the chunk's decay factors [B, H, C, C, K] a
chunk (B T H C K elements: 8 T H C K bytes in float32 for A and QK together at B = 1; use a smaller
chunk_size where that is large). `triton` stores no state for the scalar decay (the residuals
r [B, T, H, V]; the backward rebuilds the states from them on chip); with a channel-wise decay
its backward also needs D_t = S_{t-1} Diag(alpha_t) in reverse order, so the forward keeps a
checkpoint state every CK = 16 steps (B ceil(T / CK) S elements) and the backward replays each
block of CK steps from it into a scratch of CK states per program (B H CK V K elements) before
walking the block backwards; `native` has no backward (forward only).

Returns `ScanOutput(output [B, T, H, V], final_state [B, H, V, K] | None,
states_at [B, n_export, H, V, K] | None)` (the tuple of `models.kernels.diag_scan`). States are
float32 (float64 for float64 inputs); output has v's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import torch

from models.kernels.diag_scan import ScanOutput

IMPLS = ("auto", "naive", "chunked", "native", "triton")

# Internal patch list: time -> (mask [B] bool, values [B, H, V, K]), sorted by time.
PinList = list[tuple[int, torch.Tensor, torch.Tensor]]


def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    export_at: None | str | Sequence[int] | torch.Tensor = None,
    pins: tuple[torch.Tensor, torch.Tensor] | None = None,
    patches: Mapping[int, torch.Tensor] | None = None,
    beta_clamp: torch.Tensor | None = None,
    chunk_size: int = 64,
    impl: str = "auto",
) -> ScanOutput:
    """Delta-rule scan; see the module docstring for the recurrence and the arguments."""
    batch, length, heads, d_k, d_v = _check_inputs(q, k, v, beta, g)
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    compute = torch.promote_types(v.dtype, torch.float32)
    state_shape = (batch, heads, d_v, d_k)
    state = _check_initial_state(initial_state, state_shape, v)
    export = _export_indices(export_at, length, chunk_size)
    pin_list = _pin_list(pins, patches, batch, length, state_shape)
    beta = _clamped(beta, beta_clamp, heads)

    extra = [x for x in (g, state) if x is not None]
    wants_grad = torch.is_grad_enabled() and any(
        x.requires_grad for x in (q, k, v, beta, *extra, *(p[2] for p in pin_list))
    )
    if impl == "auto":
        impl = "triton" if q.is_cuda else ("native" if not wants_grad and _native_ok(q) else "chunked")
    if impl == "native":
        _check_native(q, wants_grad)
    if impl == "triton":
        from models.kernels.triton_delta_rule import delta_rule_triton

        out, final, states = delta_rule_triton(q, k, v, beta, g, state, export, pin_list)
    else:
        args = [None if x is None else x.to(compute) for x in (q, k, v, beta, g)]
        s0 = None if state is None else state.to(compute)
        if impl == "naive":
            out, final, states = _naive(*args, s0, export, pin_list)
        elif impl == "native":
            out, final, states = _chunked(*args, s0, export, pin_list, chunk_size, _native_segment)
        else:
            out, final, states = _chunked(*args, s0, export, pin_list, chunk_size)
    return ScanOutput(out.to(v.dtype), final if output_final_state else None, states)


# ----------------------------------------------------------------------------- argument checks


def _check_inputs(q, k, v, beta, g) -> tuple[int, int, int, int, int]:
    for name, x, ranks in (("q", q, (4,)), ("k", k, (4,)), ("v", v, (4,)), ("beta", beta, (3,)), ("g", g, (3, 4))):
        if name == "g" and x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must have a floating dtype; got {x.dtype}")
        if x.dim() not in ranks:
            raise ValueError(f"{name} must have rank {' or '.join(map(str, ranks))}; got shape {tuple(x.shape)}")
    batch, length, heads, d_k = k.shape
    d_v = v.shape[-1]
    expected = {"q": (batch, length, heads, d_k), "v": (batch, length, heads, d_v),
                "beta": (batch, length, heads),
                "g": (batch, length, heads, d_k) if g is not None and g.dim() == 4 else (batch, length, heads)}
    for name, x in (("q", q), ("v", v), ("beta", beta), ("g", g)):
        if x is not None and tuple(x.shape) != expected[name]:
            raise ValueError(
                f"{name} must have shape {expected[name]} to match k {tuple(k.shape)} "
                f"(q, k [B, T, H, K], v [B, T, H, V], beta [B, T, H], g [B, T, H] or [B, T, H, K]); "
                f"got {tuple(x.shape)}"
            )
    if length < 1:
        raise ValueError(f"the sequence length T must be >= 1; got q of shape {tuple(q.shape)}")
    return batch, length, heads, d_k, d_v


def _check_initial_state(initial_state, shape, like) -> torch.Tensor | None:
    if initial_state is None:
        return None
    if not isinstance(initial_state, torch.Tensor):
        raise TypeError(f"initial_state must be None or a tensor; got {type(initial_state).__name__}")
    if tuple(initial_state.shape) != shape:
        raise ValueError(
            f"initial_state must have shape [B, H, V, K] = {shape}; got {tuple(initial_state.shape)}"
        )
    return initial_state


def _export_indices(export_at, length: int, chunk_size: int) -> list[int] | None:
    """Step indices whose states to return, in the order asked for (None: no export)."""
    if export_at is None:
        return None
    if isinstance(export_at, str):
        if export_at == "all":
            return list(range(length))
        if export_at == "chunks":
            return list(range(chunk_size - 1, length, chunk_size))
        raise ValueError(
            f"export_at must be None, 'all', 'chunks' or a sequence of step indices; got {export_at!r}"
        )
    if isinstance(export_at, torch.Tensor):
        if export_at.dim() != 1 or export_at.dtype.is_floating_point or export_at.dtype == torch.bool:
            raise ValueError(
                f"export_at as a tensor must be 1-D with integer step indices; got {export_at.dtype} "
                f"of shape {tuple(export_at.shape)}"
            )
        export_at = export_at.tolist()
    if isinstance(export_at, int) or not isinstance(export_at, Sequence):
        raise ValueError(f"export_at must be None, 'all', 'chunks' or a sequence of ints; got {export_at!r}")
    for t in export_at:
        if not isinstance(t, int) or isinstance(t, bool) or not -length <= t < length:
            raise ValueError(f"export_at entries must be ints in [-T, T) = [{-length}, {length}); got {t!r}")
    return [t % length for t in export_at]


def _pin_list(pins, patches, batch: int, length: int, state_shape) -> PinList:
    """Pins and patches as a time-sorted list of (t, mask [B] bool, values [B, H, V, K])."""
    if pins is not None and patches is not None:
        raise ValueError("give pins or patches, not both")
    result: PinList = []
    if pins is not None:
        if not isinstance(pins, (tuple, list)) or len(pins) != 2:
            raise TypeError("pins must be a pair (mask [B, T] bool, values [B, T, H, V, K])")
        mask, values = pins
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (batch, length):
            raise ValueError(
                f"pins mask must be a bool tensor of shape [B, T] = {(batch, length)}; got "
                f"{getattr(mask, 'dtype', type(mask))} {tuple(getattr(mask, 'shape', ()))}"
            )
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (batch, length, *state_shape[1:]):
            raise ValueError(
                f"pins values must have shape [B, T, H, V, K] = {(batch, length, *state_shape[1:])}; "
                f"got {tuple(getattr(values, 'shape', ()))}"
            )
        for t in mask.any(0).nonzero().flatten().tolist():
            result.append((t, mask[:, t], values[:, t]))
    if patches is not None:
        if not isinstance(patches, Mapping):
            raise TypeError(f"patches must be a dict {{t: new_state}}; got {type(patches).__name__}")
        for key, value in patches.items():
            if not isinstance(key, int) or isinstance(key, bool) or not -length <= key < length:
                raise ValueError(f"patches keys must be ints in [-T, T) = [{-length}, {length}); got {key!r}")
            t = key % length
            if not isinstance(value, torch.Tensor) or tuple(value.shape) not in (state_shape, state_shape[1:]):
                raise ValueError(
                    f"patches[{key}] must have shape [B, H, V, K] = {state_shape} or [H, V, K]; got "
                    f"{tuple(getattr(value, 'shape', ()))}"
                )
            mask = torch.ones(batch, dtype=torch.bool, device=value.device)
            result.append((t, mask, value.expand(state_shape)))
        result.sort(key=lambda item: item[0])
        if len({t for t, _, _ in result}) != len(result):
            raise ValueError(f"patches name the same step twice (t and t - T); got keys {sorted(patches)}")
    return result


def _clamped(beta: torch.Tensor, beta_clamp, heads: int) -> torch.Tensor:
    if beta_clamp is None:
        return beta
    if not isinstance(beta_clamp, torch.Tensor):
        beta_clamp = torch.as_tensor(beta_clamp, dtype=beta.dtype)
    if tuple(beta_clamp.shape) != (heads, 2):
        raise ValueError(
            f"beta_clamp must be None or an [H, 2] = ({heads}, 2) tensor of (min, max) per head; "
            f"got shape {tuple(beta_clamp.shape)}"
        )
    if bool((beta_clamp[:, 0] > beta_clamp[:, 1]).any()):
        raise ValueError(f"beta_clamp needs min <= max in every row; got {beta_clamp.tolist()}")
    lo, hi = beta_clamp.to(beta)[:, 0], beta_clamp.to(beta)[:, 1]
    return torch.clamp(beta, min=lo, max=hi)


# ----------------------------------------------------------------------------- native


def _native_ok(q: torch.Tensor) -> bool:
    from models.kernels.native import library

    return q.device.type == "cpu" and library.available()


def _check_native(q: torch.Tensor, wants_grad: bool) -> None:
    from models.kernels.native import library

    if q.device.type != "cpu":
        raise ValueError(f"impl='native' runs on CPU tensors; got q on {q.device}")
    if wants_grad:
        raise ValueError("impl='native' has no backward (forward only); use 'chunked' or 'auto' when "
                         "a gradient is wanted, or run under torch.no_grad()")
    if not library.available():
        raise ValueError(f"impl='native' is not available here: {library.unavailable_reason()} "
                         "(use 'chunked', or impl='auto', which falls back to it)")


def _native_segment(q, k, v, beta, g, S, offsets: list[int], chunk_size: int):
    """One unpatched stretch with the C loop (the signature of _chunked_segment; no chunks)."""
    from models.kernels.native.delta import delta_forward

    return delta_forward(q, k, v, beta, S, offsets, g=g)


# ----------------------------------------------------------------------------- naive


def _naive(q, k, v, beta, g, state, export, pin_list):
    """The definition, step by step. Returns (o [B, T, H, V], final [B, H, V, K], states)."""
    batch, length, heads, d_k = k.shape
    d_v = v.shape[-1]
    S = state if state is not None else v.new_zeros(batch, heads, d_v, d_k)
    pins = {t: (mask, values) for t, mask, values in pin_list}
    wanted = set(export or ())
    outs, kept = [], {}
    for t in range(length):
        if g is not None:  # alpha_t S_{t-1}, or S_{t-1} Diag(alpha_t) for a channel-wise decay
            S = (torch.exp(g[:, t])[..., None, :] if g.dim() == 4 else torch.exp(g[:, t])[..., None, None]) * S
        k_t = k[:, t]  # [B, H, K]
        recalled = torch.einsum("bhvk,bhk->bhv", S, k_t)
        delta = beta[:, t, :, None] * (v[:, t] - recalled)  # [B, H, V]
        S = S + delta[..., None] * k_t[:, :, None, :]
        if t in pins:
            mask, values = pins[t]
            S = torch.where(mask[:, None, None, None], values.to(S.dtype), S)
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
        if t in wanted:
            kept[t] = S
    states = None if export is None else _stack_exports(export, kept, S)
    return torch.stack(outs, dim=1), S, states


def _stack_exports(export: list[int], kept: dict[int, torch.Tensor], like: torch.Tensor):
    if not export:
        return like.new_zeros(like.shape[0], 0, *like.shape[1:])
    return torch.stack([kept[t] for t in export], dim=1)  # [B, n_export, H, V, K]


# ----------------------------------------------------------------------------- chunked


def _chunked(q, k, v, beta, g, state, export, pin_list, chunk_size, segment=None):
    """The chunked WY form; pins split the sequence and resume from the pinned state.

    The steps up to the first pin come from the pass over the whole sequence, so a patch leaves
    them bit for bit as they are without it (re-chunking would change their rounding).
    segment: the kernel for one unpatched stretch (signature of _chunked_segment; default it).
    """
    segment = segment or _chunked_segment
    batch, length, heads, d_k = k.shape
    d_v = v.shape[-1]
    S = state if state is not None else v.new_zeros(batch, heads, d_v, d_k)
    wanted = sorted(set(export or ()))
    pin_times = [t for t, _, _ in pin_list]
    o, S, kept = segment(q, k, v, beta, g, S, wanted + pin_times[:1], chunk_size)
    outs = [o]
    if pin_list:
        first = pin_times[0]
        outs, S = [o[:, : first + 1]], kept[first]
        kept = {t: kept[t] for t in wanted if t <= first}
    for i, (t, mask, values) in enumerate(pin_list):
        S = torch.where(mask[:, None, None, None], values.to(S.dtype), S)
        o_pinned = torch.einsum("bhvk,bhk->bhv", S, q[:, t])  # o_t reads the pinned state
        outs[-1] = torch.cat([outs[-1][:, :-1], o_pinned[:, None]], dim=1)
        if t in kept:
            kept[t] = S
        end = pin_times[i + 1] if i + 1 < len(pin_times) else length - 1
        if end > t:  # steps t+1 .. end from the pinned state
            seg = slice(t + 1, end + 1)
            offsets = [u - t - 1 for u in wanted if t < u <= end]
            o, S, seg_states = segment(q[:, seg], k[:, seg], v[:, seg], beta[:, seg],
                                       None if g is None else g[:, seg], S, offsets, chunk_size)
            kept.update({t + 1 + j: seg_states[j] for j in offsets})
            outs.append(o)
    states = None if export is None else _stack_exports(export, kept, S)
    return torch.cat(outs, dim=1), S, states


def _chunked_segment(q, k, v, beta, g, S, offsets: list[int], chunk_size: int):
    """One unpatched stretch. q, k [B, L, H, K], v [B, L, H, V], beta, g [B, L, H] (g None: no
    decay), S [B, H, V, K]. Returns (o [B, L, H, V], S_end [B, H, V, K], {offset: state}).

    With the decay, inside a chunk with cumulative log decays G_i = g_1 + ... + g_i (gamma_i =
    exp(G_i)) and the writes w_j = beta_j (v_j - alpha_j S_{j-1} k_j):
    S_i = gamma_i S_0 + sum_{j<=i} exp(G_i - G_j) w_j k_j^T, and the writes solve
    (I + A) W = diag(beta) V - diag(beta gamma) K S_0^T with A_jl = beta_j exp(G_j - G_l) k_j . k_l
    (l < j). Every exponent is <= 0 for g <= 0 (the masked ones are -inf before exp).
    A channel-wise g [B, L, H, K] makes G_i, gamma_i K-vectors: S_i = S_0 Diag(gamma_i) + sum_{j<=i}
    w_j (exp(G_i - G_j) * k_j)^T and A_jl = beta_j sum_c exp(G_jc - G_lc) k_jc k_lc
    (_channel_products).
    """
    batch, length, heads, d_k = k.shape
    size = min(chunk_size, length)
    n_chunks = -(-length // size)
    pad = n_chunks * size - length

    def chunks(x):  # [B, L, H, ...] -> [N, B, H, C, ...] contiguous, zero-padded at the end
        # padded steps (k = v = beta = g = 0) leave the state unchanged
        x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.reshape(batch, n_chunks, size, heads, *x.shape[3:])
        return x.permute(1, 0, 3, 2, *range(4, x.dim())).contiguous()

    qc, kc, vc, bc = chunks(q), chunks(k), chunks(v), chunks(beta)  # bc [N, B, H, C]
    kb = kc * bc[..., None]  # beta_i k_i
    if g is None or g.dim() == 3:
        A = torch.tril(kb @ kc.transpose(-1, -2), diagonal=-1)  # [N, B, H, C, C]
        QK = torch.tril(qc @ kc.transpose(-1, -2))  # [N, B, H, C, C]
    channels = g is not None and g.dim() == 4
    if g is None:
        kg = kb
    elif channels:  # G [N, B, H, C, K]; the decay per key channel enters the products
        gc = chunks(g)
        G = gc.cumsum(-2)
        A, QK = _channel_products(qc, kc, bc, G)
        gamma = G.exp()  # [N, B, H, C, K]
        kg, qc = kb * gamma, qc * gamma
        k_end = kc * (G[..., -1:, :] - G).exp()  # exp(G_end - G_j) * k_j per channel
    else:
        gc = chunks(g)  # [N, B, H, C]
        G = gc.cumsum(-1)
        lower = torch.ones(size, size, dtype=torch.bool, device=G.device).tril()
        decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # exp(G_i - G_j)
        A, QK = A * decay, QK * decay
        gamma = G.exp()[..., None]  # [N, B, H, C, 1]
        kg, qc = kb * gamma, qc * gamma
        k_end = kc * (G[..., -1:] - G).exp()[..., None]  # exp(G_end - G_j) k_j
    # UT transform: (I + A) [W | U] = [diag(beta gamma) K | diag(beta) V]
    WU = torch.linalg.solve_triangular(
        A, torch.cat([kg, vc * bc[..., None]], dim=-1), upper=False, unitriangular=True
    )  # [N, B, H, C, K+V]
    W, U = WU[..., :d_k], WU[..., d_k:]

    by_chunk: dict[int, list[int]] = {}
    for j in offsets:
        by_chunk.setdefault(j // size, []).append(j % size)
    outs, kept = [], {}
    for n in range(n_chunks):
        St = S.transpose(-1, -2)  # [B, H, K, V]
        corrected = U[n] - W[n] @ St  # the writes W = U - W S^T  [B, H, C, V]
        outs.append(qc[n] @ St + QK[n] @ corrected)  # [B, H, C, V]
        if g is None:
            S_next = S + corrected.transpose(-1, -2) @ kc[n]  # [B, H, V, K]
        else:
            S_next = gamma[n][:, :, -1:] * S + corrected.transpose(-1, -2) @ k_end[n]
        wanted = by_chunk.get(n, [])
        # a chunk's (or the segment's) last step is S_next; earlier steps are partial sums
        inside = [j for j in wanted if j != size - 1 and n * size + j != length - 1]
        if g is not None or len(inside) > 8:  # running sum of the rank-1 writes (cumsum over dim 2 is slow on CPU)
            partial, chosen = S, set(inside)
            for j in range(max(inside, default=-1) + 1):
                if g is not None:  # [B, H, 1, K] channel-wise, [B, H, 1, 1] a head
                    partial = (gc[n][:, :, j, None, :] if channels else gc[n][:, :, j, None, None]).exp() * partial
                partial = torch.addcmul(partial, corrected[:, :, j, :, None], kc[n][:, :, j, None, :])
                if j in chosen:
                    kept[n * size + j] = partial
        else:
            kept.update({n * size + j: S + corrected[:, :, : j + 1].transpose(-1, -2) @ kc[n][:, :, : j + 1]
                         for j in inside})
        kept.update({n * size + j: S_next for j in wanted if j not in inside})
        S = S_next
    o = torch.stack(outs, dim=1).permute(0, 1, 3, 2, 4)  # [B, N, C, H, V]
    return o.reshape(batch, n_chunks * size, heads, -1)[:, :length], S, kept


def _channel_products(qc, kc, bc, G):
    """A [N, B, H, C, C] (strictly lower: beta_i sum_c exp(G_ic - G_jc) k_ic k_jc) and QK (lower:
    sum_c exp(G_ic - G_jc) q_ic k_jc) of a chunk under a channel-wise decay with cumulative log
    decays G [N, B, H, C, K]; the factors exp(G_i - G_j) [N, B, H, C, C, K] are formed for i >= j
    only (-inf before exp elsewhere), so no exponent exceeds 0 for g <= 0."""
    size = G.shape[-2]
    lower = torch.ones(size, size, dtype=torch.bool, device=G.device).tril()
    decay = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~lower[..., None], float("-inf")).exp()
    kd = kc[..., None, :, :] * decay  # exp(G_i - G_j) k_j  [N, B, H, C (i), C (j), K]
    A = torch.tril(torch.einsum("nbhik,nbhijk->nbhij", kc, kd), diagonal=-1) * bc[..., None]
    QK = torch.einsum("nbhik,nbhijk->nbhij", qc, kd)  # zero above the diagonal (decay 0 there)
    return A, QK
