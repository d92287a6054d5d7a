"""transformers Lfm2ForCausalLM -> a hybrid stack of our "lfm2_conv" and "attention" mixers (one
per layer, config.layer_types "conv" / "full_attention"), each followed by a SwiGLU MLP, RMSNorm
everywhere.

Layout: conv.in_proj -> mixer.in_proj (rows [B | C | x], the gates and the values of
models/mixers/lfm2_conv.py), conv.conv [C, 1, W] -> mixer.conv_weight [C, W] (W = conv_L_cache),
conv.out_proj -> mixer.out_proj; conv_bias puts biases on all three (mixer_options bias).
self_attn.q_proj / k_proj / v_proj -> mixer.qkv, out_proj -> mixer.out_proj, q_layernorm /
k_layernorm (RMSNorm over each head's d_head with norm_eps, before RoPE) -> the attention's
qk_norm (mixer.q_norm / k_norm), RoPE with rope_theta (only the default rope type). feed_forward.w1 / w3 /
w2 -> mlp.gate / up / down (down(silu(w1 x) * w3 x), its width as the source built it:
block_auto_adjust_ff_dim is read from the module); operator_norm / ffn_norm -> norm_mixer /
norm_mlp; model.embedding_norm (despite the name, the norm after the last layer) -> norm_final.

Hook names: a conv layer's window is blocks.{l}.mixer.hook_state [B, T, C, W] and its conv output
blocks.{l}.mixer.hook_conv [B, T, C]; an attention layer has the attention hooks. Everything of
the architecture is representable; a hidden_act other than silu or a scaled RoPE raises.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import hybrid
from models.interop.convert import SourceWeights, require, rope_base

KINDS = {"conv": "lfm2_conv", "full_attention": "attention"}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu", None)
    kinds = hybrid.layer_kinds(config, "layer_types", KINDS, f"entries in {sorted(KINDS)}")
    attention = "attention" in kinds
    layers = source.model.layers
    d_head = next((layer.self_attn.head_dim for layer in layers if layer.is_attention_layer), None)
    eps = float(config.norm_eps)
    options = {"lfm2_conv": {"bias": bool(config.conv_bias)}}
    if attention:
        options["attention"] = {"rope_base": rope_base(config), "qk_norm": True}
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_head=d_head,
        attention_bias=False, positional="rope" if attention else "none", d_conv=config.conv_L_cache,
        norm="rmsnorm", norm_eps=eps, mlp=True, d_mlp=layers[0].feed_forward.w1.out_features,
        mlp_activation="swiglu", mlp_bias=False, tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options=options,
    )
    weights = SourceWeights(source)
    layers = partial(block_weights, weights, bool(config.conv_bias))
    return cfg, hybrid.stack_weights(weights, kinds, layers, norm_final="embedding_norm")


def block_weights(weights: SourceWeights, conv_bias: bool, layer: int, kind: str, theirs: str, ours: str) -> dict:
    """LFM2 layer `theirs` (short conv or attention, SwiGLU feed_forward w1 / w3 / w2, two norms) -> our block."""
    if kind == "attention":
        state = attention_weights(weights, f"{theirs}.self_attn", f"{ours}.mixer")
    else:
        state = conv_weights(weights, f"{theirs}.conv", f"{ours}.mixer", conv_bias)
    state |= {f"{ours}.mlp.{mine}.weight": weights.take(f"{theirs}.feed_forward.{name}.weight")
              for name, mine in (("w1", "gate"), ("w3", "up"), ("w2", "down"))}
    return state | hybrid.block_norms(weights, theirs, ours, "operator_norm", "ffn_norm")


def attention_weights(weights: SourceWeights, theirs: str, ours: str) -> dict[str, torch.Tensor]:
    """Lfm2Attention -> our attention mixer with qk_norm."""
    take = weights.take
    return {f"{ours}.qkv.weight": torch.cat([take(f"{theirs}.{n}_proj.weight") for n in "qkv"]),
            f"{ours}.out_proj.weight": take(f"{theirs}.out_proj.weight"),
            f"{ours}.q_norm.weight": take(f"{theirs}.q_layernorm.weight"),
            f"{ours}.k_norm.weight": take(f"{theirs}.k_layernorm.weight")}


def conv_weights(weights: SourceWeights, theirs: str, ours: str, bias: bool) -> dict[str, torch.Tensor]:
    """Lfm2ShortConv -> our lfm2_conv mixer."""
    take = weights.take
    state = {f"{ours}.in_proj.weight": take(f"{theirs}.in_proj.weight"),
             f"{ours}.conv_weight": take(f"{theirs}.conv.weight", lambda w: w[:, 0]),
             f"{ours}.out_proj.weight": take(f"{theirs}.out_proj.weight")}
    if bias:
        state |= {f"{ours}.in_proj.bias": take(f"{theirs}.in_proj.bias"),
                  f"{ours}.conv_bias": take(f"{theirs}.conv.bias"),
                  f"{ours}.out_proj.bias": take(f"{theirs}.out_proj.bias")}
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
