"""Effective attention of recurrent mixers: the matrix M with y_t = sum_{s <= t} M[t, s] x_s that a
mixer's recurrence implements for the current input (from the zero initial state).

    Diagonal SSMs (mamba, negative_mamba, mamba2, aussm, mamba3): per channel e, x the scanned
      input (Mamba's post-conv x [B, T, E]; Mamba-2's x [B, T, H, P]) and y the read-out C h
      before D x and the gate:
        M[e, t, s] = sum_n C_t[n] (prod_{r = s+1..t} a_r[e, n]) b_s[e, n] / x_s[e]
      (b_s / x_s = dt_s B_s: Mamba's M = C_t (prod a_r) B_s dt_s). Mamba-2's a, dt, B, C are shared
      by a head's P channels, so its M is one [T, T] per head (the SSD "attention"). Mamba-3's
      trapezoid feeds x_s into two steps: M[e, t, s] = sum_n C_t[n] (prod_{r = s+1..t} a_r)
      B_s[n] (lam_s dt_s + [t > s] (1 - lam_{s+1}) dt_{s+1}).
    Time-invariant SSMs: s4d per channel d, x the mixer input, y the SSM part before D x and the
      GELU: M[d, t, s] = K_d[t - s], K_d[l] = 2 Re(sum_m C_m dB_m dA_m^l) (its convolution kernel);
      h3 per channel c, x the values v and y = q * (C h) (before the skip Dskip u and out_proj):
        M[c, t, s] = q_t[c] K_c[t - s] kbar_s[c],  K_c[l] = sum_n C Bbar Abar^l
      (q the query, kbar the shift-SSM key: H3's q (K * (kbar v)) written as attention).
    Complex states (s4d, aussm, mamba3): the output is the real part of C h and x is real, so
      Re(sum_s c_s x_s) = sum_s Re(c_s) x_s and M is the real part of the complex coefficients
      (real, like the output; s4d's factor 2 is its conjugate pair).
    Delta rule (deltanet, deltanet_neg, gated_deltanet, kda): per head, x the values v_s and y the
      kernel output o_t = S_t q_t (before the output norm and gate):
        M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t,  A_r = Diag(alpha_r) (I - beta_r k_r k_r^T)
      (alpha = 1 without a decay; one alpha a head, or one a key channel for kda). This is exact, the key removal (- beta k k^T) included: the
      recurrence is linear in the values, so no approximation is needed (TransformerLens'
      linearised views of attention are heuristics; this is the operator itself).
    Linear attention (based): per head, x the values v_s and y the normalised linear attention:
        M[t, s] = phi(q_t) . phi(k_s) / sum_{s' <= t} phi(q_t) . phi(k_{s'})
      (the sliding-window branch, when there is one, is a separate softmax attention, not in M).
    Dense linear RNNs (linear_rnn, token_gated_rnn, dense_ssm): h_t = A_t h_{t-1} + u_t, x the
      scanned input u (B x_t + b) and y the state h (what out_proj reads); every (t, s) is an
      n x n block, M[t, s] = A_t A_{t-1} ... A_{s+1} (the identity at s = t), in `blocks`
      [B, T', S', n, n]; `matrix` holds the blocks' Frobenius norms [B, 1, T', S'] for the heatmap.

Not covered: attention (its pattern is hook_pattern), the convolution mixers without a state
(BaseConv, Hyena), and the recurrences that are not linear in their input given the run's
coefficients (tanh RNN, state-gated RNN, LSTM, GRU, LayerNorm and sphere RNNs: their gates or
normalisation depend on the state itself).

    effective_attention(model, tokens, layer, index=None, window=None, sources=None,
                        dtype=torch.float32, max_memory=None, progress=True) -> EffectiveAttention
    effective_attention_layers(model, tokens, layers, **the same options) -> {layer: EffectiveAttention}

Selection: `index` picks channels or heads (the result's axis: an int, a slice, a sequence of
ints; all by default; dense mixers have none), `window=(start, stop)` the output positions t and
`sources=(start, stop)` the input positions s (the window by default; (0, stop) for everything a
window's rows read). The result is exactly full[:, index, start:stop, s_start:s_stop] of the
unselected computation, and only the selection is computed: the recurrences run from the first
source over the selected channels, their coefficients are formed CHUNK steps at a time, and each
output row t is written as the scan reaches it (the linear attention's in blocks of CHUNK rows), so
the memory is the result plus one row's working set. Mamba-130m, one layer, T = 1024, 64 channels:
a [1, 64, 1024, 1024] float32 result of 268 MB.
dtype float32 (default) or float64 is the arithmetic and the result's type (complex64 / complex128
for complex states). The bytes are estimated up front and MemoryRefused raised when they exceed the
budget (models.memory: max_memory bytes or a size such as '2GB'; a share of the available memory
by default); a progress bar runs over the steps (progress=False turns it off).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from models.memory import budget_bytes, progress_bar, refuse
from models.mixers.based import taylor_features

DIAGONAL = ("mamba", "negative_mamba", "mamba2", "aussm", "mamba3")
COMPLEX = ("aussm", "mamba3")
INVARIANT = ("s4d", "h3")
DELTA = ("deltanet", "gated_deltanet", "kda")
LINEAR = ("based",)
DENSE = ("linear_rnn", "token_gated_rnn", "dense_ssm")
COVERED = DIAGONAL + INVARIANT + DELTA + LINEAR + DENSE
DTYPES = (torch.float32, torch.float64)
CHUNK = 32  # steps of coefficients formed at once; rows of linear attention per block
HINT = "select fewer channels or heads (index=), a shorter window (window=, sources=) or dtype=torch.float32"


@dataclass
class EffectiveAttention:
    """matrix [B, C, T', S']: y_t[c] = sum_s matrix[b, c, t - start, s - source_start] x_s[c] over the
    selected channels or heads `index` (C of them; None: all), output positions start .. start + T'
    and input positions source_start .. source_start + S'; for a dense transition blocks
    [B, T', S', n, n] with y_t = sum_s blocks[b, t, s] @ x_s, and matrix their Frobenius norms
    [B, 1, T', S']. layer, mixer: the block it was computed on and its mixer's name."""

    matrix: torch.Tensor
    axis: str
    value_name: str
    output_name: str
    blocks: torch.Tensor | None = None
    index: tuple[int, ...] | None = None
    start: int = 0
    source_start: int = 0
    layer: int | None = None
    mixer: str = ""


