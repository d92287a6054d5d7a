"""transformers NemotronHForCausalLM -> one of our blocks per NemotronH layer, each a single
sublayer (config.layers_block_type): "linear_attention" -> a mixer-only block with our "mamba2"
mixer, "full_attention" -> a mixer-only block with our "attention" mixer (no positions: NemotronH's
attention has no RoPE; grouped-query heads, no biases), "mlp" -> an MLP-only block (mixer None,
relu2: down(relu(up x)^2)), "moe" -> an MLP-only block whose MLP is models.moe.MoE: sigmoid
routing with the correction bias (gate.e_score_correction_bias -> mlp.score_bias), grouped top-k
(n_group, topk_group), norm_topk_prob, routed_scaling_factor, ungated relu2 experts
(experts.up_proj / down_proj [E, F, D] / [E, D, F] -> experts.up / down) and the ungated
shared expert (shared_experts -> mlp.shared_expert, width moe_shared_expert_intermediate_size).
Layer l is our blocks.{l}: its norm -> norm_mixer (a mixer layer) or norm_mlp (an MLP layer);
the residual after it is hook_resid_post.

Mamba-2 layers map as models.interop.mamba2 does (mixer_weights), with the head layout from
mamba_num_heads / mamba_head_dim (E = H * P, not expand * hidden_size: mixer_options n_heads,
head_dim), n_groups, use_conv_bias, use_bias (in/out projections), the gated norm's eps
layer_norm_epsilon, and the dt clamp config.time_step_limit (default (0, inf): none) that
transformers' scan applies (mamba2.dt_limit; not time_step_min, which only sets dt_bias's init). embeddings -> embed, norm_f -> norm_final, lm_head -> unembed (tied only where
the source ties them: NemotronH declares no tied weights, so tie_word_embeddings alone does not).

Refused (UnsupportedConfig): the MoE latent projection (moe_latent_size), multi-token prediction
layers (num_nextn_predict_layers > 0), activations other than relu2 (MLP, experts) and silu
(Mamba).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from models.config import ModelConfig
from models.interop import hybrid, mamba2 as mamba2_layout
from models.interop.convert import SourceWeights, require
from models.interop.llama import attention_weights

KINDS = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": None, "moe": None}


def moe_options(config, types: list[str]) -> dict | None:
    """ModelConfig.moe for the "moe" layers (None without any)."""
    layers = [layer for layer, kind in enumerate(types) if kind == "moe"]
    if not layers:
        return None
    require(config, "moe_latent_size", None)
    return {"experts": config.n_routed_experts, "top_k": config.num_experts_per_tok,
            "d_expert": config.moe_intermediate_size, "d_shared": config.moe_shared_expert_intermediate_size,
            "shared_gate": False, "layers": layers, "routing": "sigmoid", "n_group": config.n_group,
            "topk_group": config.topk_group, "norm_topk_prob": bool(config.norm_topk_prob),
            "routed_scaling_factor": float(config.routed_scaling_factor), "expert_activation": "relu2"}


def moe_weights(take, theirs: str, ours: str, bias: bool) -> dict:
    """One "moe" layer's router, correction bias, experts and shared expert."""
    params = ("weight", "bias") if bias else ("weight",)
    return {f"{ours}.router.weight": take(f"{theirs}.gate.weight"),
            f"{ours}.score_bias": take(f"{theirs}.gate.e_score_correction_bias"),
            f"{ours}.experts.up": take(f"{theirs}.experts.up_proj"),
            f"{ours}.experts.down": take(f"{theirs}.experts.down_proj"),
            **{f"{ours}.shared_expert.{n}.{p}": take(f"{theirs}.shared_experts.{n}_proj.{p}")
               for n in ("up", "down") for p in params}}


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "mlp_hidden_act", "relu2")
    require(config, "mamba_hidden_act", "silu")
    require(config, "num_nextn_predict_layers", 0)
    types = list(config.layers_block_type)
    kinds = hybrid.layer_kinds(config, "layers_block_type", KINDS, f"layers of the kinds {sorted(KINDS)}")
    eps = float(config.layer_norm_epsilon)
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=len(kinds),
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_head=config.head_dim,
        attention_bias=False, d_state=config.ssm_state_size, d_conv=config.conv_kernel, norm="rmsnorm",
        norm_eps=eps, mlp=[kind is None for kind in kinds], d_mlp=config.intermediate_size, mlp_activation="relu2",
        mlp_bias=bool(config.mlp_bias), moe=moe_options(config, types), tie_embeddings=source.lm_head.weight is source.model.embeddings.weight,
        mixer_options={"mamba2": {"n_heads": config.mamba_num_heads, "head_dim": config.mamba_head_dim,
                                  "n_groups": config.n_groups, "conv_bias": bool(config.use_conv_bias),
                                  "bias": bool(config.use_bias), "norm_eps": eps,
                                  "dt_limit": mamba2_layout.dt_limit(config)}},
    )
    weights = SourceWeights(source)
    layers = partial(block_weights, weights, config, types)
    return cfg, hybrid.stack_weights(weights, kinds, layers, embed="embeddings", norm_final="norm_f")


def block_weights(weights: SourceWeights, config, types: list[str], layer: int, kind: str | None, theirs: str,
                  ours: str) -> dict:
    """NemotronH layer `theirs` (one sublayer: Mamba-2, attention, MLP or MoE, and its norm) -> our block."""
    take = weights.take
    if types[layer] == "moe":
        state = moe_weights(take, f"{theirs}.mixer", f"{ours}.mlp", config.mlp_bias)
    elif kind == "mamba2":
        state = mamba2_layout.mixer_weights(weights, f"{theirs}.mixer", f"{ours}.mixer",
                                            config.use_conv_bias, config.use_bias)
    elif kind == "attention":
        state = attention_weights(weights, f"{theirs}.mixer", f"{ours}.mixer", bias=False)
    else:
        params = ("weight", "bias") if config.mlp_bias else ("weight",)
        state = {f"{ours}.mlp.{n}.{p}": take(f"{theirs}.mixer.{n}_proj.{p}") for n in ("up", "down") for p in params}
    state[f"{ours}.{'norm_mlp' if kind is None else 'norm_mixer'}.weight"] = take(f"{theirs}.norm.weight")
    return state


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
