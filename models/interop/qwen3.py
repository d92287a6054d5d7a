"""transformers Qwen3ForCausalLM / Qwen3MoeForCausalLM -> our "attention" stack, mapped as Llama's
(models.interop.llama: q/k/v_proj -> qkv, o_proj -> out_proj, RMSNorms, RoPE, SwiGLU MLPs) with
the attention option qk_norm: q_norm / k_norm (RMSNorm over each head's d_head, plain weights,
eps rms_norm_eps, before RoPE) -> mixer.q_norm / k_norm. Qwen3-MoE's sparse blocks (layers not in
mlp_only_layers, every decoder_sparse_step-th) -> models.moe.MoE: softmax routing, top-k,
norm_topk_prob as the config, no shared expert (mlp.gate -> router, mlp.experts -> experts).
Sliding-window attention (use_sliding_window with a sliding_window that some layer uses) is
refused.
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights, require, rope_base, unsupported
from models.interop.experts import mlp_weights
from models.interop.llama import source_blocks, stack_weights

__all__ = ["convert", "source_blocks"]


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    config = source.config
    require(config, "hidden_act", "silu")
    windowed = "full_attention" if config.sliding_window is None else "sliding_attention"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or [windowed]):
        raise unsupported(config, "sliding_window", config.sliding_window, "None (or layer_types all full_attention)")
    sparse = [i for i, layer in enumerate(source.model.layers) if hasattr(layer.mlp, "experts")]
    cfg = ModelConfig(
        mixer="attention", vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        n_kv_heads=config.num_key_value_heads, d_head=config.head_dim, positional="rope",
        norm="rmsnorm", norm_eps=float(config.rms_norm_eps), mlp=True, mlp_activation="swiglu", mlp_bias=False,
        d_mlp=getattr(config, "intermediate_size", None), attention_bias=bool(config.attention_bias),
        tie_embeddings=source.get_output_embeddings().weight is source.get_input_embeddings().weight,
        mixer_options={"rope_base": rope_base(config), "qk_norm": True},
        moe={"experts": config.num_experts, "top_k": config.num_experts_per_tok,
             "d_expert": config.moe_intermediate_size, "norm_topk_prob": bool(config.norm_topk_prob),
             "layers": None if len(sparse) == config.num_hidden_layers else sparse} if sparse else None,
    )
    weights = SourceWeights(source)

    def qk_norms(theirs: str, ours: str) -> dict:
        return {f"{ours}.mixer.{n}.weight": weights.take(f"{theirs}.self_attn.{n}.weight") for n in ("q_norm", "k_norm")}

    def mlp(theirs: str, ours: str, layer: int) -> dict:
        return mlp_weights(weights, theirs, ours, layer in sparse)

    return cfg, stack_weights(weights, cfg, mlp, qk_norms)