@dataclass(frozen=True)
class Selection:
    """What to compute: channels / heads `index` (a LongTensor [C], or None for a dense mixer),
    output rows [t0, t1), source columns [s0, s1), the arithmetic dtype."""

    index: torch.Tensor | None
    t0: int
    t1: int
    s0: int
    s1: int
    dtype: torch.dtype

    @property
    def rows(self) -> int:
        return self.t1 - self.t0

    @property
    def cols(self) -> int:
        return self.s1 - self.s0

    def live(self, t: int) -> int:
        """How many sources s0 .. min(t, s1 - 1) are inputs of y_t."""
        return max(0, min(t, self.s1 - 1) - self.s0 + 1)


def supported(model, layer: int) -> bool:
    return getattr(model.blocks[layer].mixer, "mixer_name", None) in COVERED  # (None: an MLP-only block)


def effective_attention(model, tokens: torch.Tensor, layer: int, index=None, window=None, sources=None,
                        dtype: torch.dtype = torch.float32, max_memory=None, progress: bool = True) -> EffectiveAttention:
    """The effective attention of block `layer`'s mixer on `tokens` [B, T], restricted to the
    selection (module docstring)."""
    return effective_attention_layers(model, tokens, [layer], index=index, window=window, sources=sources, dtype=dtype,
                                      max_memory=max_memory, progress=progress)[layer]


