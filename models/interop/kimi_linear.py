"""transformers KimiLinearForCausalLM -> a hybrid of our "kda" (Kimi Delta Attention) and "mla"
(Multi-head Latent Attention) mixers (config.layer_types: linear_attention / full_attention), each
followed by a SwiGLU MLP or the DeepSeek-V3-style sparse MoE MLP (config.mlp_layer_types: dense /
sparse), RMSNorm everywhere (plain weights, eps rms_norm_eps). No positions: Kimi Linear's MLA is
NoPE (its "rope" key slice is a key part shared by the heads, not rotated).

KDA (self_attn of a linear_attention layer): our kda mixer (its docstring has the recurrence) with
num_heads / head_dim = linear_num_heads / linear_head_dim and values as wide as the keys (expand_v
1); q/k/v_proj by name; conv1d.weight [3 H K, 1, W] (one depthwise conv over [q | k | v], no bias)
-> conv_weight [3 H K, W]; forget_gate.f_a_proj / f_b_proj / dt_bias by name, forget_gate.A_log
[1, 1, H, 1] -> A_log [H]; b_proj, g_a_proj, g_b_proj, o_proj by name; o_norm (RMSNorm(o) * w *
sigmoid(gate), eps rms_norm_eps) -> o_norm. transformers' recurrent state is [H, K, V]; ours
(hook_state) is [H, V, K].

MLA (self_attn of a full_attention layer): our mla mixer with q_lora_rank, kv_lora_rank,
qk_nope_head_dim, qk_rope_head_dim, v_head_dim from the config and the latent norms' eps 1e-6
(transformers builds them with its RMSNorm's default); q_proj or q_a_proj / q_a_layernorm /
q_b_proj -> q_proj or q_a_proj / q_a_norm / q_b_proj; kv_a_proj_with_mqa -> kv_a_proj;
kv_a_layernorm -> kv_a_norm; kv_b_proj; o_proj -> out_proj; biases with attention_bias.

MLP: mlp.{gate,up,down}_proj -> mlp.{gate,up,down}; a sparse layer -> models.moe.MoE with sigmoid
routing, the correction bias (gate.e_score_correction_bias -> score_bias), grouped top-k (n_group,
topk_group), norm_topk_prob, routed_scaling_factor; gate.weight -> router.weight,
experts.gate_up_proj -> experts.gate / up, experts.down_proj -> experts.down; the ungated shared
expert (shared_experts, width moe_intermediate_size * n_shared_experts) -> shared_expert.
embed_tokens -> embed, lm_head -> unembed (tied only where the source ties them).

Refused (UnsupportedConfig, naming the field): hidden_act other than silu, num_key_value_heads !=
num_attention_heads (the latent's keys and values are per head already), n_shared_experts 0,
layer kinds other than linear_attention / full_attention, MLP kinds other than dense / sparse.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from models.config import ModelConfig
from models.interop import hybrid
from models.interop.convert import SourceWeights, require, unsupported
from models.interop.experts import experts_weights
from models.interop.llama import swiglu_weights

KINDS = {"linear_attention": "kda", "full_attention": "mla"}
MLPS = {"dense": False, "sparse": True}   # config.mlp_layer_types -> sparse?


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    kinds = mixer_kinds(config)
    sparse = sparse_layers(config)
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads, d_head=config.qk_nope_head_dim, attention_bias=bool(config.attention_bias),
        positional="none", d_conv=config.linear_conv_kernel_dim, norm="rmsnorm", norm_eps=float(config.rms_norm_eps),
        mlp=True, mlp_activation="swiglu", mlp_bias=False,
        d_mlp=None if len(sparse) == len(kinds) else config.intermediate_size,
        tie_embeddings=source.lm_head.weight is source.model.embed_tokens.weight,
        mixer_options={kind: opts for kind, opts in mixer_options(config).items() if kind in kinds},
        moe=moe_config(config, sparse, len(kinds)),
    )
    weights = SourceWeights(source)
    return cfg, hybrid.stack_weights(weights, kinds, partial(block_weights, weights, config, sparse), norm_final="norm")


def block_weights(weights: SourceWeights, config, sparse: list[int], layer: int, kind: str, theirs: str,
                  ours: str) -> dict:
    """Kimi Linear layer `theirs` (KDA or MLA, SwiGLU MLP or MoE, two RMSNorms) -> our block."""
    mixer = kda_weights if kind == "kda" else mla_weights
    state = mixer(weights, f"{theirs}.self_attn", f"{ours}.mixer", config)
    if layer in sparse:
        state |= moe_weights(weights, f"{theirs}.mlp", f"{ours}.mlp")
    else:
        state |= swiglu_weights(weights, f"{theirs}.mlp", f"{ours}.mlp", bias=False)
    return state | hybrid.block_norms(weights, theirs, ours, mlp="post_attention_layernorm")


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)


def mixer_kinds(config) -> list[str]:
    """Our mixer per layer from config.layer_types (anything else raises)."""
    return hybrid.layer_kinds(config, "layer_types", KINDS, f"entries in {sorted(KINDS)}")


def sparse_layers(config) -> list[int]:
    """The layers whose MLP is the sparse one, from config.mlp_layer_types (anything else raises)."""
    sparse = hybrid.layer_kinds(config, "mlp_layer_types", MLPS, f"entries in {list(MLPS)}")
    return [layer for layer, is_sparse in enumerate(sparse) if is_sparse]


def mixer_options(config) -> dict:
    """Our kda and mla mixer_options (checking the fields that change the math)."""
    if config.num_key_value_heads != config.num_attention_heads:
        raise unsupported(config, "num_key_value_heads", config.num_key_value_heads,
                          f"num_attention_heads ({config.num_attention_heads}): MLA's keys and values are per head")
    return {
        "kda": {"num_heads": config.linear_num_heads, "head_dim": config.linear_head_dim, "expand_v": 1.0,
                "conv_bias": False, "gate_bias": False, "norm_eps": float(config.rms_norm_eps)},
        "mla": {"q_lora_rank": config.q_lora_rank, "kv_lora_rank": config.kv_lora_rank,
                "qk_nope_head_dim": config.qk_nope_head_dim, "qk_rope_head_dim": config.qk_rope_head_dim,
                "v_head_dim": config.v_head_dim, "latent_norm_eps": 1e-6},
    }


def moe_config(config, sparse: list[int], n_layers: int) -> dict | None:
    """ModelConfig.moe for the sparse layers (None when every MLP is dense)."""
    if not sparse:
        return None
    if not config.n_shared_experts:
        raise unsupported(config, "n_shared_experts", config.n_shared_experts,
                          "a positive count (the sparse block adds its shared experts)")
    return {"experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
            "d_expert": config.moe_intermediate_size, "d_shared": config.moe_intermediate_size * config.n_shared_experts,
            "shared_gate": False, "layers": None if len(sparse) == n_layers else sparse, "routing": "sigmoid",
            "n_group": config.n_group, "topk_group": config.topk_group, "norm_topk_prob": bool(config.norm_topk_prob),
            "routed_scaling_factor": float(config.routed_scaling_factor)}


def kda_weights(weights: SourceWeights, theirs: str, ours: str, config) -> dict:
    """A linear_attention layer's self_attn -> our kda mixer (module docstring)."""
    names = ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj", "o_norm")
    state = {f"{name}.weight": weights.take(f"{theirs}.{name}.weight") for name in names}
    state["conv_weight"] = weights.take(f"{theirs}.conv1d.weight")[:, 0]  # [C, W]
    gate = f"{theirs}.forget_gate"
    state |= {f"{name}.weight": weights.take(f"{gate}.{name}.weight") for name in ("f_a_proj", "f_b_proj")}
    state["dt_bias"] = weights.take(f"{gate}.dt_bias")
    state["A_log"] = weights.take(f"{gate}.A_log").flatten()  # [1, 1, H, 1] -> [H]
    return {f"{ours}.{name}": tensor for name, tensor in state.items()}


