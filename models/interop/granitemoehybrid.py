"""transformers GraniteMoeHybridForCausalLM -> Bamba's layout (models.interop.bamba: "mamba2" /
"attention" per layer, each followed by a SwiGLU MLP or, with num_local_experts > 0, our sparse
MoE MLP (models.moe) with Granite's ungated shared MLP as its shared expert; RMSNorm),
with Granite's scalar multipliers folded into the weights, so every hook holds what the source
computes at that point:

    embedding_multiplier e   embed = e * embed_tokens (hook_embed: the scaled embedding)
    residual_multiplier r    each sublayer's output map (o_proj, the Mamba out_proj, the MLP's
                             output_linear, each expert's down map) times r: mixer / mlp
                             hook_out is what is added
    attention_multiplier m   the score scale (in place of 1 / sqrt(d_head)): q_proj times
                             m * sqrt(d_head) (hook_q holds q scaled so; scores and pattern exact)
    logits_scaling s         logits / s: unembed = lm_head / s, or with tied embeddings the final
                             norm's weight times 1 / (e s) (the unembedding is e * embed_tokens)

shared_mlp.input_linear [gate | up] -> mlp.gate / mlp.up, output_linear -> mlp.down (with
experts: mlp.shared_expert.*); block_sparse_moe.router.weight -> mlp.router.weight (Granite's
softmax over the top-k logits is our top-k of the softmax renormalised: norm_topk_prob),
experts.gate_up_proj [E, gate | up, D] -> mlp.experts.gate / up, down_proj -> mlp.experts.down;
post_attention_layernorm -> norm_mlp, model.norm -> norm_final. position_embedding_type "rope"
-> positional "rope" (rope_theta; scaling raises), any other ("nope", None) -> no positions, as
transformers builds no rotary table then.

Refused (UnsupportedConfig): hidden_act other than silu, rope scaling, embedding_multiplier 0
with tied embeddings.
"""

from __future__ import annotations

import math
from functools import partial

from torch import nn

from models.config import ModelConfig
from models.interop import hybrid
from models.interop.bamba import layer_kinds, mamba2_options, mixer_weights, rotary_options
from models.interop.convert import SourceWeights, require, unsupported


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    kinds = layer_kinds(config)
    eps = float(config.rms_norm_eps)
    rope = config.position_embedding_type == "rope" and "attention" in kinds  # else ("nope", None): no positions
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    tied, e, s = bool(config.tie_word_embeddings), float(config.embedding_multiplier), float(config.logits_scaling)
    if tied and e == 0:
        raise unsupported(config, "embedding_multiplier", e, "a nonzero multiplier with tied embeddings")
    cfg = ModelConfig(
        mixer=kinds, vocab_size=config.vocab_size, d_model=config.hidden_size, n_layers=len(kinds),
        n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, d_head=d_head,
        attention_bias=bool(config.attention_bias), positional="rope" if rope else "none",
        d_state=config.mamba_d_state, d_conv=config.mamba_d_conv, norm="rmsnorm", norm_eps=eps, mlp=True,
        d_mlp=config.shared_intermediate_size, mlp_activation="swiglu", mlp_bias=False, tie_embeddings=tied,
        moe=None if not config.num_local_experts else {
            "experts": config.num_local_experts, "top_k": config.num_experts_per_tok,
            "d_expert": config.intermediate_size, "norm_topk_prob": True,
            "d_shared": config.shared_intermediate_size, "shared_gate": False},
        mixer_options={"mamba2": mamba2_options(config, eps)} | ({"attention": rotary_options(config)} if rope else {}),
    )
    weights = SourceWeights(source)
    r, q_scale = float(config.residual_multiplier), float(config.attention_multiplier) * math.sqrt(d_head)
    ends = {"embed": lambda w: w * e, "norm_final": lambda w: w / (e * s) if tied else w,
            "unembed": lambda w: w * e if tied else w / s}
    layers = partial(block_weights, weights, config, cfg, r, q_scale)
    return cfg, hybrid.stack_weights(weights, kinds, layers, norm_final="norm", transforms=ends)


def block_weights(weights: SourceWeights, config, cfg: ModelConfig, r: float, q_scale: float, layer: int, kind: str,
                  theirs: str, ours: str) -> dict:
    """Granite layer `theirs` (Bamba's mixer with the query scale q_scale and the residual
    multiplier r folded in, the shared MLP or MoE, two norms) -> our block."""
    mixer = mixer_weights(weights, config, kind, theirs, ours)
    if kind == "attention":
        mixer[f"{ours}.mixer.qkv.weight"] = scaled_rows(mixer[f"{ours}.mixer.qkv.weight"], cfg, q_scale)
        if cfg.attention_bias:
            mixer[f"{ours}.mixer.qkv.bias"] = scaled_rows(mixer[f"{ours}.mixer.qkv.bias"], cfg, q_scale)
    state = {name: value * r if name.startswith(f"{ours}.mixer.out_proj.") else value for name, value in mixer.items()}
    state |= mlp_weights(weights, theirs, f"{ours}.mlp", r, cfg.moe is not None)
    return state | hybrid.block_norms(weights, theirs, ours, mlp="post_attention_layernorm")


def mlp_weights(weights: SourceWeights, theirs: str, ours: str, r: float, sparse: bool) -> dict:
    """Layer `theirs`'s shared MLP (and experts) with the residual multiplier r folded in."""
    take = weights.take
    dense = f"{ours}.shared_expert" if sparse else ours
    gate, up = take(f"{theirs}.shared_mlp.input_linear.weight").chunk(2, dim=0)
    state = {f"{dense}.gate.weight": gate, f"{dense}.up.weight": up,
             f"{dense}.down.weight": take(f"{theirs}.shared_mlp.output_linear.weight", lambda w: w * r)}
    if sparse:
        moe = f"{theirs}.block_sparse_moe"
        gate, up = take(f"{moe}.experts.gate_up_proj").chunk(2, dim=1)  # [E, F, D] each
        state |= {f"{ours}.router.weight": take(f"{moe}.router.weight"), f"{ours}.experts.gate": gate,
                  f"{ours}.experts.up": up, f"{ours}.experts.down": take(f"{moe}.experts.down_proj", lambda w: w * r)}
    return state


def scaled_rows(qkv, cfg: ModelConfig, scale: float):
    """Our fused qkv weight or bias [(H + 2 G) d_head, ...] with the query rows times scale."""
    queries = cfg.n_heads * cfg.head_dim
    out = qkv.clone()
    out[:queries] = qkv[:queries] * scale
    return out


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(source.model.layers)
