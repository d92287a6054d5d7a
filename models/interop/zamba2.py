"""transformers Zamba2ForCausalLM -> a stack of our "mamba2" blocks (no MLP), the "hybrid" layers
with a shared transformer branch (Block's "shared + mixer" layout, models.backbone.SharedBranch):

    t = linear_l(mlp(pre_ff_norm(attention(input_norm([x | e])))))   e: the embedding
    x <- x + mamba(norm(x + t))

Hooks of the shared transformer at hybrid layer l: blocks.{l}.shared.* (norm_attn, attn.hook_q /
hook_pattern / ..., norm_mlp, mlp.hook_pre / hook_post, hook_out = t), one set per depth; the
Mamba-2 at layer l: blocks.{l}.mixer.* as everywhere. Zamba2 shares the transformer's weights
across depths (num_mem_blocks of them, used in turn) and gives each depth its own LoRA adapters
(q, k, v and gate_up: W + B A) and its own linear_l; ours holds each depth's effective weights:
the adapters folded in (W + B A), linear_l folded into the MLP's down map (linear_l @ down), so
the math and every hook are the source's while the parameters are per depth (memory: one copy of
the shared block per hybrid layer). Attention: q/k/v/o_proj -> qkv, out_proj, its scale
(head_dim / 2)^-1/2 as ours (head_dim)^-1/2 with the query rows times sqrt(2) (hook_q holds them
so), RoPE where use_mem_rope (rope_theta over attention_head_dim). MLP: gate_up_proj
[gate | up] -> gate, up with GELU ("geglu", hidden_act gelu) or SiLU ("swiglu", silu).
Mamba-2 (models.interop.mamba2.mixer_weights): n_mamba_heads x mamba_headdim, mamba_ngroups,
use_conv_bias, add_bias_linear, the gated norm's eps rms_norm_eps, the dt clamp (time_step_min,
inf) of transformers' scan. embed_tokens -> embed, final_layernorm -> norm_final.

Refused (UnsupportedConfig): hidden_act other than gelu / silu, rope scaling, grouped-query heads
with attention adapters (the adapters write num_attention_heads heads; the source fails there).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import mamba2 as mamba2_layout
from models.interop.bamba import rotary_options
from models.interop.convert import SourceWeights, require, unsupported

ACTIVATIONS = {"gelu": "geglu", "silu": "swiglu"}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    act = require(config, "hidden_act", *ACTIVATIONS)
    types = list(config.layers_block_type)
    if any(kind not in ("linear_attention", "hybrid") for kind in types):
        raise unsupported(config, "layers_block_type", types, "'linear_attention' (Mamba-2) and 'hybrid' layers")
    if config.use_shared_attention_adapter and config.num_key_value_heads != config.num_attention_heads:
        raise unsupported(config, "num_key_value_heads", config.num_key_value_heads,  # (the source fails too)
                          f"num_attention_heads={config.num_attention_heads} with shared attention adapters")
    hybrid = [kind == "hybrid" for kind in types]
    eps, bias = float(config.rms_norm_eps), bool(config.add_bias_linear)
    options = {"mamba2": {"n_heads": config.n_mamba_heads, "head_dim": config.mamba_headdim,
                          "n_groups": config.mamba_ngroups, "conv_bias": bool(config.use_conv_bias), "bias": bias,
                          "norm_eps": eps, "dt_limit": [float(config.time_step_min), math.inf]}}
    if any(hybrid):
        options["attention"] = rotary_options(config) if config.use_mem_rope else {}
    cfg = ModelConfig(
        mixer="mamba2", shared_block=hybrid, vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=len(types), n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
        d_head=config.attention_head_dim, attention_bias=False,
        positional="rope" if config.use_mem_rope and any(hybrid) else "none", d_state=config.mamba_d_state,
        d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=False, d_mlp=config.intermediate_size,
        mlp_activation=ACTIVATIONS[act], mlp_bias=bias,
        tie_embeddings=source.lm_head.weight is source.model.embed_tokens.weight, mixer_options=options,
    )
    weights = SourceWeights(source, ignore=other_depths_adapters(config))
    take = weights.take
    state = {"embed.weight": take("model.embed_tokens.weight")}
    for layer, shared in enumerate(hybrid):
        theirs, ours = f"model.layers.{layer}", f"blocks.{layer}"
        mamba = f"{theirs}.mamba_decoder" if shared else theirs
        state |= mamba2_layout.mixer_weights(weights, f"{mamba}.mamba", f"{ours}.mixer", config.use_conv_bias, bias)
        state[f"{ours}.norm_mixer.weight"] = take(f"{mamba}.input_layernorm.weight")
        if shared:
            state |= shared_weights(weights, config, cfg, layer, f"{ours}.shared")
    state["norm_final.weight"] = take("model.final_layernorm.weight")
    state["unembed.weight"] = take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state


def other_depths_adapters(config) -> list[str]:
    """Patterns of the adapter weights listed under a hybrid layer's shared_transformer that belong
    to another depth (tied copies of that depth's: each depth takes its own)."""
    ids = list(config.hybrid_layer_ids)
    return [rf"model\.layers\.{layer}\.shared_transformer\..*adapter_list\.{other}\..*"
            for use, layer in enumerate(ids) for other in range(len(ids)) if other != use]


def adapted(weights: SourceWeights, base: str, adapter: str) -> torch.Tensor:
    """A projection's weight with its LoRA adapter folded in: W + B A (W alone without one)."""
    weight = weights.take(f"{base}.weight")
    if not weights.has(f"{adapter}.0.weight"):
        return weight
    return weight + weights.take(f"{adapter}.1.weight") @ weights.take(f"{adapter}.0.weight")


def shared_weights(weights: SourceWeights, config, cfg: ModelConfig, layer: int, ours: str) -> dict:
    """The shared transformer as used at hybrid layer `layer` -> our blocks.{layer}.shared."""
    use, theirs = list(config.hybrid_layer_ids).index(layer), f"model.layers.{layer}.shared_transformer"
    take = weights.take
    attn = f"{theirs}.self_attn"
    q, k, v = (adapted(weights, f"{attn}.{n}_proj", f"{attn}.linear_{n}_adapter_list.{use}") for n in "qkv")
    state = {f"{ours}.attn.qkv.weight": torch.cat([q * math.sqrt(2.0), k, v]),
             f"{ours}.attn.out_proj.weight": take(f"{attn}.o_proj.weight"),
             f"{ours}.norm_attn.weight": take(f"{theirs}.input_layernorm.weight"),
             f"{ours}.norm_mlp.weight": take(f"{theirs}.pre_ff_layernorm.weight")}
    mlp = f"{theirs}.feed_forward"
    gate_up = adapted(weights, f"{mlp}.gate_up_proj", f"{mlp}.gate_up_proj_adapter_list.{use}")
    gate, up = gate_up.chunk(2, dim=0)  # (copies: our gate and up must not share one storage)
    state[f"{ours}.mlp.gate.weight"], state[f"{ours}.mlp.up.weight"] = gate.clone(), up.clone()
    linear = take(f"model.layers.{layer}.linear.weight")  # [D, D]
    state[f"{ours}.mlp.down.weight"] = linear @ take(f"{mlp}.down_proj.weight")
    if cfg.mlp_bias:
        state[f"{ours}.mlp.gate.bias"], state[f"{ours}.mlp.up.bias"] = take(f"{mlp}.gate_up_proj.bias").chunk(2)
        state[f"{ours}.mlp.down.bias"] = linear @ take(f"{mlp}.down_proj.bias")
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