def effective_attention_layers(model, tokens: torch.Tensor, layers: Sequence[int], index=None, window=None,
                               sources=None, dtype: torch.dtype = torch.float32, max_memory=None,
                               progress: bool = True) -> dict[int, EffectiveAttention]:
    """{layer: EffectiveAttention} for each of `layers` from one forward pass, the same selection in
    each; refused up front (MemoryRefused) when all the results and the largest working set
    exceed the budget."""
    layers = _checked_layers(model, layers)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
    budget = budget_bytes(max_memory)
    with torch.no_grad():
        prepared = _prepared(model, tokens, layers)
        plans = {layer: _selection(model.blocks[layer].mixer, prepared[layer], index, window, sources, dtype)
                 for layer in layers}
        sizes = {layer: _estimate(model.blocks[layer].mixer, prepared[layer], plans[layer]) for layer in layers}
        needed = sum(result for result, _ in sizes.values()) + max(working for _, working in sizes.values())
        if needed > budget:
            raise refuse(f"effective attention of layers {layers} (selection {_describe(plans[layers[0]])})",
                         needed, budget, HINT)
        bar = progress_bar(len(layers), progress and len(layers) > 1, "effective attention", "layer", iterable=layers)
        return {layer: _compute(model.blocks[layer].mixer, prepared[layer], plans[layer], progress) for layer in bar}


def _checked_layers(model, layers) -> list[int]:
    if isinstance(layers, int) or not isinstance(layers, Sequence) or not layers:
        raise ValueError(f"layers must be a non-empty sequence of block indices; got {layers!r}")
    for layer in layers:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < len(model.blocks):
            raise ValueError(f"layer must be an int in [0, {len(model.blocks)}); got {layer!r}")
        if not supported(model, layer):
            raise ValueError(f"effective attention covers the mixers {COVERED}; block {layer} has "
                             f"{getattr(model.blocks[layer].mixer, 'mixer_name', 'no mixer')!r}")
    return list(dict.fromkeys(layers))


def _prepared(model, tokens: torch.Tensor, layers: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Each layer's mixer's prepared inputs on tokens (H3's also its values v and shifted keys
    kbar [B, T, C], read from hook_v and hook_conv), from one forward pass that stops once the
    last of them is read (no later block, no logits)."""
    names = {}
    for layer in layers:
        extra = ["hook_v", "hook_conv"] if model.blocks[layer].mixer.mixer_name == "h3" else []
        names[layer] = [f"blocks.{layer}.mixer.{n}" for n in ["hook_in", *extra]]
    found = _read(model, tokens, [n for group in names.values() for n in group])
    prepared = {}
    for layer in layers:
        inputs = model.blocks[layer].mixer.prepare(found[names[layer][0]])
        if len(names[layer]) > 1:
            inputs |= {"v": found[names[layer][1]].flatten(2), "kbar": found[names[layer][2]]}
        prepared[layer] = inputs
    return prepared


class _Read(Exception):
    """Every wanted activation is read: the forward pass stops here."""


def _read(model, tokens: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    """{name: activation} of the named hooks, the forward pass stopped after the last of them."""
    found = {}

    def read(x: torch.Tensor, hook) -> None:
        found[hook.name] = x.detach()
        if len(found) == len(names):
            raise _Read

    try:
        with model.hooks(readers=[(name, read) for name in names]):
            model(tokens)
    except _Read:
        pass
    missing = [name for name in names if name not in found]
    if missing:
        raise RuntimeError(f"the forward pass never reached the hooks {missing}")
    return found


def mixer_output(model, tokens: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of block `layer`'s mixer as the module docstring names them, from its own scan:
    x [B, T, C] or [B, T, C, d] (heads), y likewise; for checking M (y = M x)."""
    _checked_layers(model, [layer])
    mixer = model.blocks[layer].mixer
    with torch.no_grad():
        inputs = _prepared(model, tokens, [layer])[layer]
        if mixer.mixer_name in DELTA:
            return inputs["v"], mixer.scan(inputs)[0]  # [B, T, H, d] each
        states = mixer.scan(inputs)[1]
        if mixer.mixer_name in LINEAR:
            return inputs["v"], mixer.read_states(states, inputs["q"])
        if mixer.mixer_name in DENSE:
            return inputs["u"], states  # [B, T, n] each
        if mixer.mixer_name == "s4d":  # states [B, T, D, M] complex, C [D, M]
            return inputs["x"], 2 * (states * torch.view_as_complex(mixer.C)).sum(-1).real
        if mixer.mixer_name == "h3":  # states [B, T, C, N]
            return inputs["v"], inputs["q"] * (states * mixer.c).sum(-1)
        if mixer.mixer_name == "mamba2":  # states [B, T, H, P, N], C per head [B, T, H, N]
            return inputs["x"], (states * mixer.per_head(inputs["C"])[..., None, :]).sum(-1)
        y = (states * inputs["C"][..., None, :]).sum(-1)  # [B, T, E, N] x [B, T, 1, N]
        return inputs["x"], y.real if y.is_complex() else y


# --- selection and estimate -------------------------------------------------------------------

def _units(mixer, inputs) -> tuple[int, str]:
    """(how many channels / heads M has, the axis' name) of a mixer on its prepared inputs."""
    name = mixer.mixer_name
    if name in DENSE:
        return 1, "block norm"
    value = inputs["x"] if name in DIAGONAL or name == "s4d" else inputs["v"]
    return value.shape[2], ("head" if name == "mamba2" or name in DELTA + LINEAR else "channel")


def _selection(mixer, inputs, index, window, sources, dtype) -> Selection:
    """The checked selection of one layer (ValueError naming the argument otherwise)."""
    length = next(iter(inputs.values())).shape[1]
    units, axis = _units(mixer, inputs)
    t0, t1 = _span(window, length, "window")
    s0, s1 = (t0, t1) if sources is None else _span(sources, length, "sources")
    if mixer.mixer_name in DENSE:
        if index is not None:
            raise ValueError(f"index must be None for the dense mixer {mixer.mixer_name!r} (its M is n x n blocks, "
                             f"no channel or head axis); got {index!r}")
        return Selection(None, t0, t1, s0, s1, dtype)
    return Selection(_index(index, units, axis), t0, t1, s0, s1, dtype)


def _span(span, length: int, argument: str) -> tuple[int, int]:
    if span is None:
        return 0, length
    ok = isinstance(span, (tuple, list)) and len(span) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in span)
    if not ok or not 0 <= span[0] < span[1] <= length:
        raise ValueError(f"{argument} must be (start, stop) with 0 <= start < stop <= {length} (the length); "
                         f"got {span!r}")
    return span[0], span[1]


