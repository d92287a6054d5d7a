"""Causal multi-head softmax attention (GPT-2 style).

For each head h (d_head = cfg.head_dim, H = cfg.n_heads, G = cfg.kv_heads key/value heads):

    q_t = W_q x_t  [H, d_head],   k_t = W_k x_t,   v_t = W_v x_t  [G, d_head]   (one qkv map [q|k|v])
    (grouped-query attention, G < H: query head h reads key/value head h // (H / G))
    (qk_norm: q_t <- RMSNorm(q_t), k_t <- RMSNorm(k_t) per head over d_head, one weight [d_head]
     each for queries and keys, eps cfg.norm_eps; before the rotary map)
    (positional="rope": q_t <- R_t q_t, k_t <- R_t k_t, R_t rotates pairs (i, i + r/2) of the
     first r = int(d_head * partial_rotary_factor) dims by the angle t * base^(-2i/r), the other
     d_head - r dims pass through; so q_s . k_t depends only on t - s)
    A[s, t] = softmax_{t <= s}( q_s . k_t / sqrt(d_head) )                 (causal)
    z_s     = sum_{t <= s} A[s, t] v_t
    (output_gate: z_s <- z_s * sigmoid(W_g x_s), W_g [H d_head, d_model], elementwise per head)
    y_s     = W_o [z_s^1, ..., z_s^H]

positional="learned" adds a learned position embedding in the backbone (SequenceModel.pos_embed);
"none" uses no positions. Attention has no recurrent state: it is not a RecurrentMixer and has no
hook_state.

Hooks: hook_q [B, T, H, d_head], hook_k, hook_v [B, T, G, d_head] (the projections, q and k before
the qk norm and the rotary map, as in TransformerLens, so a patched q/k is normed and rotated for
the position it is placed at), hook_attn_scores [B, H, T, T] (q_s . k_t / sqrt(d_head), -inf after
the query), hook_pattern [B, H, T, T] (the softmax probabilities A), hook_gate [B, T, H, d_head]
(sigmoid(W_g x_s), output_gate only), hook_z [B, T, H, d_head] (z_s per head, gated: what W_o
reads; with the gate the pattern-weighted values are hook_z / hook_gate), hook_result
[B, T, H, d_model] (W_o's head-h columns times z_s^h: their sum over heads plus W_o's bias is
hook_out), hook_out.

Per-head inputs (TransformerLens' use_split_qkv_input / use_attn_in), opt-in: hook_attn_in
[B, T, H, D] (H copies of the block's residual before its norm), hook_q_input [B, T, H, D] (copies
of hook_attn_in), hook_k_input / hook_v_input [B, T, G, D] (its first G copies, as TL's); each
copy is normed by the block's norm (without its hook_scale, which sees the residual once) and
projected by its own head's rows of qkv, so a hook can edit one head's input. This path runs only
while one of these four is requested (a hook function, a reader, a gradient probe: taken by name
only, never by names=None, a predicate or the forced instrumented path; Block hands the residual
over when reads_residual()); otherwise they cost nothing. A patch on hook_in then is refused (q, k
and v would not see it); decoding, resumed runs and a shared branch's attention refuse them.

Fast path: torch.nn.functional.scaled_dot_product_attention (is_causal). The explicit path
(the output from the materialised pattern) runs when hook_attn_scores or hook_pattern is patched
or probed for a gradient, or the instrumented path is forced, or no gradient is recorded; while
they are only read (cached) under grad mode, scores and pattern are formed for the readers
without autograd (on the CPU by one C pass, models.kernels.native.softmax) and the output still
comes from SDPA (its backward, not the explicit one's). hook_result is formed only while it is
read or patched (models.mixers.base.head_outputs).

mixer_options: rope_base (float, default 10000.0), the base of the rotary frequencies;
partial_rotary_factor (float in (0, 1], default 1.0: every dim rotated; r must be even);
qk_norm (bool, default False; weights q_norm.weight, k_norm.weight [d_head]); output_gate (bool,
default False; weights gate_proj [H d_head, d_model], with a bias when cfg.attention_bias).
cfg.attention_bias: biases in the qkv, gate and output maps.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.hooks import HookPoint, only_read
from models.kernels.native import softmax as native_softmax
from models.kernels.native.library import fresh  # huge-page advised on the CPU: first-touch page
# faults of a fresh [B, H, T, T] tensor cost about as much as the op that fills it
from models.mixers.base import Mixer, head_outputs, linear_size, mixer_options, register_mixer

OPTIONS = {"rope_base": 10000.0, "partial_rotary_factor": 1.0, "qk_norm": False, "output_gate": False}


def rotary_tables(length: int, d_head: int, base: float, like: torch.Tensor,
                  start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, d_head] for the rotation of pairs (i, i + d_head/2) by t * base^(-2i/d_head) at
    positions t = start, ..., start + T - 1."""
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # [d_head/2]
    angles = torch.arange(start, start + length, dtype=torch.float64)[:, None] * inv_freq  # [T, d_head/2]
    angles = torch.cat([angles, angles], dim=-1)  # [T, d_head]
    return angles.cos().to(like), angles.sin().to(like)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, d_head] rotated per position: x * cos + rotate_half(x) * sin on the first r dims
    (cos, sin [T, r], r <= d_head), the rest passed through."""
    r = cos.shape[-1]
    part, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    first, second = part.chunk(2, dim=-1)
    rotated = part * cos[:, None, :] + torch.cat([-second, first], dim=-1) * sin[:, None, :]
    return rotated if rest is None else torch.cat([rotated, rest], dim=-1)


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    for name in ("qk_norm", "output_gate"):
        if not isinstance(opts[name], bool):
            raise TypeError(f"attention mixer_options[{name!r}] must be a bool; got {opts[name]!r}")
    factor = opts["partial_rotary_factor"]
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise ValueError(f"attention mixer_options['partial_rotary_factor'] must be a float in (0, 1]; got {factor!r}")
    rotary = int(cfg.head_dim * factor)
    if cfg.positional == "rope" and (rotary < 2 or rotary % 2):
        raise ValueError(f"positional='rope' needs an even d_head (with partial_rotary_factor an even number "
                         f"r = int(d_head * partial_rotary_factor) >= 2 of rotated dims); got d_head={cfg.head_dim}, "
                         f"partial_rotary_factor={factor!r} (r = {rotary})")
    return {**opts, "rotary_dim": rotary}


def causal_mask(n_queries: int, n_keys: int, device) -> torch.Tensor:
    """[Tq, Tk] bool, True where query s (the last Tq of the Tk positions) may attend key t <= s."""
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


def recording(*tensors: torch.Tensor) -> bool:
    """Whether autograd records operations on these tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def causal_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [B, H, Tq, d] (the last Tq positions), k [B, H, Tk, d] -> scaled scores [B, H, Tq, Tk],
    -inf for keys after the query. One fresh [B, H, Tq, Tk] tensor (scaled and masked in place);
    while autograd does not record, written into a `fresh` one (same values)."""
    product = (q @ k.transpose(-1, -2) if recording(q, k)
               else torch.matmul(q, k.transpose(-1, -2), out=fresh((*q.shape[:3], k.shape[2]), q)))
    allowed = causal_mask(q.shape[2], k.shape[2], q.device)
    masked = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
    return product.div_(math.sqrt(q.shape[-1])).add_(masked)  # + 0 or -inf: masked_fill's values, 1.4x faster


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax over the keys of causal_scores' scores -> the pattern [B, H, Tq, Tk] (zero for keys
    after the query); while autograd does not record, written into a `fresh` tensor."""
    return scores.softmax(dim=-1) if recording(scores) else torch.softmax(scores, -1, out=fresh(scores.shape, scores))