def mla_weights(weights: SourceWeights, theirs: str, ours: str, config) -> dict:
    """A full_attention layer's self_attn -> our mla mixer (module docstring)."""
    names = {"kv_a_proj_with_mqa": "kv_a_proj", "kv_a_layernorm": "kv_a_norm", "kv_b_proj": "kv_b_proj",
             "o_proj": "out_proj"}
    names |= ({"q_proj": "q_proj"} if config.q_lora_rank is None else
              {"q_a_proj": "q_a_proj", "q_a_layernorm": "q_a_norm", "q_b_proj": "q_b_proj"})
    biased = ("kv_a_proj_with_mqa", "o_proj", "q_a_proj") if config.attention_bias else ()
    state = {f"{ours}.{mine}.weight": weights.take(f"{theirs}.{name}.weight") for name, mine in names.items()}
    state |= {f"{ours}.{names[name]}.bias": weights.take(f"{theirs}.{name}.bias") for name in biased if name in names}
    return state


def moe_weights(weights: SourceWeights, theirs: str, ours: str) -> dict:
    """A sparse MLP -> models.moe.MoE (module docstring)."""
    return {**experts_weights(weights, f"{theirs}.gate.weight", f"{theirs}.experts", ours),
            f"{ours}.score_bias": weights.take(f"{theirs}.gate.e_score_correction_bias"),
            **swiglu_weights(weights, f"{theirs}.shared_experts", f"{ours}.shared_expert", bias=False)}
