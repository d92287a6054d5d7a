"""Multi-head Latent Attention (MLA; DeepSeek-V2) as transformers' Kimi Linear defines it: keys and
values come from one low-rank latent shared by every head, and no positions enter (NoPE: the
"rope" part of the key is a shared key slice that is not rotated).

H = cfg.n_heads heads; query / key width d_qk = d_nope + d_rope, value width d_v. From the mixer
input x_t [d_model]:

    q_t      = W_q x_t                    [H, d_qk]   (q_lora_rank r_q: W_qb RMSNorm(W_qa x_t))
    [c_t | kr_t] = W_kva x_t              c_t [r] (kv_lora_rank), kr_t [d_rope] (shared by the heads)
    c_t      <- RMSNorm(c_t)              the latent
    [kn_t | v_t] = W_kvb c_t              per head kn_t [H, d_nope], v_t [H, d_v]
    k_t      = [kn_t | kr_t]              [H, d_qk]
    A[s, t]  = softmax_{t <= s}( q_s . k_t / sqrt(d_qk) )          (causal)
    z_s      = sum_{t <= s} A[s, t] v_t                            [H, d_v]
    y_s      = W_o [z_s^1, ..., z_s^H]

The latent norms (q's and c's) have eps latent_norm_eps (1e-6, transformers' default for them).
cfg.attention_bias: biases in W_qa, W_kva and W_o (transformers' attention_bias); W_q, W_qb and
W_kvb have none. cfg.n_kv_heads must be None or n_heads (every head has its own key and value).

Hooks: hook_q [B, T, H, d_qk], hook_latent [B, T, r] (the normed latent c, before W_kvb: a patch
there changes every head's keys and values), hook_k [B, T, H, d_qk], hook_v [B, T, H, d_v],
hook_attn_scores [B, H, T, T], hook_pattern [B, H, T, T], hook_z [B, T, H, d_v], hook_result
[B, T, H, d_model] (per-head shares of W_o's output, summing with W_o's bias to hook_out), hook_out.
No hook_state: attention has no recurrent state. The attention itself (fast SDPA path, explicit
pattern path for hooks, hook_result) is models.mixers.attention's.

Decoding (models.decoding): a KV cache of the hooked per-head keys and values, keys in
[B, H, T, d_qk] and values in [B, H, T, d_v] of two [B, H, T, max(d_qk, d_v)] buffers (the
narrower one zero-padded), not the r + d_rope latent transformers caches: a patch on hook_k,
hook_v or hook_latent at a position then stays in the cache for every later token, as in a full
forward. Memory per position and layer: 2 H max(d_qk, d_v) elements.

mixer_options: q_lora_rank (None: a full-rank W_q), kv_lora_rank (32), qk_nope_head_dim (None:
cfg.head_dim), qk_rope_head_dim (8; 0 for none), v_head_dim (None: cfg.head_dim), latent_norm_eps
(1e-6).
"""

from __future__ import annotations

import torch
from torch import nn

from models.hooks import HookPoint
from models.mixers.attention import Attention
from models.mixers.base import Mixer, linear_size, mixer_options, register_mixer

OPTIONS = {"q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": None, "qk_rope_head_dim": 8,
           "v_head_dim": None, "latent_norm_eps": 1e-6}