def causal_pattern(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The softmax probabilities [B, H, Tq, Tk] of causal_scores, zero for keys after the query."""
    return causal_softmax(causal_scores(q, k))


def scores_and_pattern(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(causal_scores, their causal_softmax) [B, H, Tq, Tk] for readers, without autograd: on the
    CPU one C pass (models.kernels.native.softmax: products and exp over the allowed keys only;
    within 1e-6 of torch's values, not bit-equal, so the explicit path that computes z from the
    pattern keeps torch's ops)."""
    if native_softmax.supported(q, k):
        return native_softmax.causal_scores_and_pattern(q, k)
    product = torch.matmul(q, k.transpose(-1, -2), out=fresh((*q.shape[:3], k.shape[2]), q))
    allowed = causal_mask(q.shape[2], k.shape[2], q.device)
    scores = product.div_(math.sqrt(q.shape[-1])).masked_fill_(~allowed, float("-inf"))
    return scores, causal_softmax(scores)


class AttentionWeights:
    """TransformerLens' W_Q [H, D, d], W_K / W_V [G, D, d], W_O [H, d, D], b_Q [H, d], b_K / b_V
    [G, d], b_O [D] (zeros where there is no bias) on the attention mixer, as views of qkv (the
    fused [(H + 2 G) d, D] map) and out_proj [D, H d] (models.tl.surface)."""

    tl_weights = True  # what models.tl.surface.block_attention looks for

    def _qkv_rows(self, part: int, weight: bool) -> torch.Tensor:
        H, G, d = self.n_heads, self.n_kv, self.d_head
        rows = (slice(0, H), slice(H, H + G), slice(H + G, H + 2 * G))[part]
        if weight:
            return self.qkv.weight.unflatten(0, (H + 2 * G, d))[rows].transpose(1, 2)  # [heads, D, d]
        if self.qkv.bias is None:
            return self.qkv.weight.new_zeros(rows.stop - rows.start, d)
        return self.qkv.bias.unflatten(0, (H + 2 * G, d))[rows]  # [heads, d]

    @property
    def W_Q(self) -> torch.Tensor:
        return self._qkv_rows(0, True)

    @property
    def W_K(self) -> torch.Tensor:
        return self._qkv_rows(1, True)

    @property
    def W_V(self) -> torch.Tensor:
        return self._qkv_rows(2, True)

    @property
    def b_Q(self) -> torch.Tensor:
        return self._qkv_rows(0, False)

    @property
    def b_K(self) -> torch.Tensor:
        return self._qkv_rows(1, False)

    @property
    def b_V(self) -> torch.Tensor:
        return self._qkv_rows(2, False)

    @property
    def W_O(self) -> torch.Tensor:  # [H, d, D]
        return self.out_proj.weight.t().unflatten(0, (self.n_heads, self.d_head))

    @property
    def b_O(self) -> torch.Tensor:  # [D]
        bias = self.out_proj.bias
        return self.out_proj.weight.new_zeros(self.out_proj.out_features) if bias is None else bias



@register_mixer(
    "attention",
    presets={"transformer": dict(mlp=True, positional="learned", n_layers=2, norm="layernorm")},
    mlp=True, positional="learned", n_layers=2, norm="layernorm",
)
class Attention(AttentionWeights, Mixer):
    rotary_positions = True

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.options = _options(cfg)
        self.n_heads, self.n_kv, self.d_head = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        inner = self.n_heads * self.d_head
        self.qkv = nn.Linear(cfg.d_model, (self.n_heads + 2 * self.n_kv) * self.d_head, bias=cfg.attention_bias)
        if self.options["qk_norm"]:
            self.q_norm = nn.RMSNorm(self.d_head, eps=cfg.norm_eps)
            self.k_norm = nn.RMSNorm(self.d_head, eps=cfg.norm_eps)
        if self.options["output_gate"]:
            self.gate_proj = nn.Linear(cfg.d_model, inner, bias=cfg.attention_bias)
            self.hook_gate = HookPoint()
        self.out_proj = nn.Linear(inner, cfg.d_model, bias=cfg.attention_bias)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.hook_z, self.hook_result = HookPoint(), HookPoint()
        self.hook_attn_in, self.hook_q_input = HookPoint(opt_in=True), HookPoint(opt_in=True)
        self.hook_k_input, self.hook_v_input = HookPoint(opt_in=True), HookPoint(opt_in=True)

        # hook_attn_in, hook_q_input, hook_k_input, hook_v_input (a tuple: not registered twice)
        self.input_hooks = (self.hook_attn_in, self.hook_q_input, self.hook_k_input, self.hook_v_input)

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d, bias = _options(cfg), cfg.d_model, cfg.attention_bias
        inner = cfg.n_heads * cfg.head_dim
        return (linear_size(d, (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias) + linear_size(inner, d, bias)
                + 2 * cfg.head_dim * opts["qk_norm"] + linear_size(d, inner, bias) * opts["output_gate"]), 0

    def reads_residual(self) -> bool:
        """Whether a per-head input hook (hook_attn_in, hook_q/k/v_input) is requested: the block
        then hands forward the residual before its norm (module docstring)."""
        return any(hook.is_requested for hook in self.input_hooks)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, norm: nn.Module | None = None):
        """hook_out(mix(hook_in(x))) for x [B, T, D] the normed input; with the block's residual
        [B, T, D] before its norm (Block passes it while reads_residual()), through the per-head
        inputs: q, k, v from per-head copies of the residual, each copy normed by `norm`."""
        if residual is None:
            if self.reads_residual():
                raise ValueError(f"{self.input_hooks[0].name.rsplit('.', 1)[0]}: the per-head input hooks (hook_attn_in, "
                                 "hook_q/k/v_input) need the residual before the norm, which only a block's own "
                                 "mixer is given (not a shared branch's attention, a resumed run or decoding)")
            return super().forward(x)
        x = self.hook_in(x)
        if self.hook_in.is_patched:
            raise ValueError(f"{self.hook_in.name!r} is patched while a per-head input hook of the same mixer is "
                             "requested: q, k and v are then computed from the per-head copies of the residual and "
                             "would not see the patch (TransformerLens ignores it silently); patch one of them")
        return self.hook_out(self.attend(*self.heads(x, projected=self.per_head_projections(residual, norm))))

    def per_head_projections(self, residual: torch.Tensor, norm: nn.Module | None):
        """q [B, T, H, d_head], k, v [B, T, G, d_head] from per-head copies of residual [B, T, D]
        (hooks attn_in [B, T, H, D], then q_input [B, T, H, D], k_input / v_input the first G
        copies [B, T, G, D]), each copy normed by norm without its hook_scale, then projected by
        its own head's rows of qkv."""
        if not isinstance(self.qkv, nn.Linear):
            raise ValueError(f"the per-head input hooks need a plain qkv map; {self.hook_in.name!r} has "
                             f"{type(self.qkv).__name__}")
        H, G, d = self.n_heads, self.n_kv, self.d_head
        attn_in = residual[:, :, None].expand(-1, -1, H, -1)  # [B, T, H, D], a view
        if self.hook_attn_in.is_requested:
            attn_in = self.hook_attn_in(attn_in.contiguous())
        inputs = [attn_in, attn_in[:, :, :G], attn_in[:, :, :G]]
        weight = self.qkv.weight.view(H + 2 * G, d, -1)  # [H + 2 G, d_head, D]
        bias = None if self.qkv.bias is None else self.qkv.bias.view(H + 2 * G, d)
        out = []
        for hook, x, rows in zip(self.input_hooks[1:], inputs, (slice(0, H), slice(H, H + G), slice(H + G, None))):
            if hook.is_requested:
                x = hook(x.contiguous())
            x = unhooked_norm(norm, x)
            y = torch.einsum("bthi,hdi->bthd", x, weight[rows])  # [B, T, heads, d_head]
            out.append(y if bias is None else y + bias[rows])
        return out

    def heads(self, x: torch.Tensor, start: int = 0, queries_from: int = 0, projected=None):
        """x [B, T, D] (positions start, ..., start + T - 1) -> q [B, H, Tq, d_head] (the last
        Tq = T - queries_from positions), k, v [B, G, T, d_head], normed and rotated, and the
        output gate [B, Tq, H, d_head] (None without output_gate); hooks q / k / v / gate.
        projected: (q [B, T, H, d_head], k, v [B, T, G, d_head]) to use instead of qkv(x)."""
        batch, length, _ = x.shape
        if projected is None:
            heads = self.qkv(x).view(batch, length, self.n_heads + 2 * self.n_kv, self.d_head)
            projected = (heads[:, :, : self.n_heads], heads[:, :, self.n_heads : self.n_heads + self.n_kv],
                         heads[:, :, self.n_heads + self.n_kv :])
        q = self.hook_q(projected[0][:, queries_from:])  # [B, Tq, H, d_head]
        k = self.hook_k(projected[1])  # [B, T, G, d_head]
        v = self.hook_v(projected[2])
        if self.options["qk_norm"]:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.cfg.positional == "rope":
            cos, sin = rotary_tables(length, self.options["rotary_dim"], float(self.options["rope_base"]), q, start)
            q = apply_rotary(q, cos[queries_from:], sin[queries_from:])
            k = apply_rotary(k, cos, sin)
        gate = None
        if self.options["output_gate"]:
            gate = self.hook_gate(torch.sigmoid(self.gate_proj(x[:, queries_from:])).view(q.shape))
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), gate

    def mix(self, x: torch.Tensor, queries_from: int = 0) -> torch.Tensor:  # [B, T, D] -> [B, T - queries_from, D]
        """Outputs at positions queries_from, ..., T - 1 (all of them by default)."""
        return self.attend(*self.heads(x, 0, queries_from))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of queries q [B, H, Tq, d_head] (rotated; the last Tq of the Tk key
        positions) over keys k and values v [B, G, Tk, d_head], times the output gate [B, Tq, H,
        d_head] when given -> the output [B, Tq, D] (hooks scores / pattern / z / result on the way)."""
        explicit = self.use_instrumented(self.hook_attn_scores, self.hook_pattern)
        if self.n_kv < self.n_heads and (explicit or 1 < q.shape[2] < k.shape[2]):  # else SDPA's enable_gqa
            k, v = (t.repeat_interleave(self.n_heads // self.n_kv, dim=1) for t in (k, v))  # [B, H, Tk, d_head]
        elif v.untyped_storage().data_ptr() != q.untyped_storage().data_ptr():
            # q and k are rotated copies, so the v that SDPA saves for its backward would be the one
            # view keeping the whole fused qkv output alive: a copy of v frees it (at Llama 125M,
            # T 2048, forward+backward: 8.4 MB a layer, autograd then saves what transformers' does)
            v = v.contiguous()
        if (explicit and recording(q, k, v) and self.execution_path != "instrumented"
                and only_read(self.hook_attn_scores, self.hook_pattern)):
            with torch.no_grad():  # for the readers
                scores, pattern = scores_and_pattern(q, k)
                self.hook_attn_scores(scores)
                self.hook_pattern(pattern)
            explicit = False  # nothing replaces them, no gradient is taken at them: z by SDPA, whose
            # backward is the saving (without a gradient pattern @ v is the cheaper way to z)
        if explicit:
            z = self.hook_pattern(causal_softmax(self.hook_attn_scores(causal_scores(q, k)))) @ v  # [B, H, Tq, d_head]
        elif q.shape[2] == k.shape[2]:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] < q.shape[1])
        else:  # the last queries (one query, decoding: every key, no mask)
            mask = None if q.shape[2] == 1 else causal_mask(q.shape[2], k.shape[2], q.device)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] < q.shape[1])
        if not explicit and self.hook_z.is_patched and torch.is_grad_enabled():
            z = z.clone()  # SDPA's backward reads its output: a patch editing z in place (TL's habit) must not
        z = z.transpose(1, 2)  # [B, Tq, H, d_head]
        return head_outputs(z if gate is None else z * gate, self.out_proj, self.hook_z, self.hook_result)

    def mix_cached(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """One decoding call with a KV cache (models.decoding): x [B, n, D] the mixer input (after
        hook_in) at positions start, ..., start + n - 1; keys, values [B, G, >= start + n, d_head]
        buffers holding the (rotated) keys and the values of positions < start. Writes this
        call's keys and values at [start, start + n) and returns the output [B, n, D] (before
        hook_out), the queries attending every cached position: O(start) per new token, no
        earlier position recomputed. The hooks see the n new positions only (scores / pattern
        [B, H, n, start + n])."""
        self.refuse_per_head_inputs("decoding")
        q, k, v, gate = self.heads(x, start)
        keys[:, :, start : start + x.shape[1]] = k
        values[:, :, start : start + x.shape[1]] = v
        return self.attend(q, keys[:, :, : start + x.shape[1]], values[:, :, : start + x.shape[1]], gate)

    def resume(self, x: torch.Tensor, before: torch.Tensor, carry=None) -> torch.Tensor:
        """Mixer.resume with queries at the resumed positions only (keys and values everywhere)."""
        self.refuse_per_head_inputs("a resumed run")
        return self.hook_out(self.mix(self.hook_in(torch.cat([before, x], dim=1)), before.shape[1]))

    def refuse_per_head_inputs(self, where: str) -> None:
        if self.reads_residual():
            raise ValueError(f"the per-head input hooks of {self.hook_in.name.rsplit('.', 1)[0]!r} (hook_attn_in, "
                             f"hook_q/k/v_input) are not available in {where}: run the model forward")


def unhooked_norm(norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    """norm over the last axis of x [..., D] without firing its hook_scale (torch's own norm on
    the module's weights; None or an identity: x)."""
    for base in (nn.LayerNorm, nn.RMSNorm):
        if isinstance(norm, base):
            return base.forward(norm, x)
    return x if norm is None else norm(x)
