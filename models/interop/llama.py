"""transformers LlamaForCausalLM -> our "attention" stack with RMSNorm, RoPE, a SwiGLU MLP and
grouped-query attention.

Layout: self_attn.q_proj / k_proj / v_proj [H d | G d | G d, D] are concatenated into our fused
qkv (heads contiguous, as transformers' view(..., -1, head_dim)); o_proj -> mixer.out_proj;
mlp.gate_proj / up_proj / down_proj -> mlp.gate / up / down (down(silu(gate x) * up x));
input_layernorm / post_attention_layernorm -> norm_mixer / norm_mlp, model.norm -> norm_final,
embed_tokens -> embed, lm_head -> unembed. RoPE rotates pairs (i, i + d/2) (rotate_half), the
same as ours; only the default rope type (no scaling) is representable. transformers computes
its RMSNorm and rotary tables in float32, so float64 parity is float32-close only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, rope_base


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    require(config, "pretraining_tp", 1, None)
    cfg = ModelConfig(
        mixer="attention", vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads, d_head=config.head_dim, positional="rope",
        norm="rmsnorm", norm_eps=float(config.rms_norm_eps), mlp=True, d_mlp=config.intermediate_size,
        mlp_activation="swiglu", mlp_bias=bool(config.mlp_bias), attention_bias=bool(config.attention_bias),
        tie_embeddings=bool(config.tie_word_embeddings), mixer_options={"rope_base": rope_base(config)},
    )
    return cfg, stack_weights(SourceWeights(source), cfg)


def stack_weights(weights: SourceWeights, cfg: ModelConfig, mlp: Callable[[str, str, int], dict] | None = None,
                  extra: Callable[[str, str], dict] | None = None) -> dict:
    """Our state dict of a Llama-style stack (model.embed_tokens, model.layers.{l}, model.norm,
    lm_head; nothing left over): per layer the attention, the MLP (mlp(theirs, ours, layer);
    default a SwiGLU with cfg.mlp_bias), the two norms and extra(theirs, ours) (more weights of
    the layer, shared by Llama's relatives)."""
    take = weights.take
    state = {"embed.weight": take("model.embed_tokens.weight")}
    for layer in range(cfg.n_layers):
        theirs, ours = f"model.layers.{layer}", f"blocks.{layer}"
        state |= attention_weights(weights, f"{theirs}.self_attn", f"{ours}.mixer", cfg.attention_bias)
        state |= (mlp(f"{theirs}.mlp", f"{ours}.mlp", layer) if mlp
                  else swiglu_weights(weights, f"{theirs}.mlp", f"{ours}.mlp", cfg.mlp_bias))
        state[f"{ours}.norm_mixer.weight"] = take(f"{theirs}.input_layernorm.weight")
        state[f"{ours}.norm_mlp.weight"] = take(f"{theirs}.post_attention_layernorm.weight")
        state |= extra(theirs, ours) if extra else {}
    state["norm_final.weight"] = take("model.norm.weight")
    state["unembed.weight"] = take("lm_head.weight")
    weights.check_all_taken()
    return state


def attention_weights(weights: SourceWeights, theirs: str, ours: str, bias: bool) -> dict:
    """q/k/v/o_proj (Llama-style attention, shared by the hybrids' converters) -> qkv, out_proj."""
    params = ("weight", "bias") if bias else ("weight",)
    state = {f"{ours}.qkv.{p}": torch.cat([weights.take(f"{theirs}.{n}_proj.{p}") for n in "qkv"]) for p in params}
    return state | {f"{ours}.out_proj.{p}": weights.take(f"{theirs}.o_proj.{p}") for p in params}


def swiglu_weights(weights: SourceWeights, theirs: str, ours: str, bias: bool) -> dict:
    """gate/up/down_proj (a Llama-style MLP, shared by the hybrids' converters) -> gate, up, down."""
    params = ("weight", "bias") if bias else ("weight",)
    return {f"{ours}.{n}.{p}": weights.take(f"{theirs}.{n}_proj.{p}") for n in ("gate", "up", "down") for p in params}


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