def _index(index, units: int, axis: str) -> torch.Tensor:
    """index (None, an int, a slice, a sequence or 1-D tensor of ints) -> LongTensor [C]."""
    if index is None:
        return torch.arange(units)
    if isinstance(index, slice):
        chosen = list(range(units))[index]
    elif isinstance(index, int) and not isinstance(index, bool):
        chosen = [index]
    elif isinstance(index, torch.Tensor) and index.dim() == 1 and not index.is_floating_point():
        chosen = index.tolist()
    elif isinstance(index, Sequence) and not isinstance(index, str) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in index):
        chosen = list(index)
    else:
        raise ValueError(f"index must be None, an int, a slice or a sequence of ints ({axis}s); got {index!r}")
    bad = [i for i in chosen if not 0 <= i < units]
    if not chosen or bad:
        raise ValueError(f"index must pick at least one {axis} in [0, {units}); got {index!r}"
                         + (f" (out of range: {bad[:5]})" if bad else " (empty)"))
    return torch.tensor(chosen, dtype=torch.long)


def _describe(plan: Selection) -> str:
    units = "" if plan.index is None else f"{len(plan.index)} channels / heads, "
    return f"{units}rows {plan.t0}:{plan.t1}, sources {plan.s0}:{plan.s1}, {str(plan.dtype).split('.')[-1]}"


