"""transformers JambaForCausalLM -> a hybrid stack of our "mamba" and "attention" mixers (one per
layer, config.layers_block_type), each followed by a SwiGLU MLP, RMSNorm everywhere.

Jamba's attention has no positions (no RoPE) and grouped-query heads without biases: q/k/v_proj
concatenate into our qkv, o_proj -> out_proj. Its Mamba is Mamba-1 with weighted RMS norms on
dt_low, B and C (dt_layernorm, b_layernorm, c_layernorm -> our mixer's dt_norm, B_norm, C_norm via
the option dt_bc_norm_eps = rms_norm_eps); the rest maps as in models.interop.mamba (state
[B, E, N], no transposes). feed_forward.{gate,up,down}_proj -> mlp.{gate,up,down};
input_layernorm / pre_ff_layernorm -> norm_mixer / norm_mlp, final_layernorm -> norm_final.
Mixture-of-experts layers (layers_num_experts > 1) -> models.moe.MoE: softmax router, top-k
weights left unnormalised (norm_topk_prob False), no shared expert, experts of width
intermediate_size (feed_forward.router.weight, experts.gate_up_proj / down_proj).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from models.config import ModelConfig
from models.interop import hybrid, mamba as mamba_layout
from models.interop.convert import SourceWeights, require
from models.interop.experts import mlp_weights
from models.interop.llama import attention_weights


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    sparse = [layer for layer, n in enumerate(config.layers_num_experts) if n > 1]
    kinds = ["attention" if kind == "attention" else "mamba" for kind in config.layers_block_type]
    eps = float(config.rms_norm_eps)
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
        d_head=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        attention_bias=False, d_state=config.mamba_d_state, expand=config.mamba_expand,
        d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=True, d_mlp=config.intermediate_size,
        mlp_activation="swiglu", mlp_bias=False, tie_embeddings=bool(config.tie_word_embeddings),
        mixer_options={"mamba": {"dt_rank": int(config.mamba_dt_rank), "conv_bias": bool(config.mamba_conv_bias),
                                 "bias": bool(config.mamba_proj_bias), "dt_bc_norm_eps": eps}},
        moe={"experts": config.num_experts, "top_k": config.num_experts_per_tok, "d_expert": config.intermediate_size,
             "norm_topk_prob": False, "layers": sparse} if sparse else None,
    )
    weights = SourceWeights(source)
    return cfg, hybrid.stack_weights(weights, kinds, partial(block_weights, weights, config, sparse))


def block_weights(weights: SourceWeights, config, sparse: list[int], layer: int, kind: str, theirs: str,
                  ours: str) -> dict:
    """Jamba layer `theirs` (attention or Mamba with its dt / B / C norms, MLP or MoE) -> our block."""
    if kind == "attention":
        state = attention_weights(weights, f"{theirs}.self_attn", f"{ours}.mixer", bias=False)
    else:
        state = mamba_layout.mixer_weights(weights, f"{theirs}.mamba", f"{ours}.mixer",
                                           config.mamba_proj_bias, config.mamba_conv_bias)
        for src, dst in [("dt_layernorm", "dt_norm"), ("b_layernorm", "B_norm"), ("c_layernorm", "C_norm")]:
            state[f"{ours}.mixer.{dst}.weight"] = weights.take(f"{theirs}.mamba.{src}.weight")
    state |= mlp_weights(weights, f"{theirs}.feed_forward", f"{ours}.mlp", layer in sparse, "router.weight")
    return state | hybrid.block_norms(weights, theirs, ours)


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
