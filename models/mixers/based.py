"""Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput
tradeoff"): Taylor linear attention + sliding-window softmax attention + a short convolution.

Per layer, with H heads, feature dim f (mixer_options["feature_dim"]), d_head = cfg.head_dim:

    u_t = shortconv(x)_t                                 depthwise causal, width d_conv   [D]
    q_t = W_q u_t,  k_t = W_k u_t   [H, f];   v_t = W_v u_t   [H, d_head]
    phi(z) = [1, z', vec(z' z'^T) / sqrt(2)],  z' = z / f^(1/4)      (1 + f + f^2 features)
          so phi(q) . phi(k) = 1 + s + s^2 / 2 with s = q . k / sqrt(f) (2nd-order Taylor of e^s)
    S_t = S_{t-1} + phi(k_t) [v_t; 1]^T        S_0 = 0,  state [H, 1 + f + f^2, d_head + 1]
    lin_t = (phi(q_t)^T S_t)[:d_head] / (phi(q_t)^T S_t)[d_head]       (normalised linear attention)
    swa_t = sliding-window causal softmax attention of x over the last `window` positions
            (own W_q', W_k', W_v', H heads of d_head; positions t - window < s <= t)
    y_t = W_o lin_t + W_o' swa_t

The paper's language models stack three kinds of layers (Taylor linear attention, sliding-window
attention with a small window, and short gated convolutions) and assign them to different depths.
For the two-layer retrieval models studied here every layer holds all three primitives, summed as
above, so each layer has both the global recurrent memory and the exact local lookback.
window = 0 drops the sliding-window part (the Zoology-style linear-attention-plus-conv layer).

The last column of S holds the normaliser sum_t phi(k_t), so the whole linear-attention state is
one tensor. The update is affine with identity transition (is_affine, transition = 1).
phi(q).phi(k) >= 1/2, so the normaliser of an unpatched run is >= (t + 1) / 2 and needs no epsilon.
The sliding window reads only x (never S), so prepare() computes it (inputs["swa"], after W_o')
and the scan carries S alone. The window reads the pattern's band only: a hook writing
hook_pattern outside positions t - window < s <= t changes nothing.

Hooks: hook_conv [B, T, D] (short-conv output), hook_q, hook_k [B, T, H, f] (before phi),
hook_v [B, T, H, d_head], hook_state [B, T, H, 1 + f + f^2, d_head + 1] (causal patches),
hook_pattern [B, H, T, T] (sliding-window softmax probabilities; only when window > 0).

Fast path: the parallel form lin = (M o K)[V, 1] with K[s, t] = 1 + s_st + s_st^2 / 2 and M the
causal mask (the state is never built), plus scaled_dot_product_attention with a band mask;
from a carried state S_0 (fast_segment) phi(q_t)^T S_0 is added to the numerator and the final
state is S_0 + phi(K)^T [V, 1]. Instrumented path: the state recurrence above (per-step states,
patchable) and the explicit window pattern.

Decoding (models.decoding) carries S, the short conv's last d_conv - 1 inputs and the window's
last window - 1 keys and values (Mixer.convolve's conv_carry: "conv", "swa_keys", "swa_values"
[B, H, <= window - 1, d_head]): a new token costs O(1) in the prefix length. Its hook_pattern
is [B, H, 1, t + 1] over absolute key positions (zero outside the window).

mixer_options: feature_dim (int >= 1, default 16), window (int >= 0, default 64, the paper's size).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.hooks import HookPoint
from models.mixers.base import RecurrentMixer, linear_size, mixer_options, register_mixer

OPTIONS = {"feature_dim": 16, "window": 64}


def taylor_features(z: torch.Tensor) -> torch.Tensor:
    """phi(z) = [1, z', vec(z' z'^T)/sqrt(2)], z' = z / f^(1/4): [..., f] -> [..., 1 + f + f^2]."""
    f = z.shape[-1]
    z = z / f**0.25
    second = (z[..., :, None] * z[..., None, :]).flatten(-2) / math.sqrt(2)
    return torch.cat([torch.ones_like(z[..., :1]), z, second], dim=-1)


def window_mask(length: int, window: int, device) -> torch.Tensor:
    """[T, T] bool, True where query s may attend key t: s - window < t <= s."""
    offset = torch.arange(length, device=device)[:, None] - torch.arange(length, device=device)
    return (offset >= 0) & (offset < window)


def _options(cfg) -> dict:
    options = mixer_options(cfg, OPTIONS)
    feature_dim, window = options["feature_dim"], options["window"]
    if not isinstance(feature_dim, int) or isinstance(feature_dim, bool) or feature_dim < 1:
        raise ValueError(f"mixer_options['feature_dim'] must be a positive int; got {feature_dim!r}")
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        raise ValueError(f"mixer_options['window'] must be an int >= 0 (0 = no SWA); got {window!r}")
    return options


@register_mixer("based", n_layers=2, mlp=True, d_conv=3, norm="layernorm")
class Based(RecurrentMixer):
    is_affine = True
    carries_conv = True  # decoding carries the short conv's and the window's inputs (conv_carry)

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        options = _options(cfg)
        self.feature_dim, self.window = options["feature_dim"], options["window"]
        d, h, f = cfg.d_model, cfg.n_heads, self.feature_dim
        self.n_heads, self.d_head = h, cfg.head_dim
        self.resume_context = max(cfg.d_conv - 1, self.window - 1)  # prepare() reads that far back
        self.state_shape = (h, 1 + f + f * f, self.d_head + 1)
        self.conv_weight = nn.Parameter(torch.randn(d, cfg.d_conv) / math.sqrt(cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(d))
        self.proj_qk = nn.Linear(d, 2 * h * f, bias=False)
        self.proj_v = nn.Linear(d, h * self.d_head, bias=False)
        self.out_proj = nn.Linear(h * self.d_head, d)
        self.hook_conv = HookPoint()
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        if self.window:
            self.swa_qkv = nn.Linear(d, 3 * h * self.d_head)
            self.swa_out = nn.Linear(h * self.d_head, d)
            self.hook_pattern = HookPoint()

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        options = _options(cfg)
        d, h, f, inner = cfg.d_model, cfg.n_heads, options["feature_dim"], cfg.n_heads * cfg.head_dim
        window = linear_size(d, 3 * inner) + linear_size(inner, d) if options["window"] else 0
        return (d * (cfg.d_conv + 1) + linear_size(d, 2 * h * f, False) + linear_size(d, inner, False)
                + linear_size(inner, d) + window), 0

    # --- linear attention as a recurrence ---------------------------------------------------
    def prepare(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, length, _ = x.shape
        u = self.hook_conv(self.convolve(x, self.conv_weight, self.conv_bias))  # [B, T, D]
        qk = self.proj_qk(u).view(batch, length, 2, self.n_heads, self.feature_dim)
        q, k = self.hook_q(qk[:, :, 0]), self.hook_k(qk[:, :, 1])  # [B, T, H, f]
        v = self.hook_v(self.proj_v(u).view(batch, length, self.n_heads, self.d_head))
        inputs = {"q": q, "k": k, "v": v}
        if self.window:
            inputs["swa"] = self.swa_out(self.sliding_window(x))  # [B, T, D]
        return inputs

    def step(self, inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        phi_k = taylor_features(inputs_t["k"])  # [B, H, F]
        v1 = torch.cat([inputs_t["v"], torch.ones_like(inputs_t["v"][..., :1])], dim=-1)  # [B, H, dh+1]
        return h + phi_k[..., :, None] * v1[..., None, :]  # [B, H, F, dh+1]

    def transition(self, inputs_t: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs_t["k"].new_ones(inputs_t["k"].shape[0], *self.state_shape)

    def read_states(self, states: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """states [B, T, H, F, dh+1], q [B, T, H, f] -> normalised linear attention [B, T, H, dh]."""
        out = torch.einsum("bthf,bthfe->bthe", taylor_features(q), states)
        return out[..., :-1] / out[..., -1:]

    def parallel(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The same linear attention in its masked quadratic form -> [B, T, H, dh]."""
        num = self.parallel_terms(inputs)
        return num[..., :-1] / num[..., -1:]

    def parallel_terms(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(M o K) [V, 1], the numerator and (last column) the normaliser from S_0 = 0 -> [B, T, H, dh + 1]."""
        q, k, v = (inputs[n].transpose(1, 2) for n in ("q", "k", "v"))  # [B, H, T, .]
        s = q @ k.transpose(-1, -2) / math.sqrt(self.feature_dim)  # [B, H, T, T]
        kernel = (1 + s + s.square() / 2).tril()
        num = torch.cat([kernel @ v, kernel.sum(-1, keepdim=True)], dim=-1)  # [B, H, T, dh + 1]
        return num.transpose(1, 2)

    def fast_segment(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None):
        """(output [B, T, D], S after the last step [B, H, F, dh+1]) from S_0 = initial: the
        parallel form plus phi(q_t)^T S_0; the final state S_0 + phi(K)^T [V, 1]."""
        if x.shape[1] == 1:  # one step: the recurrence itself (elementwise: no batch-dependent rounding)
            h = self.initial_state(x.shape[0], x) if initial is None else initial
            final = self.step({k: v[:, 0] for k, v in inputs.items()}, h)  # [B, H, F, dh+1]
            num = (taylor_features(inputs["q"][:, 0])[..., None] * final).sum(-2)[:, None]  # [B, 1, H, dh+1]
        else:
            phi_k = taylor_features(inputs["k"])  # [B, T, H, F]
            v1 = torch.cat([inputs["v"], torch.ones_like(inputs["v"][..., :1])], dim=-1)  # [B, T, H, dh+1]
            total = torch.einsum("bthf,bthe->bhfe", phi_k, v1)
            num = self.parallel_terms(inputs)
            if initial is not None:
                num = num + torch.einsum("bthf,bhfe->bthe", taylor_features(inputs["q"]), initial)
            final = total if initial is None else initial + total
        return self.combine(num[..., :-1] / num[..., -1:], inputs), final

    # --- sliding-window attention and output ----------------------------------------------
    def sliding_window(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, H*dh]
        """Softmax attention over the last `window` positions; while decoding (conv_carry) the
        keys and values of the window - 1 positions before x come from the carry, which keeps them."""
        batch, length, _ = x.shape
        qkv = self.swa_qkv(x).view(batch, length, 3, self.n_heads, self.d_head).transpose(1, 3)
        q, k, v = qkv.unbind(dim=2)  # [B, H, T, dh]
        if self.conv_carry is not None:
            k, v = (torch.cat([self.conv_carry[key], new], dim=2) if key in self.conv_carry else new
                    for key, new in (("swa_keys", k), ("swa_values", v)))  # [B, H, c + T, dh]
            keep = max(k.shape[2] - (self.window - 1), 0)
            self.conv_carry["swa_keys"], self.conv_carry["swa_values"] = k[:, :, keep:], v[:, :, keep:]
        context = k.shape[2] - length  # carried positions before x
        allowed = window_mask(k.shape[2], self.window, x.device)[context:]  # [T, c + T]
        if self.use_instrumented(self.hook_pattern):
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.d_head)
            band = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
            before = getattr(self.hook_pattern, "position", 0) - context  # earlier positions, not carried
            pattern = self.hook_pattern(F.pad(band, (before, 0)))[..., before:]  # [B, H, T, position + T]
            z = pattern.masked_fill(~allowed, 0.0) @ v
        elif length == 1:  # one query: every carried key is in its window
            z = F.scaled_dot_product_attention(q, k, v)
        else:
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return z.transpose(1, 2).reshape(batch, length, -1)

    def combine(self, lin: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        y = self.out_proj(lin.flatten(2))  # [B, T, D]
        return y + inputs["swa"] if self.window else y

    def readout(self, x, states, inputs) -> torch.Tensor:
        return self.combine(self.read_states(states, inputs["q"]), inputs)

    def mix(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, D]
        """Its own: the parallel form, or the instrumented path while hook_state is in use (StatePatches
        are pinned, not run declared: float32 rounding of the parallel form against a set state
        exceeds the 1e-6 the declared runs keep)."""
        inputs = self.prepare(x)
        if self.use_instrumented(self.hook_state):
            return self.instrumented_forward(x, inputs)
        return self.combine(self.parallel(inputs), inputs)

    def fast_from(self, x: torch.Tensor, inputs: dict[str, torch.Tensor], initial=None) -> torch.Tensor:
        return self.fast_segment(x, inputs, initial)[0]