def _estimate(mixer, inputs, plan: Selection) -> tuple[float, float]:
    """(bytes of the result, bytes of the working set) of one layer's computation."""
    item = torch.finfo(plan.dtype).bits // 8
    batch = next(iter(inputs.values())).shape[0]
    name, units = mixer.mixer_name, 1 if plan.index is None else len(plan.index)
    result = batch * units * plan.rows * plan.cols * item
    if name in DIAGONAL:
        wide = item * (2 if name in COMPLEX else 1)
        n = inputs["C"].shape[-1]
        steps = plan.t1 - plan.s0
        full = inputs["x"].shape[2] * n  # a chunk's terms over every channel (Mamba-2: head)
        return result, batch * n * units * wide * (4 * steps + 2 * plan.cols) + 3 * batch * CHUNK * full * wide * 2
    if name in INVARIANT:
        modes = (mixer.C if name == "s4d" else mixer.c).numel()  # the kernel's powers [every channel, N, T]
        return result, (2 * units + 2) * plan.rows * plan.cols * 8 + modes * plan.t1 * 16
    if name in DELTA:
        d = inputs["k"].shape[-1]
        return result, batch * units * d * item * (4 * (plan.t1 - plan.s0) + 3 * plan.cols)
    if name in LINEAR:
        features = taylor_features(inputs["q"][:1, :1, :1]).shape[-1]
        return result, batch * units * item * (2 * plan.t1 * features + 3 * CHUNK * plan.t1)
    n = inputs["u"].shape[-1]
    return result * (1 + n * n), batch * item * n * n * (2 * plan.cols + plan.t1)


# --- the computations ---------------------------------------------------------------------------

def _compute(mixer, inputs, plan: Selection, progress: bool) -> EffectiveAttention:
    name = mixer.mixer_name
    if name in DIAGONAL:
        result = _diagonal(mixer, inputs, plan, progress)
    elif name in INVARIANT:
        result = _invariant(mixer, inputs, plan)
    elif name in DELTA:
        result = _delta(mixer, inputs, plan, progress)
    elif name in LINEAR:
        result = _linear(inputs, plan, progress)
    else:
        result = _dense(mixer, inputs, plan, progress)
    result.index = None if plan.index is None else tuple(plan.index.tolist())
    result.start, result.source_start = plan.t0, plan.s0
    result.layer, result.mixer = mixer.layer_idx, name
    return result


def _steps(plan: Selection, progress: bool, what: str):
    """The steps t = s0 .. t1 - 1 the recurrences run, under a progress bar."""
    steps = range(plan.s0, plan.t1)
    return progress_bar(len(steps), progress, what, "step", iterable=steps)


def _complex(dtype: torch.dtype) -> torch.dtype:
    return torch.complex64 if dtype == torch.float32 else torch.complex128


def _diagonal_terms(mixer, inputs, plan: Selection):
    """(a, b, b_prev, C) over steps s0 .. t1 - 1 and the selected channels, each [B, W, C, N]
    (C [B, W, 1, N] where shared): h_t = a_t h_{t-1} + b_t x_t (+ b_prev_t x_{t-1}, Mamba-3);
    formed CHUNK steps at a time from transition_terms with a unit input."""
    wide = _complex(plan.dtype) if mixer.mixer_name in COMPLEX else plan.dtype
    heads = mixer.mixer_name == "mamba2"
    parts = {"a": [], "b": [], "b_prev": []}
    stop = max(plan.t1, plan.s0 + 1)  # at least one step, for the shapes when every source follows every row
    for start in range(plan.s0, stop, CHUNK):
        chunk = {k: v[:, start:min(start + CHUNK, stop)] for k, v in inputs.items()}
        x = chunk["x"][..., :1] if heads else chunk["x"]  # Mamba-2: one of a head's P channels
        ones, zeros = torch.ones_like(x), torch.zeros_like(x)
        unit = {**chunk, "x": ones} | ({"x_prev": zeros} if "x_prev" in chunk else {})
        a, b = mixer.transition_terms(unit)
        terms = {"a": a, "b": b}
        if "x_prev" in chunk:
            terms["b_prev"] = mixer.transition_terms({**chunk, "x": zeros, "x_prev": ones})[1]
        for key, value in terms.items():
            value = value[:, :, :, 0] if heads else value  # [B, w, H, 1, N] -> [B, w, H, N]
            parts[key].append(value[:, :, plan.index].to(wide))
    C = mixer.per_head(inputs["C"])[:, :, plan.index] if heads else inputs["C"][:, :, None]
    joined = {key: torch.cat(value, dim=1) if value else None for key, value in parts.items()}
    return joined["a"], joined["b"], joined["b_prev"], C[:, plan.s0:stop].to(wide)


