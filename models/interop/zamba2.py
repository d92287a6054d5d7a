"""transformers Zamba2ForCausalLM -> a stack of our "mamba2" blocks (no MLP), the "hybrid" layers
with a shared transformer branch (Block's "shared + mixer" layout, models.backbone.SharedBranch):

    t = linear_l(mlp(pre_ff_norm(attention(input_norm([x | e])))))   e: the embedding
    x <- x + mamba(norm(x + t))

Hooks of the shared transformer at hybrid layer l: blocks.{l}.shared.* (norm_attn, attn.hook_q /
hook_pattern / ..., norm_mlp, mlp.hook_pre / hook_post, hook_out = t), one set per depth; the
Mamba-2 at layer l: blocks.{l}.mixer.* as everywhere. Zamba2 shares the transformer's weights
across depths (num_mem_blocks of them, used in turn: ModelConfig.shared_block names the one each
layer runs) and gives each depth its own LoRA adapters (q, k, v and gate_up: W x + B A x) and its
own linear_l; ours ties the shared weights the same way (one tensor per shared block, so an edit
reaches every depth that runs it) and keeps each depth's adapters (shared_adapter_rank =
adapter_rank; zeros for q, k, v where use_shared_attention_adapter is off) and linear_l
(shared.proj). Attention: q/k/v/o_proj -> qkv, out_proj, its scale
(head_dim / 2)^-1/2 as ours (head_dim)^-1/2 with the query rows times sqrt(2) (hook_q holds them
so), RoPE where use_mem_rope (rope_theta over attention_head_dim). MLP: gate_up_proj
[gate | up] -> gate, up with GELU ("geglu", hidden_act gelu) or SiLU ("swiglu", silu).
Mamba-2 (models.interop.mamba2.mixer_weights): n_mamba_heads x mamba_headdim, mamba_ngroups,
use_conv_bias, add_bias_linear, the gated norm's eps 1e-5 (fixed by transformers; rms_norm_eps
is the other norms'), the dt clamp (time_step_min, inf) of transformers' scan. embed_tokens ->
embed, final_layernorm -> norm_final.

Refused (UnsupportedConfig): hidden_act other than gelu / silu, rope scaling, grouped-query heads
with attention adapters (the adapters write num_attention_heads heads; the source fails there).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from models.config import ModelConfig
from models.interop import mamba2 as mamba2_layout
from models.interop.bamba import rotary_options
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.hybrid import layer_kinds, stack_weights

ACTIVATIONS = {"gelu": "geglu", "silu": "swiglu"}
GATED_NORM_EPS = 1e-5  # transformers' Zamba2MambaMixer fixes its gated norm's eps (not rms_norm_eps)


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    act = require(config, "hidden_act", *ACTIVATIONS)
    hybrid = layer_kinds(config, "layers_block_type", {"linear_attention": False, "hybrid": True},
                         "'linear_attention' (Mamba-2) and 'hybrid' layers")
    if config.use_shared_attention_adapter and config.num_key_value_heads != config.num_attention_heads:
        raise unsupported(config, "num_key_value_heads", config.num_key_value_heads,  # (the source fails too)
                          f"num_attention_heads={config.num_attention_heads} with shared attention adapters")
    eps, bias = float(config.rms_norm_eps), bool(config.add_bias_linear)
    options = {"mamba2": {"n_heads": config.n_mamba_heads, "head_dim": config.mamba_headdim,
                          "n_groups": config.mamba_ngroups, "conv_bias": bool(config.use_conv_bias), "bias": bias,
                          "norm_eps": GATED_NORM_EPS, "dt_limit": [float(config.time_step_min), math.inf]}}
    if any(hybrid):
        options["attention"] = rotary_options(config) if config.use_mem_rope else {}
    cfg = ModelConfig(
        mixer="mamba2", shared_block=shared_indices(config, hybrid), shared_adapter_rank=config.adapter_rank,
        vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=len(hybrid), n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
        d_head=config.attention_head_dim, attention_bias=False,
        positional="rope" if config.use_mem_rope and any(hybrid) else "none", d_state=config.mamba_d_state,
        d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=False, d_mlp=config.intermediate_size,
        mlp_activation=ACTIVATIONS[act], mlp_bias=bias,
        tie_embeddings=source.lm_head.weight is source.model.embed_tokens.weight, mixer_options=options,
    )
    weights = SourceWeights(source, ignore=other_depths_adapters(config))
    return cfg, stack_weights(weights, hybrid, partial(block_weights, weights, config, cfg))


def block_weights(weights: SourceWeights, config, cfg: ModelConfig, layer: int, shared: bool, theirs: str,
                  ours: str) -> dict:
    """Zamba2 layer `theirs` (its Mamba-2 and norm; at a hybrid layer the shared transformer) -> our block."""
    mamba = f"{theirs}.mamba_decoder" if shared else theirs
    state = mamba2_layout.mixer_weights(weights, f"{mamba}.mamba", f"{ours}.mixer", config.use_conv_bias,
                                        cfg.mlp_bias)
    state[f"{ours}.norm_mixer.weight"] = weights.take(f"{mamba}.input_layernorm.weight")
    if shared:
        state |= shared_weights(weights, config, cfg, layer, f"{ours}.shared")
    return state


def shared_indices(config, hybrid: list[bool]) -> list[int | None]:
    """The shared transformer each layer runs: hybrid layers take the num_mem_blocks in turn."""
    uses = iter(range(len(hybrid)))
    return [next(uses) % config.num_mem_blocks if h else None for h in hybrid]


def other_depths_adapters(config) -> list[str]:
    """Patterns of the adapter weights listed under a hybrid layer's shared_transformer that belong
    to another depth (tied copies of that depth's: each depth takes its own)."""
    ids = list(config.hybrid_layer_ids)
    return [rf"model\.layers\.{layer}\.shared_transformer\..*adapter_list\.{other}\..*"
            for use, layer in enumerate(ids) for other in range(len(ids)) if other != use]


def adapter(weights: SourceWeights, name: str, rank: int, d_in: int, d_out: int, like: torch.Tensor):
    """A LoRA adapter's (A [r, in], B [out, r]) (zeros where the source has none)."""
    if not weights.has(f"{name}.0.weight"):
        return like.new_zeros(rank, d_in), like.new_zeros(d_out, rank)
    return weights.take(f"{name}.0.weight"), weights.take(f"{name}.1.weight")


def shared_weights(weights: SourceWeights, config, cfg: ModelConfig, layer: int, ours: str) -> dict:
    """The shared transformer as used at hybrid layer `layer` -> our blocks.{layer}.shared: its
    shared weights (the same tensors at every depth of one shared block), this depth's adapters
    and linear (proj)."""
    use, theirs = list(config.hybrid_layer_ids).index(layer), f"model.layers.{layer}.shared_transformer"
    take, rank, wide = weights.take, cfg.shared_adapter_rank, 2 * cfg.d_model
    attn, mlp = f"{theirs}.self_attn", f"{theirs}.feed_forward"
    scale = math.sqrt(2.0)  # the score scale (head_dim / 2)^-1/2 = ours (head_dim)^-1/2 with q times sqrt(2)
    q, k, v = (take(f"{attn}.{n}_proj.weight") for n in "qkv")
    lora = [adapter(weights, f"{attn}.linear_{n}_adapter_list.{use}", rank, wide, w.shape[0], w)
            for n, w in zip("qkv", (q, k, v))]
    state = {f"{ours}.attn.qkv.weight": torch.cat([q * scale, k, v]),
             f"{ours}.attn.qkv.lora_a": torch.cat([a for a, _ in lora]),
             f"{ours}.attn.qkv.lora_b": torch.block_diag(lora[0][1] * scale, lora[1][1], lora[2][1]),
             f"{ours}.attn.out_proj.weight": take(f"{attn}.o_proj.weight"),
             f"{ours}.norm_attn.weight": take(f"{theirs}.input_layernorm.weight"),
             f"{ours}.norm_mlp.weight": take(f"{theirs}.pre_ff_layernorm.weight"),
             f"{ours}.proj.weight": take(f"model.layers.{layer}.linear.weight")}
    gate_up = take(f"{mlp}.gate_up_proj.weight")
    a, b = adapter(weights, f"{mlp}.gate_up_proj_adapter_list.{use}", rank, cfg.d_model, gate_up.shape[0], gate_up)
    for name, base, lora_b in zip(("gate", "up"), gate_up.chunk(2), b.chunk(2)):
        state |= {f"{ours}.mlp.{name}.weight": base.clone(), f"{ours}.mlp.{name}.lora_a": a.clone(),
                  f"{ours}.mlp.{name}.lora_b": lora_b.clone()}  # (copies: no two of ours share a storage)
    state[f"{ours}.mlp.down.weight"] = take(f"{mlp}.down_proj.weight")
    if cfg.mlp_bias:
        gate, up = take(f"{mlp}.gate_up_proj.bias").chunk(2)
        state |= {f"{ours}.mlp.gate.bias": gate.clone(), f"{ours}.mlp.up.bias": up.clone(),
                  f"{ours}.mlp.down.bias": take(f"{mlp}.down_proj.bias")}
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