def _options(cfg) -> dict:
    opts = mixer_options(cfg, OPTIONS)
    for name, low in (("q_lora_rank", 1), ("kv_lora_rank", 1), ("qk_nope_head_dim", 1), ("qk_rope_head_dim", 0),
                      ("v_head_dim", 1)):
        value = opts[name]
        optional = name in ("q_lora_rank", "qk_nope_head_dim", "v_head_dim")
        if (value is None and not optional) or (value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < low)):
            raise ValueError(f"mla mixer_options[{name!r}] must be {'None or ' if optional else ''}an int >= {low}; "
                             f"got {value!r}")
    if cfg.kv_heads != cfg.n_heads:
        raise ValueError(f"mla has one key and value per head (from the shared latent); got n_kv_heads={cfg.n_kv_heads} "
                         f"with n_heads={cfg.n_heads} (allowed: None or n_heads)")
    eps = opts["latent_norm_eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"mla mixer_options['latent_norm_eps'] must be a positive float; got {eps!r}")
    return {**opts, "qk_nope_head_dim": opts["qk_nope_head_dim"] or cfg.head_dim,
            "v_head_dim": opts["v_head_dim"] or cfg.head_dim}


@register_mixer("mla", mlp=True, n_layers=2, d_model=64, n_heads=4, norm="rmsnorm")
class MultiHeadLatentAttention(Mixer):
    attend = Attention.attend  # causal attention of per-head q, k, v -> W_o, with the attention hooks

    def __init__(self, cfg, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        opts = self.options = _options(cfg)
        self.n_heads = cfg.n_heads
        self.d_nope, self.d_rope, self.d_v = opts["qk_nope_head_dim"], opts["qk_rope_head_dim"], opts["v_head_dim"]
        self.d_qk, rank, bias = self.d_nope + self.d_rope, opts["kv_lora_rank"], cfg.attention_bias
        self.n_kv, self.d_head = self.n_heads, max(self.d_qk, self.d_v)  # the KV cache's buffers (models.decoding)
        eps = float(opts["latent_norm_eps"])
        if opts["q_lora_rank"] is None:
            self.q_proj = nn.Linear(cfg.d_model, self.n_heads * self.d_qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(cfg.d_model, opts["q_lora_rank"], bias=bias)
            self.q_a_norm = nn.RMSNorm(opts["q_lora_rank"], eps=eps)
            self.q_b_proj = nn.Linear(opts["q_lora_rank"], self.n_heads * self.d_qk, bias=False)
        self.kv_a_proj = nn.Linear(cfg.d_model, rank + self.d_rope, bias=bias)
        self.kv_a_norm = nn.RMSNorm(rank, eps=eps)
        self.kv_b_proj = nn.Linear(rank, self.n_heads * (self.d_nope + self.d_v), bias=False)
        self.out_proj = nn.Linear(self.n_heads * self.d_v, cfg.d_model, bias=bias)
        for name in ("hook_q", "hook_latent", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z",
                     "hook_result"):
            setattr(self, name, HookPoint())

    @classmethod
    def element_counts(cls, cfg, layer_idx: int) -> tuple[int, int]:
        opts, d, heads, bias = _options(cfg), cfg.d_model, cfg.n_heads, cfg.attention_bias
        d_qk = opts["qk_nope_head_dim"] + opts["qk_rope_head_dim"]
        rank, q_rank = opts["kv_lora_rank"], opts["q_lora_rank"]
        q = (linear_size(d, heads * d_qk, False) if q_rank is None
             else linear_size(d, q_rank, bias) + q_rank + linear_size(q_rank, heads * d_qk, False))
        return (q + linear_size(d, rank + opts["qk_rope_head_dim"], bias) + rank
                + linear_size(rank, heads * (opts["qk_nope_head_dim"] + opts["v_head_dim"]), False)
                + linear_size(heads * opts["v_head_dim"], d, bias)), 0

    def heads(self, x: torch.Tensor, queries_from: int = 0):
        """x [B, T, D] -> q [B, H, Tq, d_qk] (the last Tq = T - queries_from positions), k
        [B, H, T, d_qk], v [B, H, T, d_v]; hooks q / latent / k / v."""
        batch, length, _ = x.shape
        xq = x[:, queries_from:]
        q = self.q_proj(xq) if hasattr(self, "q_proj") else self.q_b_proj(self.q_a_norm(self.q_a_proj(xq)))
        q = self.hook_q(q.view(batch, length - queries_from, self.n_heads, self.d_qk))
        latent, k_rope = self.kv_a_proj(x).split([self.kv_a_norm.normalized_shape[0], self.d_rope], dim=-1)
        latent = self.hook_latent(self.kv_a_norm(latent))  # [B, T, r]
        k_nope, v = self.kv_b_proj(latent).view(batch, length, self.n_heads, -1).split([self.d_nope, self.d_v], dim=-1)
        k = torch.cat([k_nope, k_rope[:, :, None].expand(-1, -1, self.n_heads, -1)], dim=-1)
        return q.transpose(1, 2), self.hook_k(k).transpose(1, 2), self.hook_v(v).transpose(1, 2)

    def mix(self, x: torch.Tensor, queries_from: int = 0) -> torch.Tensor:  # [B, T, D] -> [B, T - queries_from, D]
        return self.attend(*self.heads(x, queries_from))

    def mix_cached(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
        """One decoding call (models.decoding): x [B, n, D] at positions start, ..., start + n - 1;
        keys, values [B, H, >= start + n, max(d_qk, d_v)] buffers whose first d_qk / d_v columns
        hold the keys / values of positions < start. Writes this call's and returns [B, n, D]."""
        q, k, v = self.heads(x)
        end = start + x.shape[1]
        keys[:, :, start:end, : self.d_qk] = k
        values[:, :, start:end, : self.d_v] = v
        return self.attend(q, keys[:, :, :end, : self.d_qk], values[:, :, :end, : self.d_v])

    def resume(self, x: torch.Tensor, before: torch.Tensor, carry=None) -> torch.Tensor:
        """Mixer.resume with queries at the resumed positions only (keys and values everywhere)."""
        return self.hook_out(self.mix(self.hook_in(torch.cat([before, x], dim=1)), before.shape[1]))
