"""transformers Qwen3.5 (Qwen3_5ForCausalLM, and Qwen3_5MoeForCausalLM with a sparse MoE MLP in
every layer) -> the hybrid models.interop.qwen3_next builds: the same blocks, norms, gated
attention, Gated DeltaNet and MoE mapping (its docstring has them). Only the GDN input maps differ:
Qwen3.5 keeps them apart, in_proj_qkv [q (H K) | k (H K) | v (HV V)] -> q_proj, k_proj, v_proj,
in_proj_z -> g_proj, in_proj_b -> b_proj, in_proj_a -> a_proj, in the order our mixer uses.

Text only: the published checkpoints are the multimodal Qwen3_5(Moe)ForConditionalGeneration;
of those the language model (model.language_model, config.text_config, lm_head) is converted and
the vision tower (model.visual) is left out; a checkpoint directory loads as transformers'
Qwen3_5(Moe)ForCausalLM, which is the same language model. The rotary sections of the
multimodal model (mrope_section) coincide with plain RoPE for text positions.
"""

from __future__ import annotations

from torch import nn

from models.config import ModelConfig
from models.interop.convert import SourceWeights
from models.interop.qwen3_next import convert_stack

__all__ = ["convert", "source_blocks"]


def convert(source: nn.Module) -> tuple[ModelConfig, dict]:
    if hasattr(source.model, "language_model"):  # the multimodal model: its language model only
        return convert_stack(source, source.config.text_config, "model.language_model", projections,
                             ignore=(r"model\.visual\..*",))
    return convert_stack(source, source.config, "model", projections)


def source_blocks(source: nn.Module) -> list[nn.Module]:
    return list(getattr(source.model, "language_model", source.model).layers)


def projections(weights: SourceWeights, theirs: str, config) -> dict:
    """in_proj_qkv / z / b / a -> our q/k/v/g/b/a_proj weights."""
    key_dim = config.linear_num_key_heads * config.linear_key_head_dim
    value_dim = config.linear_num_value_heads * config.linear_value_head_dim
    q, k, v = weights.take(f"{theirs}.in_proj_qkv.weight").split([key_dim, key_dim, value_dim])
    return {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v,
            **{f"{ours}.weight": weights.take(f"{theirs}.in_proj_{name}.weight")
               for name, ours in (("z", "g_proj"), ("b", "b_proj"), ("a", "a_proj"))}}