def _diagonal(mixer, inputs, plan: Selection, progress: bool) -> EffectiveAttention:
    """Row by row: decay[:, s] is the coefficient of x_s in h_t (sources s0 .. s1 - 1); y_t's row
    is C_t . decay."""
    a, b, b_prev, C = _diagonal_terms(mixer, inputs, plan)
    batch, _, units, n = a.shape
    matrix = torch.zeros(batch, units, plan.rows, plan.cols, dtype=plan.dtype, device=a.device)
    decay = torch.zeros(batch, plan.cols, units, n, dtype=a.dtype, device=a.device)  # [B, S, C, N]
    for t in _steps(plan, progress, f"effective attention ({mixer.mixer_name})"):
        i, live = t - plan.s0, plan.live(t)
        decay[:, :live] *= a[:, i, None]
        if t < plan.s1:
            decay[:, i] = b[:, i]
        if b_prev is not None and plan.s0 < t <= plan.s1:
            decay[:, i - 1] += b_prev[:, i]
        if t >= plan.t0:
            weights = torch.einsum("bcn,bscn->bcs", C[:, i].expand(batch, units, n), decay[:, :live])
            matrix[:, :, t - plan.t0, :live] = weights.real if weights.is_complex() else weights  # Re(C h)
    axis = "head" if mixer.mixer_name == "mamba2" else "channel"
    return EffectiveAttention(matrix, axis, "x (the scanned input)", "C h (before D x and the gate)")


def _invariant(mixer, inputs, plan: Selection) -> EffectiveAttention:
    """s4d / h3: the convolution kernel K [C, T] as a Toeplitz matrix (times h3's q and kbar)."""
    x = inputs["x"] if mixer.mixer_name == "s4d" else inputs["v"]
    batch, length = x.shape[:2]
    if mixer.mixer_name == "s4d":
        kernel = mixer.convolution_kernel(plan.t1)[plan.index]  # [C, T] float64
    else:
        dt_a, _, bbar = (v.double()[plan.index] for v in mixer.discretised())  # [C, N]
        powers = (dt_a[:, :, None] * torch.arange(plan.t1, dtype=torch.float64, device=dt_a.device)).exp()
        kernel = torch.einsum("cn,cnl->cl", mixer.c.double()[plan.index] * bbar, powers)  # [C, T]
    lag = torch.arange(plan.t0, plan.t1)[:, None] - torch.arange(plan.s0, plan.s1)[None, :]  # t - s
    toeplitz = torch.where(lag >= 0, kernel[:, lag.clamp(min=0)], torch.zeros((), dtype=kernel.dtype))
    matrix = toeplitz.to(plan.dtype).expand(batch, *toeplitz.shape).clone()  # [B, C, T', S']
    if mixer.mixer_name == "s4d":
        return EffectiveAttention(matrix, "channel", "x (the mixer input)", "2 Re(C h) (before D x and the GELU)")
    q = inputs["q"][:, plan.t0:plan.t1, plan.index].to(plan.dtype).transpose(1, 2)  # [B, C, T']
    kbar = inputs["kbar"][:, plan.s0:plan.s1, plan.index].to(plan.dtype).transpose(1, 2)  # [B, C, S']
    matrix.mul_(q[..., :, None]).mul_(kbar[..., None, :])
    return EffectiveAttention(matrix, "channel", "v (the values)", "q * (C h) (before the skip Dskip u and out_proj)")


