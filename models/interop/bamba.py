"""transformers BambaForCausalLM -> a hybrid stack of our "mamba2" and "attention" mixers (one per
layer: config.layers_block_type "linear_attention" / "full_attention"), each followed by a SwiGLU
MLP, RMSNorm everywhere (the Jamba layout with Mamba-2 in place of Mamba).

Attention: Llama's (q/k/v_proj -> qkv, o_proj -> out_proj, grouped-query heads, biases
attention_bias) with RoPE on the first half of each head (Bamba fixes partial_rotary_factor 0.5:
our attention's option of that name; rope_theta -> rope_base; rope scaling raises). Mamba-2: as
models.interop.mamba2 (mixer_weights), heads mamba_n_heads x mamba_d_head, mamba_n_groups,
mamba_conv_bias, mamba_proj_bias, the gated norm's eps rms_norm_eps, time_step_limit -> dt_limit.
feed_forward.{gate,up,down}_proj -> mlp.{gate,up,down}; input_layernorm / pre_ff_layernorm ->
norm_mixer / norm_mlp, final_layernorm -> norm_final, embed_tokens -> embed, lm_head -> unembed.

Refused (UnsupportedConfig): hidden_act other than silu, rope scaling. GraniteMoeHybrid
(models.interop.granitemoehybrid) reuses these pieces.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from models.config import ModelConfig
from models.interop import hybrid, mamba2 as mamba2_layout
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.llama import attention_weights, swiglu_weights

KINDS = {"linear_attention": "mamba2", "full_attention": "attention"}


def layer_kinds(config: Any) -> list[str]:
    """Our mixer per layer from config.layers_block_type."""
    return hybrid.layer_kinds(config, "layers_block_type", KINDS, f"layers of the kinds {sorted(KINDS)}")


def rotary_options(config: Any) -> dict:
    """Our attention's rope_base and partial_rotary_factor from config.rope_parameters (plain RoPE;
    any scaling raises)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "default") != "default":
        raise unsupported(config, "rope_parameters", params, "rope_type 'default' (no scaling)")
    return {"rope_base": float(params.get("rope_theta", 10000.0)),
            "partial_rotary_factor": float(params.get("partial_rotary_factor", 1.0))}


def mamba2_options(config: Any, eps: float) -> dict:
    """Our mamba2 mixer_options from a Bamba-style config (mamba_* fields, time_step_limit)."""
    return {"n_heads": config.mamba_n_heads, "head_dim": config.mamba_d_head, "n_groups": config.mamba_n_groups,
            "conv_bias": bool(config.mamba_conv_bias), "bias": bool(config.mamba_proj_bias), "norm_eps": eps,
            "dt_limit": mamba2_layout.dt_limit(config)}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    kinds = layer_kinds(config)
    eps = float(config.rms_norm_eps)
    rope = "attention" in kinds
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=len(kinds),
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
        d_head=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        attention_bias=bool(config.attention_bias), positional="rope" if rope else "none",
        d_state=config.mamba_d_state, d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=True,
        d_mlp=config.intermediate_size, mlp_activation="swiglu", mlp_bias=bool(config.mlp_bias),
        tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options={"mamba2": mamba2_options(config, eps)} | ({"attention": rotary_options(config)} if rope else {}),
    )
    weights = SourceWeights(source)
    return cfg, hybrid.stack_weights(weights, kinds, partial(block_weights, weights, config, cfg))


def block_weights(weights: SourceWeights, config: Any, cfg: ModelConfig, layer: int, kind: str, theirs: str,
                  ours: str) -> dict:
    """Bamba layer `theirs` (Mamba-2 or attention, SwiGLU MLP, two norms) -> our block."""
    return (mixer_weights(weights, config, kind, theirs, ours)
            | swiglu_weights(weights, f"{theirs}.feed_forward", f"{ours}.mlp", cfg.mlp_bias)
            | hybrid.block_norms(weights, theirs, ours))


def mixer_weights(weights: SourceWeights, config: Any, kind: str, theirs: str, ours: str) -> dict:
    """Layer `theirs`'s mamba (a Bamba-style Mamba-2) or self_attn -> our blocks' mixer."""
    if kind == "attention":
        return attention_weights(weights, f"{theirs}.self_attn", f"{ours}.mixer", bool(config.attention_bias))
    return mamba2_layout.mixer_weights(weights, f"{theirs}.mamba", f"{ours}.mixer", config.mamba_conv_bias,
                                       config.mamba_proj_bias)


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
