"""transformers NemotronHForCausalLM -> one of our blocks per NemotronH layer, each a single
sublayer (config.layers_block_type): "linear_attention" -> a mixer-only block with our "mamba2"
mixer, "full_attention" -> a mixer-only block with our "attention" mixer (no positions: NemotronH's
attention has no RoPE; grouped-query heads, no biases), "mlp" -> an MLP-only block (mixer None,
relu2: down(relu(up x)^2)). Layer l is our blocks.{l}: its norm -> norm_mixer (a mixer layer) or
norm_mlp (an MLP layer); the residual after it is hook_resid_post.

Mamba-2 layers map as models.interop.mamba2 does (mixer_weights), with the head layout from
mamba_num_heads / mamba_head_dim (E = H * P, not expand * hidden_size: mixer_options n_heads,
head_dim), n_groups, use_conv_bias, use_bias (in/out projections), the gated norm's eps
layer_norm_epsilon, and the dt clamp (time_step_min, inf) transformers' scan applies (its
one-token decoding step does not clamp; the clamp binds only where softplus(dt + dt_bias) <
time_step_min). embeddings -> embed, norm_f -> norm_final, lm_head -> unembed (tied only where
the source ties them: NemotronH declares no tied weights, so tie_word_embeddings alone does not).

Refused (UnsupportedConfig): "moe" layers (routed experts; no MoE MLP here yet), multi-token
prediction layers (num_nextn_predict_layers > 0), activations other than relu2 (MLP) and silu
(Mamba).
"""

from __future__ import annotations

import math

from torch import nn

from models.config import ModelConfig
from models.interop import mamba2 as mamba2_layout
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.llama import attention_weights

KINDS = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": None}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "mlp_hidden_act", "relu2")
    require(config, "mamba_hidden_act", "silu")
    require(config, "num_nextn_predict_layers", 0)
    types = list(config.layers_block_type)
    if any(kind not in KINDS for kind in types):
        raise unsupported(config, "layers_block_type", types, f"layers of the kinds {sorted(KINDS)} (no 'moe')")
    kinds = [KINDS[kind] for kind in types]
    eps = float(config.layer_norm_epsilon)
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=len(kinds),
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_head=config.head_dim,
        attention_bias=False, d_state=config.ssm_state_size, d_conv=config.conv_kernel, norm="rmsnorm",
        norm_eps=eps, mlp=[kind is None for kind in kinds], d_mlp=config.intermediate_size, mlp_activation="relu2",
        mlp_bias=bool(config.mlp_bias), tie_embeddings=source.lm_head.weight is source.model.embeddings.weight,
        mixer_options={"mamba2": {"n_heads": config.mamba_num_heads, "head_dim": config.mamba_head_dim,
                                  "n_groups": config.n_groups, "conv_bias": bool(config.use_conv_bias),
                                  "bias": bool(config.use_bias), "norm_eps": eps,
                                  "dt_limit": [float(config.time_step_min), math.inf]}},
    )
    weights = SourceWeights(source)
    take = weights.take
    state = {"embed.weight": take("model.embeddings.weight")}
    for layer, kind in enumerate(kinds):
        theirs, ours = f"model.layers.{layer}", f"blocks.{layer}"
        if kind == "mamba2":
            state |= mamba2_layout.mixer_weights(weights, f"{theirs}.mixer", f"{ours}.mixer",
                                                 config.use_conv_bias, config.use_bias)
        elif kind == "attention":
            state |= attention_weights(weights, f"{theirs}.mixer", f"{ours}.mixer", bias=False)
        else:
            params = ("weight", "bias") if config.mlp_bias else ("weight",)
            state |= {f"{ours}.mlp.{n}.{p}": take(f"{theirs}.mixer.{n}_proj.{p}") for n in ("up", "down") for p in params}
        state[f"{ours}.{'norm_mlp' if kind is None else 'norm_mixer'}.weight"] = take(f"{theirs}.norm.weight")
    state["norm_final.weight"] = take("model.norm_f.weight")
    state["unembed.weight"] = take("lm_head.weight")
    weights.check_all_taken()
    return cfg, state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