def _dense(mixer, inputs, plan: Selection, progress: bool) -> EffectiveAttention:
    """Products of the dense transitions, row by row: row[:, s] = A_t ... A_{s+1} [n, n]."""
    batch, n = inputs["u"].shape[0], inputs["u"].shape[-1]
    device = inputs["u"].device
    blocks = torch.zeros(batch, plan.rows, plan.cols, n, n, dtype=plan.dtype, device=device)
    row = torch.zeros(batch, plan.cols, n, n, dtype=plan.dtype, device=device)
    eye = torch.eye(n, dtype=plan.dtype, device=device)
    for t in _steps(plan, progress, f"effective attention ({mixer.mixer_name})"):
        before = plan.live(t - 1)  # sources s < t
        if before:
            transition = mixer.transition({name: value[:, t] for name, value in inputs.items()}).to(plan.dtype)
            row[:, :before] = transition[:, None] @ row[:, :before]
        if t < plan.s1:
            row[:, t - plan.s0] = eye
        if t >= plan.t0:
            blocks[:, t - plan.t0] = row
    norms = blocks.flatten(3).norm(dim=-1)[:, None]  # [B, 1, T', S']
    return EffectiveAttention(norms, "block norm", "u (the scanned input B x + b)", "h (the state out_proj reads)",
                              blocks)


def _delta(mixer, inputs, plan: Selection, progress: bool) -> EffectiveAttention:
    """Row by row: rows[:, s] = beta_s k_s^T A_{s+1} ... A_t (sources s0 .. s1 - 1), y_t's row
    rows . q_t."""
    steps = slice(plan.s0, plan.t1)
    q, k = (inputs[n][:, steps, plan.index].to(plan.dtype) for n in ("q", "k"))  # [B, W, H, d]
    beta = mixer._beta(inputs["beta"]) if hasattr(mixer, "_beta") else inputs["beta"]
    beta = beta[:, steps, plan.index].to(plan.dtype)  # [B, W, H]
    alpha = torch.exp(inputs["g"][:, steps, plan.index].to(plan.dtype)) if "g" in inputs else None
    if alpha is not None and alpha.dim() == 3:  # one decay a head: [B, W, H, 1]
        alpha = alpha[..., None]
    batch, _, heads, d = k.shape
    matrix = q.new_zeros(batch, heads, plan.rows, plan.cols)
    rows = q.new_zeros(batch, plan.cols, heads, d)
    for t in _steps(plan, progress, f"effective attention ({mixer.mixer_name})"):
        i, live = t - plan.s0, plan.live(t)
        kt, current = k[:, i, None], rows[:, :live]  # [B, 1, H, d], [B, s, H, d]
        if alpha is not None:  # r^T Diag(alpha_t), then the key removal
            current *= alpha[:, i, None]
        current -= beta[:, i, None, :, None] * (current * kt).sum(-1, keepdim=True) * kt
        if t < plan.s1:
            rows[:, i] = beta[:, i, :, None] * k[:, i]
        if t >= plan.t0:
            matrix[:, :, t - plan.t0, :live] = torch.einsum("bshd,bhd->bhs", rows[:, :live], q[:, i])
    return EffectiveAttention(matrix, "head", "v (the values)", "o = S q (before the output norm and gate)")


def _linear(inputs, plan: Selection, progress: bool) -> EffectiveAttention:
    """Blocks of CHUNK rows: phi(q_t) . phi(k_s) over every s <= t (the normaliser), then the
    selected sources."""
    fq, fk = (taylor_features(inputs[n][:, :plan.t1, plan.index].to(plan.dtype)).transpose(1, 2)
              for n in ("q", "k"))  # [B, H, T, F]
    batch, heads = fq.shape[:2]
    matrix = fq.new_zeros(batch, heads, plan.rows, plan.cols)
    starts = range(plan.t0, plan.t1, CHUNK)
    bar = progress_bar(len(starts), progress and len(starts) > 1, "effective attention (based)", "block")
    for r0 in starts:
        r1 = min(r0 + CHUNK, plan.t1)
        kernel = fq[:, :, r0:r1] @ fk[:, :, :r1].transpose(-1, -2)  # [B, H, rows, r1]
        kernel = kernel.tril(r0)  # s <= t
        kernel /= kernel.sum(-1, keepdim=True)
        stop = min(plan.s1, r1)
        if stop > plan.s0:
            matrix[:, :, r0 - plan.t0:r1 - plan.t0, :stop - plan.s0] = kernel[..., plan.s0:stop]
        bar.update()
    bar.close()
    return EffectiveAttention(matrix, "head", "v (the values)",
                              "the normalised linear attention (before out_proj and the window branch)")
